/*
 * dlshard verify's reading of a source: every record read and checked as the loader would read it
 * (its checksum, its image decoded whole, its tensor values parsed), what the loader would skip
 * counted and named. The formats' own verify (rfs.c, tar.c) read their shards' records with these;
 * an MDS dataset's or an image folder's samples are read here, the dataset loaded as the loader
 * loads it.
 */
#include "source/source.h"
#include "decode/jpeg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zstd.h>

struct dl__checker {
  dl__image_decoder d;
  void *zctx;   /* ZSTD_DCtx, made on first use */
  dl__buf raw;  /* an inflated value or image */
  size_t limit; /* the most an inflated value may hold: the loader's default max_member_bytes */
  void (*on_dataset)(const char *path, const dl__format *f, dl__verified *n, FILE *out, void *arg);
  void *arg;
};

int dl__checker_new(dl__checker **out,
                    void (*on_dataset)(const char *path, const dl__format *f, dl__verified *n, FILE *out, void *arg),
                    void *arg) {
  dl__checker *c = calloc(1, sizeof *c);
  *out = c;
  if (!c || dl__image_decoder_init(&c->d)) {
    free(c);
    *out = NULL;
    return dl__fail(-ENOMEM, "out of memory");
  }
  dl__options defaults;
  dl__options_parse(&defaults, "");
  c->limit = (size_t)defaults.max_member_bytes;
  c->on_dataset = on_dataset;
  c->arg = arg;
  return 0;
}

void dl__checker_free(dl__checker *c) {
  if (!c)
    return;
  dl__image_decoder_free(&c->d);
  ZSTD_freeDCtx(c->zctx);
  dl__buf_free(&c->raw);
  free(c);
}

int dl__sample_read(const dl__dataset *ds, const dl__sample *s, dl__buf *buf) {
  if (dl__buf_reserve(buf, s->size ? s->size : 1))
    return dl__fail(-ENOMEM, "out of memory");
  int fd = ds->fds[s->file], own = -1;
  if (fd < 0 || ds->direct[s->file])
    fd = own = open(ds->files[s->file], O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return dl__fail(-errno, "%s: %s", ds->files[s->file], strerror(errno));
  size_t got = 0;
  while (got < s->size) {
    ssize_t n = pread(fd, buf->p + got, s->size - got, (off_t)(s->offset + got));
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  if (own >= 0)
    close(own);
  if (got < s->size)
    return dl__fail(DL_ECORRUPT, "shard %s member %s: file ends early (truncated)", ds->files[s->file],
                    ds->pool + s->name);
  if ((s->flags & DL__SAMPLE_CHECKSUM) && dl__rfs_checksum(buf->p, s->size) != s->checksum)
    return dl__fail(DL_ECORRUPT, "shard %s %s: record checksum mismatch", ds->files[s->file],
                    ds->pool + s->name);
  return 0;
}

/* An MDS column's value as a .npy payload (version 1.0 header, little-endian) into OUT. */
int dl__npy_of_mds(const struct dl__mds_spec *spec, const uint8_t *p, size_t n, dl__buf *out, size_t *len, dl__err *e) {
  dl__npy v;
  if (dl__mds_parse(spec, p, n, &v, e))
    return e->code;
  char shape[DL__NPY_MAX_DIMS * 24 + 4] = "";
  for (int d = 0; d < v.ndim; d++)
    snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%lld,%s", (long long)v.shape[d],
             d + 1 < v.ndim ? " " : "");
  char head[256];
  int h = snprintf(head, sizeof head, "{'descr': '%c%c%u', 'fortran_order': False, 'shape': (%s), }",
                   v.dtype.bits == 8 ? '|' : '<', "iuf"[v.dtype.code], v.dtype.bits / 8u, shape);
  size_t total = (10 + (size_t)h + 1 + 63) / 64 * 64; /* magic, version, length, dict, '\n': to 64 */
  if (dl__buf_reserve(out, total + v.bytes))
    return dl__err_set(e, -ENOMEM, "out of memory");
  memcpy(out->p, "\x93NUMPY\x01\x00", 8);
  out->p[8] = (uint8_t)((total - 10) & 0xFF);
  out->p[9] = (uint8_t)((total - 10) >> 8);
  memcpy(out->p + 10, head, (size_t)h);
  memset(out->p + 10 + h, ' ', total - 10 - (size_t)h - 1);
  out->p[total - 1] = '\n';
  memcpy(out->p + total, v.data, v.bytes);
  *len = total + v.bytes;
  return 0;
}

static int plan_full(dl__decode_job *job, int w, int h, dl__err *e) {
  (void)e;
  job->rect = (dl__rect){0, 0, w, h};
  job->out_w = w;
  job->out_h = h;
  return 0;
}

/* *P and *N made the inflated bytes where ZST (`.jpg.zst` members, `.npy.zst` and zstd fields). */
static int inflated(dl__checker *c, const uint8_t **p, size_t *n, bool zst, dl__err *e) {
  if (!zst)
    return 0;
  if (dl__zstd_inflate(&c->zctx, *p, *n, c->limit, &c->raw, n, e))
    return e->code;
  *p = c->raw.p;
  return 0;
}

/* Decodes the whole image at P (N bytes, zstd-compressed when ZST). */
int dl__check_image(dl__checker *c, const uint8_t *p, size_t n, bool zst, bool pil, dl__err *e) {
  if (inflated(c, &p, &n, zst, e))
    return e->code;
  dl__decode_job job = {.src = p, .len = n, .channels = 3, .out_w = 1 << 30, .out_h = 1 << 30,
                        .max_pixels = 1ll << 28, .plan = plan_full, .scratch = &c->d.scratch, .pil = pil};
  return dl__image_decode_job(&c->d, &job, e);
}

/* A tensor value (N bytes at P, zstd-compressed when ZST) as the loader takes it: a .npy payload
 * whose header parses and whose data holds its whole shape. */
int dl__check_npy(dl__checker *c, const uint8_t *p, size_t n, bool zst, dl__err *e) {
  dl__npy npy;
  return inflated(c, &p, &n, zst, e) ? e->code : dl__npy_parse(p, n, n, &npy, e);
}

static int check_ref(dl__checker *c, const dl__dataset *ds, const dl__fref *ref, const uint8_t *p, dl__err *e) {
  size_t len;
  if (ref->kind == DL__REF_MDS)
    return dl__npy_of_mds(&ds->mds[ref->name], p, ref->len, &c->raw, &len, e);
  if (ref->kind == DL__REF_NPY || ref->kind == DL__REF_NPY_ZST)
    return dl__check_npy(c, p, ref->len, ref->kind == DL__REF_NPY_ZST, e);
  return 0; /* bytes, text and JSON reach the consumer as they are */
}

/* Whether any sample of DS has an image: then the loader skips those without one. */
bool dl__any_image(const dl__dataset *ds) {
  for (size_t i = 0; i < ds->n; i++)
    if (ds->samples[i].codec != DL__CODEC_NONE)
      return true;
  return false;
}

/* What a ringfeed shard's writer said of a JPEG, which a loader believes of a single-scan file: with
 * the record's checksum good, a shard whose word is wrong was written so. */
int dl__check_scan_claim(const uint8_t *p, size_t n, dl__err *e) {
  if (dl__jpeg_scan_vouched(p, n))
    return 0;
  return dl__err_set(e, DL_ECORRUPT, "the shard says its JPEG's codes read clean, and they do not (or the "
                     "file has several scans, of which no writer says so)");
}

/* Sample S of DS, read into BYTES: its image decoded, its tensor values checked. */
int dl__check_sample(dl__checker *c, const dl__dataset *ds, const dl__sample *s, const uint8_t *bytes,
                        dl__err *e) {
  bool zst = s->flags & DL__SAMPLE_IMAGE_ZST, pil = s->codec == DL__CODEC_PIL;
  if (s->codec != DL__CODEC_NONE && dl__check_image(c, bytes + s->image_at, s->image_len, zst, pil, e))
    return e->code;
  if ((s->flags & DL__SAMPLE_SCAN_CLEAN) && dl__check_scan_claim(bytes + s->image_at, s->image_len, e))
    return e->code;
  for (uint8_t r = 0; r < s->nrefs; r++) {
    const dl__fref *ref = &ds->refs[s->first_ref + r];
    if (check_ref(c, ds, ref, bytes + ref->at, e))
      return dl__err_prefix(e, "field %s: ", ds->field_names[ref->name]);
  }
  return 0;
}

bool dl__verify_sample(dl__checker *c, const dl__dataset *ds, const dl__sample *s, bool has_images, int fd,
                       dl__buf *buf, dl__err *e) {
  if (has_images && s->codec == DL__CODEC_NONE)
    dl__err_set(e, DL_ENOFIELD, DL__NO_IMAGE);
  else if (s->codec == DL__CODEC_NONE && !s->nrefs)
    return false; /* a label alone has nothing to decode */
  else if (fd >= 0 && (dl__buf_reserve(buf, s->size ? s->size : 1) ||
                       pread(fd, buf->p, s->size, (off_t)s->offset) != (ssize_t)s->size))
    dl__err_set(e, DL_ECORRUPT, "cannot read %llu bytes", (unsigned long long)s->size);
  else if (fd < 0 && dl__sample_read(ds, s, buf))
    dl__err_set(e, DL_ECORRUPT, "%s", dl_last_error());
  else
    dl__check_sample(c, ds, s, buf->p, e);
  return e->code != 0;
}

/* A dataset that is not one shard file (an MDS dataset, an ImageFolder): loaded as the loader
 * loads it, each sample then read and its image and MDS values decoded. Samples the load left out
 * are named by its warnings and counted as bad. Its files count as shards (MDS) or images. */
int dl__dataset_verify(const char *path, int fd, uint64_t size, dl__checker *c, dl__verified *n, FILE *out) {
  (void)fd, (void)size;
  dl__options o;
  dl__options_parse(&o, "on_error=skip");
  dl__dataset ds = {0};
  int quiet = dl__log_level;
  dl__log_level = DL__LOG_WARN; /* what the load leaves out, named on stderr */
  int rc = dl__source_load(&ds, path, &o);
  dl__log_level = quiet;
  if (rc) {
    fprintf(out, "%s\n", dl_last_error());
    n->bad++;
    dl__dataset_free(&ds);
    return 0;
  }
  if (ds.left_out)
    fprintf(out, "%s: %llu sample%s left out as damaged (named above)\n", path, (unsigned long long)ds.left_out,
           ds.left_out == 1 ? "" : "s");
  n->bad += (long)ds.left_out;
  struct stat st;
  const dl__format *f = stat(path, &st) ? NULL : dl__format_of(path, &st, NULL, 0);
  *(f == &dl__mds_format ? &n->shards : &n->images) += ds.nfiles;
  if (c->on_dataset)
    c->on_dataset(path, f, n, out, c->arg);
  dl__buf buf = {0};
  bool has_images = dl__any_image(&ds);
  for (size_t i = 0; i < ds.n; i++) {
    const dl__sample *s = &ds.samples[i];
    dl__err e = {0};
    if (dl__verify_sample(c, &ds, s, has_images, -1, &buf, &e)) {
      fprintf(out, "%s: sample %s: %s\n", ds.files[s->file], ds.pool + s->key, e.msg);
      n->bad++;
    }
  }
  dl__buf_free(&buf);
  dl__dataset_free(&ds);
  return 0;
}
