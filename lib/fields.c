/*
 * Tensor fields: the schema every batch gets (from the first sample holding each field, or with
 * pad=1 the largest leading dimension over the dataset), and a worker's filling of one sample's
 * fields into its slot: .npy payloads (zstd-compressed or not) and token windows.
 */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zstd.h>
#include <zstd_errors.h>

#define HEADER_PREFIX 65536 /* .npy headers are at most 64 KiB */

static const dl__fref *find_ref(const dl__dataset *ds, const dl__sample *s, int name) {
  for (uint8_t r = 0; r < s->nrefs; r++)
    if (ds->refs[s->first_ref + r].name == name)
      return &ds->refs[s->first_ref + r];
  return NULL;
}

/* The first bytes of a field's payload (decompressed), enough for its .npy header. */
static int payload_prefix(const dl__dataset *ds, const dl__options *opt, const dl__sample *s,
                          const dl__fref *ref, dl__buf *raw, dl__buf *out, size_t *n, size_t *total,
                          dl__err *e) {
  /* A remote shard's bytes come by a ranged request; a local one's through the loader's own
   * descriptor where it keeps one (buffered), else the file opened for this read. */
  bool remote = s->file < ds->nremote && ds->remote[s->file].url;
  bool own = !remote && (ds->fds[s->file] < 0 || ds->direct[s->file]);
  int fd = remote ? -1 : own ? dl__open_regular(ds->files[s->file], "file", NULL) : ds->fds[s->file];
  if (!remote && fd < 0)
    return dl__err_set(e, fd, "%s", dl_last_error());
  size_t want = ref->kind == DL__REF_NPY ? (ref->len < HEADER_PREFIX ? ref->len : HEADER_PREFIX) : ref->len;
  if (ref->kind == DL__REF_NPY_ZST && want > (64u << 20))
    want = 64u << 20;
  if (dl__buf_reserve(raw, want ? want : 1)) {
    if (own)
      close(fd);
    return dl__err_set(e, -ENOMEM, "out of memory");
  }
  int64_t got = remote ? dl__remote_read(ds, s->file, opt, raw->p, want, s->offset + ref->at)
                       : dl__pread_full(fd, raw->p, want, s->offset + ref->at);
  if (own)
    close(fd);
  if (got < 0 && remote)
    return dl__err_set(e, (int)got, "%s", dl_last_error());
  if (got < 0)
    return dl__err_set(e, (int)got, "cannot read the field's %zu bytes: %s", want, strerror((int)-got));
  if (got != (int64_t)want)
    return dl__err_set(e, DL_ECORRUPT, "cannot read the field's %zu bytes: the file ends early", want);
  if (ref->kind != DL__REF_NPY_ZST) {
    if (dl__buf_reserve(out, want ? want : 1))
      return dl__err_set(e, -ENOMEM, "out of memory");
    memcpy(out->p, raw->p, want);
    *n = want;
    *total = ref->len;
    return 0;
  }
  unsigned long long content = ZSTD_getFrameContentSize(raw->p, want);
  ZSTD_DStream *z = NULL;
  if (dl__buf_reserve(out, HEADER_PREFIX) || !(z = ZSTD_createDStream()))
    return dl__err_set(e, -ENOMEM, "out of memory");
  ZSTD_inBuffer in = {raw->p, want, 0};
  ZSTD_outBuffer o = {out->p, HEADER_PREFIX, 0};
  size_t rc = 0;
  while (o.pos < o.size && in.pos < in.size && !ZSTD_isError(rc = ZSTD_decompressStream(z, &o, &in)) && rc)
    ;
  ZSTD_freeDStream(z);
  if (ZSTD_isError(rc))
    return dl__err_set(e, DL_ECORRUPT, "zstd: %s", ZSTD_getErrorName(rc));
  *n = o.pos;
  /* A frame that does not say its size is checked whole when a worker inflates it. */
  *total = content == ZSTD_CONTENTSIZE_ERROR ? o.pos : content == ZSTD_CONTENTSIZE_UNKNOWN ? SIZE_MAX / 2 : (size_t)content;
  return 0;
}

static size_t dtype_bytes(DLDataType t) { return t.bits / 8u; }

/* A tensor value (N of its TOTAL bytes at P) as a .npy payload describes it: the .npy header, or
 * for an MDS column, its stored layout. */
static int parse_value(const dl__dataset *ds, const dl__fref *ref, const uint8_t *p, size_t n, size_t total,
                       dl__npy *npy, dl__err *e) {
  if (ref->kind != DL__REF_MDS)
    return dl__npy_parse(p, n, total, npy, e);
  if (n != total)
    return dl__err_set(e, DL_ECORRUPT, "value cut short");
  return dl__mds_parse(&ds->mds[ref->name], p, n, npy, e);
}

/* Whether fields=a,b names NAME (an empty list names every field). */
static bool wanted(const dl__options *o, const char *name) {
  if (!o->fields[0])
    return true;
  size_t n = strlen(name);
  for (const char *p = o->fields; *p;) {
    size_t len = strcspn(p, ",");
    if (len == n && !memcmp(p, name, n))
      return true;
    p += len + (p[len] == ',');
  }
  return false;
}

/* Every name of fields=a,b must be a field of the dataset. */
static int check_wanted(const dl__options *o, const dl__dataset *ds) {
  for (const char *p = o->fields; *p;) {
    size_t len = strcspn(p, ",");
    bool found = false;
    for (int f = 0; f < ds->nfield_names && !found; f++)
      found = strlen(ds->field_names[f]) == len && !memcmp(ds->field_names[f], p, len);
    if (!found) {
      char have[512] = "";
      for (int f = 0; f < ds->nfield_names; f++)
        snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", f ? ", " : "", ds->field_names[f]);
      return dl__fail(DL_EOPTION, "option fields: no sample has a field '%.*s' (the dataset's fields: %s)",
                      (int)len, p, have[0] ? have : "none");
    }
    p += len + (p[len] == ',');
  }
  return 0;
}

/* The kind of field F where a sample first holds it: bytes, or a tensor. */
static bool is_bytes_field(const dl__dataset *ds, int f) {
  for (size_t i = 0; i < ds->n; i++) {
    const dl__fref *ref = find_ref(ds, &ds->samples[i], f);
    if (ref)
      return ref->kind == DL__REF_BYTES;
  }
  return false;
}

/* A shard that declares its columns and lacks one the batch carries as a tensor, or the image,
 * would fail each of its samples in turn: the open names it once, with where the field is. */
static int check_declared(const dl_loader *l) {
  const dl__dataset *ds = &l->ds;
  for (uint32_t k = 0; k < ds->ndeclared; k++) {
    const dl__declared *d = &ds->declared[k];
    int missing = -1;
    for (int f = 0; f < l->nfields && missing < 0; f++)
      if (!(d->fields & (1u << l->fields[f].ds_index)))
        missing = l->fields[f].ds_index;
    if (missing < 0 && (d->image || !l->has_image))
      continue;
    const dl__sample *holder = NULL; /* the first sample that has it */
    for (size_t i = 0; i < ds->n && !holder; i++)
      if (missing >= 0 ? find_ref(ds, &ds->samples[i], missing) != NULL : ds->samples[i].codec != DL__CODEC_NONE)
        holder = &ds->samples[i];
    const char *from = holder ? ds->files[holder->file] : "another shard";
    if (missing >= 0)
      return dl__fail(DL_ENOFIELD, "%s has no column %s, a tensor field of %s: a batch needs it in every sample, "
                      "so each sample of this shard would fail (fields= keeps only the fields named, or give "
                      "each its own loader)", d->shard, ds->field_names[missing], from);
    return dl__fail(DL_ENOFIELD, "%s has no image column, while %s holds images: a batch needs an image in every "
                    "sample, so each sample of this shard would fail (give each its own loader)", d->shard, from);
  }
  return 0;
}

/* pad=1 needs every sample's .npy header. Over remote shards, a request after request would cost
 * a round trip per sample at open; instead the headers of a window of samples go out together
 * through the workers' HTTP backend (neighbours share a request, io_depth in flight). A header
 * longer than AHEAD_BYTES, a failed read, or a window that could not be read is read again alone,
 * as without it. */
enum { AHEAD_BYTES = 4096, AHEAD_SAMPLES = 4096 };

typedef struct ahead {
  dl__io io;
  unsigned depth;
  bool broken;     /* the backend failed: reads may still be in flight, so it is used no more */
  size_t first, n; /* the window: samples [first, first + n) */
  uint8_t *buf;    /* AHEAD_BYTES per sample of the window */
  int64_t *got;    /* per sample of the window: the bytes read, or -1 (read it alone) */
} ahead;

static bool ahead_open(dl_loader *l, ahead *a) {
  *a = (ahead){.io = {.ops = &dl__io_http_ops, .env = &l->io_env}};
  /* io_depth as the workers will have it: chosen after the schema when not given */
  a->depth = !l->o.io_depth ? 64 : l->o.io_depth < AHEAD_SAMPLES ? (unsigned)l->o.io_depth : AHEAD_SAMPLES;
  a->buf = malloc((size_t)AHEAD_SAMPLES * AHEAD_BYTES);
  a->got = malloc(AHEAD_SAMPLES * sizeof *a->got);
  if (!a->buf || !a->got || a->io.ops->init(&a->io, a->depth)) {
    free(a->buf);
    free(a->got);
    return false;
  }
  return true;
}

static void ahead_close(ahead *a) {
  a->io.ops->fini(&a->io);
  free(a->buf);
  free(a->got);
}

/* One completion into the window; false when the backend cannot go on. */
static bool ahead_reap(ahead *a) {
  uint64_t tag;
  int64_t res;
  if (a->io.ops->wait(&a->io, &tag, &res))
    return false;
  a->got[tag] = res;
  return true;
}

/* Reads ahead the headers of field F of the samples from FIRST on. */
static void ahead_fill(const dl__dataset *ds, ahead *a, int f, size_t first) {
  a->first = first;
  a->n = ds->n - first < AHEAD_SAMPLES ? ds->n - first : AHEAD_SAMPLES;
  unsigned flying = 0;
  bool ok = true;
  for (size_t k = 0; k < a->n; k++) {
    a->got[k] = -1;
    const dl__sample *s = &ds->samples[first + k];
    const dl__fref *ref = find_ref(ds, s, f);
    if (!ok || !ref || ref->kind != DL__REF_NPY)
      continue;
    /* Full: half the reads come back before more go out, so that those go out together (a read
     * submitted alone to a waiting backend would be a request of its own). */
    for (unsigned half = flying == a->depth ? (a->depth + 1) / 2 : 0; half && ok; half--)
      if ((ok = ahead_reap(a)))
        flying--;
    size_t len = ref->len < AHEAD_BYTES ? ref->len : AHEAD_BYTES;
    uint8_t *into = a->buf + k * AHEAD_BYTES;
    if (ok && (ok = !a->io.ops->submit(&a->io, (int)s->file, into, len, s->offset + ref->at, k)))
      flying++;
  }
  while (ok && flying && (ok = ahead_reap(a)))
    flying--;
  if (!ok) {
    a->broken = true;
    a->n = 0;
  }
}

/* The name a field is delivered under: its own, or with "_" after it where a batch already has
 * that name (a member 000.image or 000.label, an MDS bytes column "image"), which would otherwise
 * hide the batch's image or label (or, in Python, its key, epoch and index). */
static void delivered_name(char *out, size_t cap, const char *name) {
  static const char *taken[] = {"image", "label", "key", "epoch", "index"};
  bool clash = false;
  for (size_t i = 0; i < sizeof taken / sizeof *taken && !clash; i++)
    clash = !strcmp(name, taken[i]);
  snprintf(out, cap, clash ? "%s_" : "%s", name);
  if (clash)
    dl__log(DL__LOG_WARN, "field %s is delivered as %s_: the batch's own %s has its name", name, name, name);
}

int dl__fields_schema(dl_loader *l) {
  dl__dataset *ds = &l->ds;
  for (size_t i = 0; i < ds->n && !l->has_image; i++)
    l->has_image = ds->samples[i].codec != DL__CODEC_NONE;
  int rc = check_wanted(&l->o, ds);
  if (rc)
    return rc;
  dl__buf raw = {0}, pre = {0};
  ahead a;
  bool read_ahead = l->o.pad && ds->remote && ahead_open(l, &a);
  size_t at = 0;
  for (int f = 0; f < ds->nfield_names && !rc; f++) {
    if (!wanted(&l->o, ds->field_names[f]))
      continue;
    if (is_bytes_field(ds, f)) {
      dl__bfield *bf = &l->bfields[l->nbfields++];
      delivered_name(bf->name, sizeof bf->name, ds->field_names[f]);
      bf->ds_index = f;
      continue;
    }
    dl__field *fd = &l->fields[l->nfields++];
    memset(fd, 0, sizeof *fd);
    delivered_name(fd->name, sizeof fd->name, ds->field_names[f]);
    fd->ds_index = f;
    bool found = false;
    if (read_ahead)
      a.first = a.n = 0;
    for (size_t i = 0; i < ds->n && !rc && (!found || l->o.pad); i++) {
      const dl__sample *s = &ds->samples[i];
      const dl__fref *ref = find_ref(ds, s, f);
      if (!ref || ref->kind == DL__REF_BYTES)
        continue; /* bytes where others hold a tensor: the worker reports that sample */
      dl__npy npy;
      if (ref->kind == DL__REF_TOKENS) {
        npy.dtype = (DLDataType){kDLUInt, (uint8_t)(l->o.token_dtype == DL__DTYPE_UINT16 ? 16 : 32), 1};
        npy.ndim = 1;
        npy.shape[0] = l->o.seq_len + 1;
      } else {
        dl__err e = {0};
        size_t n = 0, total = 0;
        if (read_ahead && !a.broken && i >= a.first + a.n)
          ahead_fill(ds, &a, f, i);
        int64_t early = read_ahead && i >= a.first && i < a.first + a.n ? a.got[i - a.first] : -1;
        bool parsed = early >= 0 && !parse_value(ds, ref, a.buf + (i - a.first) * AHEAD_BYTES, (size_t)early,
                                                 ref->len, &npy, &e);
        int unread = 0;
        if (!parsed && ((unread = payload_prefix(ds, &l->o, s, ref, &raw, &pre, &n, &total, &e)) ||
                        parse_value(ds, ref, pre.p, n, total, &npy, &e))) {
          /* A server that fails (not the sample's bytes) would fail every next header too, each
           * after its retries: the open fails now, with the server's reason. */
          if (unread && ds->remote && e.code != DL_ECORRUPT)
            rc = dl__fail(e.code, "field %s: reading its .npy header: %s", fd->name, e.msg);
          else if (!found && l->o.on_error == DL__ON_ERROR_FAIL)
            rc = dl__fail(e.code, "shard %s sample %s field %s: %s", ds->files[s->file], ds->pool + s->key,
                          fd->name, e.msg);
          continue; /* the worker reports this sample; the schema comes from a good one */
        }
      }
      if (!found) {
        found = true;
        fd->dtype = npy.dtype;
        fd->ndim = npy.ndim;
        memcpy(fd->shape, npy.shape, sizeof npy.shape);
      } else if (npy.ndim == fd->ndim && npy.ndim > 0 && npy.shape[0] > fd->shape[0]) {
        fd->shape[0] = npy.shape[0]; /* pad=1: room for the largest */
      }
    }
    if (!found && !rc) {
      rc = dl__fail(DL_ECORRUPT, "field %s: no sample holds a readable value (.npy payload or MDS column)", fd->name);
      break;
    }
    uint64_t bytes = dtype_bytes(fd->dtype);
    bool fits = true;
    for (int d = 0; d < fd->ndim && fits; d++)
      fits = dl__mul_ok(bytes, (uint64_t)fd->shape[d], &bytes);
    fd->sample_bytes = fits ? (size_t)bytes : SIZE_MAX;
    if (!rc && fd->sample_bytes > (size_t)l->o.max_member_bytes)
      rc = dl__fail(DL_ELIMIT, "field %s: %zu bytes per sample, above max_member_bytes", fd->name,
                    fd->sample_bytes);
    fd->at = at;
    at += (fd->sample_bytes * (size_t)l->o.batch_size + 63) / 64 * 64;
    if (l->o.pad) {
      fd->len_at = at;
      at += ((size_t)l->o.batch_size * 8 + 63) / 64 * 64;
    }
  }
  l->field_block = at;
  if (!rc)
    rc = check_declared(l);
  dl__buf_free(&raw);
  dl__buf_free(&pre);
  if (read_ahead)
    ahead_close(&a);
  return rc;
}

void dl__fields_narrow(dl_loader *l) {
  if (!l->o.fields[0])
    return;
  dl__dataset *ds = &l->ds;
  for (size_t i = 0; i < ds->n; i++) {
    dl__sample *s = &ds->samples[i];
    if (s->flags & DL__SAMPLE_CHECKSUM)
      continue; /* a checksummed record is read whole to be checked */
    uint64_t lo = UINT64_MAX, hi = 0;
    if (s->codec != DL__CODEC_NONE)
      lo = s->image_at, hi = (uint64_t)s->image_at + s->image_len;
    bool tokens = false;
    for (uint8_t r = 0; r < s->nrefs; r++) {
      const dl__fref *ref = &ds->refs[s->first_ref + r];
      tokens |= ref->kind == DL__REF_TOKENS;
      if (!wanted(&l->o, ds->field_names[ref->name]))
        continue;
      lo = ref->at < lo ? ref->at : lo;
      hi = (uint64_t)ref->at + ref->len > hi ? (uint64_t)ref->at + ref->len : hi;
    }
    if (tokens || lo == UINT64_MAX || (lo == 0 && hi == s->size))
      continue;
    /* Read [lo, hi) of the sample; what is kept moves down by lo. */
    s->offset += lo;
    s->size = hi - lo;
    if (s->codec != DL__CODEC_NONE)
      s->image_at -= (uint32_t)lo;
    for (uint8_t r = 0; r < s->nrefs; r++) {
      dl__fref *ref = &ds->refs[s->first_ref + r];
      if (wanted(&l->o, ds->field_names[ref->name]))
        ref->at -= (uint32_t)lo;
    }
  }
}

int dl__slot_bytes_alloc(const dl_loader *l, dl_batch *b) {
  if (!l->nbfields)
    return 0;
  b->blobs = calloc((size_t)l->o.batch_size, sizeof *b->blobs);
  b->brefs = calloc((size_t)l->o.batch_size * (size_t)l->nbfields, sizeof *b->brefs);
  return b->blobs && b->brefs ? 0 : -ENOMEM;
}

void dl__slot_bytes_free(const dl_loader *l, dl_batch *b) {
  for (int i = 0; b->blobs && i < l->o.batch_size; i++)
    dl__buf_free(&b->blobs[i]);
  free(b->blobs);
  free(b->brefs);
  b->blobs = NULL;
  b->brefs = NULL;
}

void dl__slot_bytes_hand_over(dl_batch *from, dl_batch *to) {
  dl__buf *blobs = to->blobs;
  dl__bytes_ref *brefs = to->brefs;
  to->blobs = from->blobs, to->brefs = from->brefs;
  from->blobs = blobs, from->brefs = brefs;
}

/* The tensor field that REF fills (not a bytes field), or NULL. */
static const dl__field *field_of(const dl_loader *l, const dl__fref *ref) {
  for (int k = 0; k < l->nbfields; k++)
    if (l->bfields[k].ds_index == ref->name)
      return NULL;
  for (int f = 0; f < l->nfields; f++)
    if (l->fields[f].ds_index == ref->name)
      return &l->fields[f];
  return NULL;
}

/* Where REF's data would start if it fills FD exactly: the .npy header's length is then what the
 * member holds beyond the data. 0 when the member cannot be such a payload. */
static uint32_t npy_guess(const dl__fref *ref, const dl__field *fd) {
  if (ref->len <= fd->sample_bytes)
    return 0;
  uint64_t head = ref->len - fd->sample_bytes;
  return head >= 10 && head <= HEADER_PREFIX + 12 ? (uint32_t)head : 0;
}

/* Payloads smaller than this are copied: an extra piece of the read costs the kernel more. */
#define DIRECT_MIN 4096

int dl__fields_direct(const dl_loader *l, const dl__sample *s, dl_batch *b, int i, uint8_t *buf, struct iovec *iov,
                      uint32_t *in_place) {
  const dl__dataset *ds = &l->ds;
  *in_place = 0;
  if (l->o.pad || s->nrefs > DL__MAX_FIELDS)
    return 0;
  /* The payloads that go straight to the slot, in file order. */
  struct { uint64_t at, len; uint8_t *dst; } part[DL__MAX_FIELDS];
  int n = 0;
  for (uint8_t r = 0; r < s->nrefs; r++) {
    const dl__fref *ref = &ds->refs[s->first_ref + r];
    const dl__field *fd = field_of(l, ref);
    if (!fd || fd->sample_bytes < DIRECT_MIN || (uint64_t)ref->at + ref->len > s->size)
      continue;
    uint32_t head = ref->kind == DL__REF_NPY ? npy_guess(ref, fd) : 0;
    if (ref->kind == DL__REF_NPY ? !head : ref->kind != DL__REF_TOKENS || ref->len != fd->sample_bytes)
      continue;
    int k = n++;
    while (k > 0 && part[k - 1].at > ref->at) {
      part[k] = part[k - 1];
      k--;
    }
    part[k].at = (uint64_t)ref->at + head;
    part[k].len = fd->sample_bytes;
    part[k].dst = b->fields + fd->at + (size_t)i * fd->sample_bytes;
    *in_place |= 1u << r;
  }
  int v = 0;
  uint64_t pos = 0;
  for (int k = 0; k < n; k++) {
    if (part[k].at > pos)
      iov[v++] = (struct iovec){buf + pos, part[k].at - pos};
    iov[v++] = (struct iovec){part[k].dst, part[k].len};
    pos = part[k].at + part[k].len;
  }
  if (s->size > pos && n)
    iov[v++] = (struct iovec){buf + pos, s->size - pos};
  return v;
}

bool dl__fields_in_place_ok(const dl_loader *l, const dl__sample *s, const uint8_t *bytes, uint32_t in_place) {
  const dl__dataset *ds = &l->ds;
  for (uint8_t r = 0; r < s->nrefs; r++) {
    const dl__fref *ref = &ds->refs[s->first_ref + r];
    if (!(in_place & (1u << r)) || ref->kind != DL__REF_NPY)
      continue;
    dl__npy npy;
    dl__err e = {0};
    /* Only the header is in BYTES: the parse reads no further. */
    if (dl__npy_parse(bytes + ref->at, ref->len, ref->len, &npy, &e) ||
        (uint64_t)(npy.data - (bytes + ref->at)) != npy_guess(ref, field_of(l, ref)))
      return false;
  }
  return true;
}

/* A .npy tensor's type as numpy names it ("int32"): the types dl__dtype_parse gives. */
static const char *tensor_type(DLDataType t) {
  static const char *const names[3][4] = {{"int8", "int16", "int32", "int64"},
                                          {"uint8", "uint16", "uint32", "uint64"},
                                          {"float8", "float16", "float32", "float64"}};
  int size = t.bits == 8 ? 0 : t.bits == 16 ? 1 : t.bits == 32 ? 2 : 3;
  return t.code <= kDLFloat ? names[t.code][size] : "tensor";
}

int dl__fields_fill(dl_loader *l, const dl__sample *s, const uint8_t *bytes, dl_batch *b, int i, void **zctx,
                    dl__buf *zbuf, dl__hasher *verify, uint32_t in_place, dl__err *e) {
  const dl__dataset *ds = &l->ds;
  /* The sample's fields in the order they are stored, so a checksum can run along the copies. */
  const dl__fref *order[DL__MAX_FIELDS];
  int n_order = 0;
  for (uint8_t r = 0; r < s->nrefs && n_order < DL__MAX_FIELDS; r++) {
    const dl__fref *ref = &ds->refs[s->first_ref + r];
    int k = n_order++;
    while (k > 0 && order[k - 1]->at > ref->at) {
      order[k] = order[k - 1];
      k--;
    }
    order[k] = ref;
  }
  if (verify)
    dl__hasher_reset(verify);
  uint64_t pos = 0;
  unsigned filled = 0;
  size_t blob_used = 0;
  dl__bytes_ref *brefs = l->nbfields ? b->brefs + (size_t)i * l->nbfields : NULL;
  for (int k = 0; k < l->nbfields; k++)
    brefs[k] = (dl__bytes_ref){0};
  for (int r = 0; r < n_order; r++) {
    const dl__fref *ref = order[r];
    int k = 0;
    while (k < l->nbfields && l->bfields[k].ds_index != ref->name)
      k++;
    if (k < l->nbfields) { /* a member delivered as it is, NUL-terminated for C callers */
      if (verify && ref->at > pos)
        dl__hasher_update(verify, bytes + pos, ref->at - pos);
      if (verify)
        dl__hasher_update(verify, bytes + ref->at, ref->len);
      pos = ref->at + ref->len > pos ? ref->at + ref->len : pos;
      if (ref->len > (uint64_t)l->o.max_member_bytes)
        return dl__err_set(e, DL_ELIMIT, "field %s: member of %u bytes, above max_member_bytes", l->bfields[k].name,
                           ref->len);
      if (dl__buf_reserve(&b->blobs[i], blob_used + ref->len + 1))
        return dl__err_set(e, -ENOMEM, "out of memory");
      memcpy(b->blobs[i].p + blob_used, bytes + ref->at, ref->len);
      b->blobs[i].p[blob_used + ref->len] = 0;
      brefs[k] = (dl__bytes_ref){(uint32_t)blob_used, ref->len, true};
      blob_used += ref->len + 1;
      continue;
    }
    int f = 0;
    while (f < l->nfields && l->fields[f].ds_index != ref->name)
      f++;
    if (f == l->nfields)
      continue;
    const dl__field *fd = &l->fields[f];
    uint8_t *dst = b->fields + fd->at + (size_t)i * fd->sample_bytes;
    const uint8_t *p = bytes + ref->at;
    size_t n = ref->len;
    if (verify && ref->at > pos)
      dl__hasher_update(verify, bytes + pos, ref->at - pos);
    pos = ref->at + ref->len > pos ? ref->at + ref->len : pos;
    filled |= 1u << f;
    bool placed = in_place & (1u << (ref - &ds->refs[s->first_ref])); /* read straight into DST */
    if (ref->kind == DL__REF_TOKENS) {
      if (n != fd->sample_bytes)
        return dl__err_set(e, DL_ECORRUPT, "token window of %zu bytes", n);
      if (!placed)
        memcpy(dst, p, n);
      continue;
    }
    bool copy_hashes = verify && ref->kind == DL__REF_NPY && !placed;
    if (verify && !copy_hashes)
      dl__hasher_update(verify, p, n); /* compressed: the stored bytes, then inflate */
    if (ref->kind == DL__REF_NPY_ZST) {
      size_t got;
      if (dl__zstd_inflate(zctx, p, n, fd->sample_bytes + HEADER_PREFIX, zbuf, &got, e))
        return dl__err_prefix(e, "field %s: ", fd->name);
      p = zbuf->p;
      n = got;
    }
    dl__npy npy;
    if (parse_value(ds, ref, p, n, n, &npy, e))
      return dl__err_prefix(e, "field %s: ", fd->name);
    bool same_type = npy.dtype.code == fd->dtype.code && npy.dtype.bits == fd->dtype.bits;
    bool same_shape = npy.ndim == fd->ndim;
    for (int d = 0; same_shape && d < fd->ndim; d++)
      same_shape = npy.shape[d] == fd->shape[d] || (l->o.pad && d == 0 && npy.shape[0] <= fd->shape[0]);
    if (!same_type || !same_shape) {
      char want[128] = "", got[128] = "";
      for (int d = 0; d < fd->ndim; d++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "x" : "", (long long)fd->shape[d]);
      for (int d = 0; d < npy.ndim; d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? "x" : "", (long long)npy.shape[d]);
      return dl__err_set(e, DL_EUNSUPPORTED, "field %s: %s %s, the batch holds %s %s%s", fd->name, got,
                         tensor_type(npy.dtype), want, tensor_type(fd->dtype),
                         l->o.pad || !same_type ? "" : " (pad=1 pads a varying leading dimension)");
    }
    if (copy_hashes) { /* header, then the data hashed as it is copied, then anything after it */
      size_t head = (size_t)(npy.data - p);
      dl__hasher_update(verify, p, head);
      dl__hasher_copy(verify, dst, npy.data, npy.bytes);
      dl__hasher_update(verify, npy.data + npy.bytes, n - head - npy.bytes);
    } else if (!placed) {
      memcpy(dst, npy.data, npy.bytes);
    }
    if (npy.bytes < fd->sample_bytes)
      memset(dst + npy.bytes, 0, fd->sample_bytes - npy.bytes);
    if (l->o.pad)
      ((int64_t *)(b->fields + fd->len_at))[i] = fd->ndim ? npy.shape[0] : 1;
  }
  if (verify) {
    if (s->size > pos)
      dl__hasher_update(verify, bytes + pos, s->size - pos);
    if (dl__hasher_digest(verify) != s->checksum)
      return dl__err_set(e, DL_ECORRUPT, "record checksum mismatch (damaged record)");
  }
  for (int f = 0; f < l->nfields; f++)
    if (!(filled & (1u << f)))
      return dl__err_set(e, DL_ENOFIELD, "sample has no field %s", l->fields[f].name);
  return 0;
}
