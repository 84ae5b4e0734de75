/*
 * MosaicML Streaming's MDS datasets, read in place: a folder holding index.json (as MDSWriter
 * writes it, or a merged index whose shards sit in subfolders), or that index.json itself.
 *
 * A shard is one file: its sample count N (uint32), N + 1 offsets of the samples from the file's
 * start (uint32), the shard's own copy of its settings, then the samples. A sample is the sizes of
 * its variable-size columns (uint32 each), then every column's bytes in the index's column order.
 * Columns become the sample's parts: the image is the first jpeg, png or pil column (one named
 * "image" first; else a bytes column named "image", its format told by its bytes); an integer column named label, cls, y or target (the first of these names) is
 * its label, and stays a field of its name too unless that is "label"; numbers (int,
 * int8..uint64, float16..float64) and ndarray columns are tensor fields; str (and str_int,
 * str_float, str_decimal) text fields; json JSON fields; everything else (bytes, pkl, another
 * image column, an encoding this reader does not know) is a bytes field, delivered as stored.
 *
 * Index and shards are untrusted: every size and offset is checked before it is used. A sample
 * whose sizes do not add up to its length, or that lies past the end of its file, is left out and
 * named once per shard (with on_error=fail the open fails instead). Shards kept only compressed
 * (zip_data) are decompressed at open into temporary files when zstd, gz or bz2 (kept in cache_dir
 * when one is given; inflate.c), else named with what to do.
 * A remote dataset (the URL of its index.json) is read the same way, each shard downloaded once
 * to read its samples' sizes; sample tables are kept in the index cache.
 */
#include "source/source.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define INDEX_MAX (64u << 20) /* an index.json larger than this is not one */
#define MAX_COLUMNS 256

enum { ROLE_BYTES, ROLE_TEXT, ROLE_JSON, ROLE_TENSOR, ROLE_IMAGE, ROLE_LABEL };

typedef struct column {
  char name[256];
  char encoding[64];
  int64_t size; /* bytes in every sample, or -1: each sample gives it */
  int role;
  int codec;  /* ROLE_IMAGE: DL__CODEC_* */
  bool label; /* the sample's label (also a field of its name unless that is "label": ROLE_LABEL) */
  dl__mds_spec spec;
} column;

#define MAX_DIGESTS 24 /* of one file: Streaming knows 17 algorithms, and its writers use one or two */

typedef struct shard {
  char basename[PATH_MAX], zip[PATH_MAX], format[32], compression[32];
  uint64_t samples, version, raw_bytes; /* raw_bytes: the uncompressed shard's size, or 0 */
  int ncols, nnames, nsizes;
  column cols[MAX_COLUMNS];
  dl__mds_digest digests[2][MAX_DIGESTS]; /* raw_data's and zip_data's "hashes" */
  int ndigests[2];
} shard;

/* ---- encodings ---- */

static const struct {
  const char *name;
  uint8_t code, bits, mds_code; /* mds_code: the value dtype's number in an ndarray's own header */
} dtypes[] = {
    {"uint8", kDLUInt, 8, 8},       {"int8", kDLInt, 8, 9},        {"uint16", kDLUInt, 16, 16},
    {"int16", kDLInt, 16, 17},      {"float16", kDLFloat, 16, 18}, {"uint32", kDLUInt, 32, 32},
    {"int32", kDLInt, 32, 33},      {"float32", kDLFloat, 32, 34}, {"uint64", kDLUInt, 64, 64},
    {"int64", kDLInt, 64, 65},      {"float64", kDLFloat, 64, 66},
};
#define NDTYPES (sizeof dtypes / sizeof *dtypes)

static int dtype_named(const char *name, size_t len) {
  for (size_t i = 0; i < NDTYPES; i++)
    if (strlen(dtypes[i].name) == len && !memcmp(dtypes[i].name, name, len))
      return (int)i;
  return -1;
}

/* ndarray[:DTYPE[:D0,D1,...]] into SPEC; false when malformed. */
static bool ndarray_spec(const char *args, dl__mds_spec *spec) {
  spec->ndim = -1;
  if (!*args)
    return true;
  const char *colon = strchr(args, ':');
  int t = dtype_named(args, colon ? (size_t)(colon - args) : strlen(args));
  if (t < 0)
    return false;
  spec->dtype = (DLDataType){dtypes[t].code, dtypes[t].bits, 1};
  spec->dtype_fixed = true;
  if (!colon)
    return true;
  spec->ndim = 0;
  for (const char *p = colon + 1;; p++) {
    char *end;
    errno = 0;
    long long d = strtoll(p, &end, 10);
    if (end == p || errno || d < 1 || spec->ndim == DL__NPY_MAX_DIMS || (*end && *end != ','))
      return false;
    spec->shape[spec->ndim++] = d;
    if (!*end)
      return true;
    p = end;
  }
}

/* The column's role, codec and tensor layout from its encoding and name; false when the
 * encoding is malformed (or contradicts its fixed size). */
static bool classify(column *c) {
  const char *e = c->encoding;
  c->spec = (dl__mds_spec){.ndim = 0};
  int t = !strcmp(e, "int") ? dtype_named("int64", 5) : dtype_named(e, strlen(e));
  if (t >= 0) {
    c->role = ROLE_TENSOR;
    c->spec.dtype = (DLDataType){dtypes[t].code, dtypes[t].bits, 1};
    c->spec.dtype_fixed = true;
    if (c->size >= 0 && c->size != dtypes[t].bits / 8)
      return false;
    c->size = dtypes[t].bits / 8;
    return true;
  }
  if (!strcmp(e, "ndarray") || !strncmp(e, "ndarray:", 8)) {
    c->role = ROLE_TENSOR;
    if (!ndarray_spec(e[7] ? e + 8 : "", &c->spec))
      return false;
    return true;
  }
  const dl__codec *image = dl__codec_of_mds(e);
  if (image) {
    c->role = ROLE_IMAGE;
    c->codec = image->id;
    return true;
  }
  if (!strcmp(e, "str") || !strcmp(e, "str_int") || !strcmp(e, "str_float") || !strcmp(e, "str_decimal"))
    c->role = ROLE_TEXT;
  else if (!strcmp(e, "json"))
    c->role = ROLE_JSON;
  else
    c->role = ROLE_BYTES;
  return true;
}

int dl__mds_parse(const dl__mds_spec *spec, const uint8_t *p, size_t n, dl__npy *out, dl__err *e) {
  const uint8_t *at = p, *end = p + n;
  DLDataType t = spec->dtype;
  if (!spec->dtype_fixed) { /* the value dtype's number first */
    int k = -1;
    for (size_t i = 0; at < end && i < NDTYPES && k < 0; i++)
      k = dtypes[i].mds_code == *at ? (int)i : -1;
    if (k < 0)
      return dl__err_set(e, DL_ECORRUPT, "MDS ndarray: %s", at < end ? "unknown dtype number" : "empty");
    t = (DLDataType){dtypes[k].code, dtypes[k].bits, 1};
    at++;
  }
  out->dtype = t;
  out->ndim = spec->ndim;
  memcpy(out->shape, spec->shape, sizeof out->shape);
  if (spec->ndim < 0) { /* (ndim << 2 | width) then the dimensions, each 1, 2, 4 or 8 bytes */
    if (at >= end)
      return dl__err_set(e, DL_ECORRUPT, "MDS ndarray: no shape");
    int ndim = *at >> 2, width = 1 << (*at & 3);
    at++;
    if (ndim < 1 || ndim > DL__NPY_MAX_DIMS || end - at < (ptrdiff_t)ndim * width)
      return dl__err_set(e, DL_ECORRUPT, "MDS ndarray: shape of %d dimensions %s", ndim,
                         ndim > DL__NPY_MAX_DIMS ? "(too many)" : "does not fit");
    out->ndim = ndim;
    for (int d = 0; d < ndim; d++, at += width) {
      uint64_t v = 0;
      memcpy(&v, at, (size_t)width); /* little-endian, as the writer stores it */
      if (v < 1 || v > (uint64_t)INT64_MAX)
        return dl__err_set(e, DL_ECORRUPT, "MDS ndarray: dimension %d is %llu", d, (unsigned long long)v);
      out->shape[d] = (int64_t)v;
    }
  }
  uint64_t bytes = t.bits / 8u;
  for (int d = 0; d < out->ndim; d++)
    if (!dl__mul_ok(bytes, (uint64_t)out->shape[d], &bytes))
      return dl__err_set(e, DL_ECORRUPT, "MDS ndarray: shape too large");
  if (bytes != (uint64_t)(end - at))
    return dl__err_set(e, DL_ECORRUPT, "MDS value of %zu bytes where its type and shape need %llu",
                       (size_t)(end - at), (unsigned long long)bytes);
  out->data = at;
  out->bytes = bytes;
  return 0;
}

/* ---- index.json ---- */

/* An array of strings (or, with SIZES, of unsigned numbers and nulls) into the columns. */
static const char *column_array(const char *p, const char *end, shard *sh, int which, int *count) {
  if (p >= end || *p++ != '[')
    return NULL;
  int n = 0, more;
  while ((more = dl__json_element(&p, end)) == 1) {
    if (n == MAX_COLUMNS)
      return NULL;
    column *c = &sh->cols[n++];
    if (which == 2) {
      uint64_t v;
      if (dl__json_null(p, end, &p))
        c->size = -1;
      else if ((p = dl__json_uint(p, end, &v)) && v <= UINT32_MAX)
        c->size = (int64_t)v;
      else
        return NULL;
    } else {
      char *out = which ? c->encoding : c->name;
      size_t cap = which ? sizeof c->encoding : sizeof c->name;
      if (*p != '"' || !(p = dl__json_string(p, end, out, cap)) || !out[0])
        return NULL;
    }
  }
  *count = n;
  return more < 0 ? NULL : p;
}

/* A string or null into OUT ("" for null). */
static const char *string_or_null(const char *p, const char *end, char *out, size_t cap) {
  out[0] = 0;
  if (dl__json_null(p, end, &p))
    return p;
  return p < end && *p == '"' ? dl__json_string(p, end, out, cap) : NULL;
}

/* "hashes": {"sha1": "<hex>", "xxh64": "<hex>", ...} into D (*N of them; past MAX_DIGESTS, or a
 * name or digest too long or not a string, skipped: the loader does not need them to read). */
static const char *digests(const char *p, const char *end, dl__mds_digest *d, int *n) {
  if (p >= end || *p != '{')
    return dl__json_skip(p, end); /* null, or what no writer gives */
  p++;
  char algo[sizeof d->algo + 1];
  int member;
  while ((member = dl__json_member(&p, end, algo, sizeof algo)) == 1) {
    char hex[sizeof d->hex + 1] = "";
    if (*p != '"' ? !(p = dl__json_skip(p, end)) : !(p = dl__json_string(p, end, hex, sizeof hex)))
      return NULL;
    if (*n < MAX_DIGESTS && algo[0] && hex[0] && strlen(algo) < sizeof d->algo && strlen(hex) < sizeof d->hex) {
      snprintf(d[*n].algo, sizeof d->algo, "%s", algo);
      snprintf(d[*n].hex, sizeof d->hex, "%s", hex);
      ++*n;
    }
  }
  return member < 0 ? NULL : p;
}

/* raw_data / zip_data: {"basename": ..., "bytes": ..., "hashes": ...} or null. */
static const char *file_info(const char *p, const char *end, char *basename, size_t cap, uint64_t *bytes,
                             dl__mds_digest *d, int *nd) {
  basename[0] = 0;
  *bytes = 0;
  if (dl__json_null(p, end, &p))
    return p;
  if (p >= end || *p++ != '{')
    return NULL;
  char key[32];
  int member;
  while ((member = dl__json_member(&p, end, key, sizeof key)) == 1) {
    if (!strcmp(key, "basename") && *p == '"')
      p = dl__json_string(p, end, basename, cap);
    else if (!strcmp(key, "bytes") && *p != 'n')
      p = dl__json_uint(p, end, bytes);
    else if (!strcmp(key, "hashes"))
      p = digests(p, end, d, nd);
    else
      p = dl__json_skip(p, end);
    if (!p)
      return NULL;
  }
  return member < 0 ? NULL : p;
}

static const char *shard_object(const char *p, const char *end, shard *sh) {
  memset(sh, 0, sizeof *sh);
  if (p >= end || *p++ != '{')
    return NULL;
  char key[64];
  int member, sizes = 0;
  uint64_t zip_bytes;
  while ((member = dl__json_member(&p, end, key, sizeof key)) == 1) {
    if (!strcmp(key, "column_names"))
      p = column_array(p, end, sh, 0, &sh->nnames);
    else if (!strcmp(key, "column_encodings"))
      p = column_array(p, end, sh, 1, &sh->ncols);
    else if (!strcmp(key, "column_sizes"))
      p = column_array(p, end, sh, 2, &sh->nsizes), sizes = 1;
    else if (!strcmp(key, "format"))
      p = string_or_null(p, end, sh->format, sizeof sh->format);
    else if (!strcmp(key, "compression"))
      p = string_or_null(p, end, sh->compression, sizeof sh->compression);
    else if (!strcmp(key, "raw_data"))
      p = file_info(p, end, sh->basename, sizeof sh->basename, &sh->raw_bytes, sh->digests[0], &sh->ndigests[0]);
    else if (!strcmp(key, "zip_data"))
      p = file_info(p, end, sh->zip, sizeof sh->zip, &zip_bytes, sh->digests[1], &sh->ndigests[1]);
    else if (!strcmp(key, "samples"))
      p = dl__json_uint(p, end, &sh->samples);
    else if (!strcmp(key, "version"))
      p = dl__json_uint(p, end, &sh->version);
    else
      p = dl__json_skip(p, end);
    if (!p)
      return NULL;
  }
  if (!sizes) /* written by every MDSWriter; without it, sizes come from the encodings */
    for (int i = 0; i < MAX_COLUMNS; i++)
      sh->cols[i].size = -1;
  sh->nsizes = sizes ? sh->nsizes : sh->ncols;
  return member < 0 ? NULL : p;
}

/* ---- shards ---- */

/* A basename stays inside the dataset's folder: relative, no "..". */
static bool inside(const char *name) {
  if (!*name || *name == '/')
    return false;
  for (const char *p = name; p; p = strchr(p, '/'), p = p ? p + 1 : NULL)
    if (!strncmp(p, "..", 2) && (p[2] == '/' || !p[2]))
      return false;
  return true;
}

static bool same_spec(const dl__mds_spec *a, const dl__mds_spec *b) {
  bool same = a->dtype.code == b->dtype.code && a->dtype.bits == b->dtype.bits && a->dtype_fixed == b->dtype_fixed &&
              a->ndim == b->ndim;
  for (int d = 0; same && d < a->ndim; d++)
    same = a->shape[d] == b->shape[d];
  return same;
}

/* Checks the shard's columns against its encodings, and each tensor column against the same
 * name's in the shards before it (a field is one type throughout). */
static int check_columns(dl__dataset *ds, shard *sh, const char *index) {
  if (strcmp(sh->format, "mds"))
    return dl__fail(DL_EUNSUPPORTED, "MDS index %s: shard %s is in format '%s'; only mds shards are read", index,
                    sh->basename, sh->format);
  if (sh->version != 2)
    return dl__fail(DL_EUNSUPPORTED, "MDS index %s: shard %s has version %llu; version 2 is read", index,
                    sh->basename, (unsigned long long)sh->version);
  if (!sh->ncols || sh->ncols != sh->nnames || sh->ncols != sh->nsizes)
    return dl__fail(DL_ECORRUPT, "MDS index %s: shard %s lists %d column names, %d encodings and %d sizes", index,
                    sh->basename, sh->nnames, sh->ncols, sh->nsizes);
  for (int i = 0; i < sh->ncols; i++) {
    column *c = &sh->cols[i];
    for (int j = 0; j < i; j++)
      if (!strcmp(sh->cols[j].name, c->name)) /* MDSWriter's columns are a dict: one is hand-made */
        return dl__fail(DL_ECORRUPT, "MDS index %s: shard %s names column %s twice", index, sh->basename, c->name);
    if (!classify(c))
      return dl__fail(DL_ECORRUPT, "MDS index %s: shard %s column %s: encoding '%s' (size %lld) is malformed", index,
                      sh->basename, c->name, c->encoding, (long long)c->size);
  }
  /* One image: the column named "image" if it is one, else the first in column order. */
  int image = -1;
  for (int i = 0; i < sh->ncols; i++)
    if (sh->cols[i].role == ROLE_IMAGE && (image < 0 || !strcmp(sh->cols[i].name, "image")))
      image = image < 0 || strcmp(sh->cols[image].name, "image") ? i : image;
  for (int i = 0; i < sh->ncols; i++)
    if (sh->cols[i].role == ROLE_IMAGE && i != image)
      sh->cols[i].role = ROLE_BYTES;
  /* Encoded images stored as plain bytes (a common way to keep JPEGs as they are): a bytes column
   * named "image" is the image when no column is typed as one, its format told by its bytes. */
  for (int i = 0; i < sh->ncols && image < 0; i++)
    if (!strcmp(sh->cols[i].name, "image") && !strcmp(sh->cols[i].encoding, "bytes")) {
      sh->cols[i].role = ROLE_IMAGE;
      sh->cols[i].codec = DL__CODEC_OTHER;
      image = i;
    }
  /* The label: an integer number column named as labels are, in this order ("y" and "target" as
   * Streaming's own image datasets and many models name theirs). */
  static const char *label_names[] = {"label", "cls", "y", "target"};
  bool found = false;
  for (size_t k = 0; k < sizeof label_names / sizeof *label_names && !found; k++)
    for (int i = 0; i < sh->ncols && !found; i++) {
      column *c = &sh->cols[i];
      if (c->role == ROLE_TENSOR && c->spec.ndim == 0 && c->spec.dtype.code != kDLFloat &&
          !strcmp(c->name, label_names[k])) {
        c->label = found = true;
        c->role = k == 0 ? ROLE_LABEL : ROLE_TENSOR;
      }
    }
  uint32_t fields = 0;
  for (int i = 0; i < sh->ncols; i++) {
    column *c = &sh->cols[i];
    if (c->role != ROLE_TENSOR && c->role != ROLE_TEXT && c->role != ROLE_JSON && c->role != ROLE_BYTES)
      continue;
    int f = dl__dataset_field(ds, c->name, strlen(c->name));
    if (f < 0) {
      dl__log(DL__LOG_WARN, "MDS index %s: shard %s column %s: left out, %s", index, sh->basename, c->name,
              dl__field_refusal(ds, strlen(c->name)));
      continue;
    }
    fields |= 1u << f;
    if (!ds->mds && !(ds->mds = calloc(DL__MAX_FIELDS, sizeof *ds->mds)))
      return dl__fail(-ENOMEM, "out of memory");
    dl__mds_spec *known = &ds->mds[f];
    bool tensor = c->role == ROLE_TENSOR;
    if (tensor && known->used && !same_spec(known, &c->spec))
      return dl__fail(DL_EUNSUPPORTED, "MDS index %s: shard %s column %s is '%s', unlike the shards before it", index,
                      sh->basename, c->name, c->encoding);
    if (tensor) {
      *known = c->spec;
      known->used = true;
    } else {
      ds->bytes_kind[f] = c->role == ROLE_TEXT ? DL__BYTES_TEXT : c->role == ROLE_JSON ? DL__BYTES_JSON : DL__BYTES_RAW;
    }
  }
  char who[2 * PATH_MAX + 32];
  snprintf(who, sizeof who, "MDS index %s: shard %s", index, sh->basename[0] ? sh->basename : sh->zip);
  if (dl__dataset_declare(ds, who, fields, image >= 0))
    return dl__fail(-ENOMEM, "out of memory");
  return 0;
}

/* The label of a sample: the integer at P, its label column's value (C->size bytes). */
static int64_t label_of(const column *c, const uint8_t *p) {
  uint64_t v = 0;
  memcpy(&v, p, (size_t)c->size);
  int bits = c->spec.dtype.bits;
  if (c->spec.dtype.code == kDLInt && bits < 64 && (v >> (bits - 1) & 1))
    v |= ~0ull << bits; /* sign-extended */
  return (int64_t)v;
}

typedef struct dropped {
  uint64_t count, first;
  const char *why;
} dropped;

static void drop(dropped *d, uint64_t i, const char *why) {
  if (!d->count++) {
    d->first = i;
    d->why = why;
  }
}

/* Sample I of the shard at START, LEN bytes: its columns' places, label, image and fields. */
static int add_sample(dl__dataset *ds, const shard *sh, uint32_t file, int fd, uint64_t i, uint32_t start,
                      uint32_t len, int nvar, dropped *d) {
  uint8_t head[4 * MAX_COLUMNS];
  if ((uint64_t)nvar * 4 > len) {
    drop(d, i, "shorter than its column sizes");
    return 0;
  }
  int64_t got = nvar ? dl__pread_full(fd, head, (size_t)nvar * 4, start) : 0;
  if (got < 0)
    return dl__fail((int)got, "MDS shard %s sample %llu: %s", ds->files[file], (unsigned long long)i,
                    strerror((int)-got));
  if (got != nvar * 4) {
    drop(d, i, "past the end of the file");
    return 0;
  }
  dl__sample s = {.offset = start, .size = len, .label = -1, .file = file};
  s.first_ref = (uint32_t)ds->nrefs;
  uint64_t at = (uint64_t)nvar * 4;
  for (int c = 0, v = 0; c < sh->ncols; c++) {
    const column *col = &sh->cols[c];
    uint64_t size = col->size >= 0 ? (uint64_t)col->size : dl__le32(head + 4 * v++);
    if (at + size > len) {
      ds->nrefs = s.first_ref;
      drop(d, i, "its column sizes add up to more than its length");
      return 0;
    }
    if (col->label) {
      uint8_t value[8];
      if (dl__pread_full(fd, value, (size_t)size, start + at) != (int64_t)size) {
        ds->nrefs = s.first_ref;
        drop(d, i, "past the end of the file");
        return 0;
      }
      s.label = label_of(col, value);
    }
    if (col->role == ROLE_IMAGE) {
      s.image_at = (uint32_t)at, s.image_len = (uint32_t)size, s.codec = (uint8_t)col->codec;
    } else if (col->role != ROLE_LABEL) {
      int f = dl__dataset_field(ds, col->name, strlen(col->name));
      dl__fref ref = {.name = (uint16_t)f, .kind = col->role == ROLE_TENSOR ? DL__REF_MDS : DL__REF_BYTES,
                      .at = (uint32_t)at, .len = (uint32_t)size};
      if (f >= 0 && s.nrefs < DL__MAX_FIELDS && dl__dataset_add_ref(ds, &ref) == 0)
        s.nrefs++;
    }
    at += size;
  }
  if (at != len) {
    ds->nrefs = s.first_ref;
    drop(d, i, "its column sizes add up to less than its length");
    return 0;
  }
  char key[PATH_MAX + 32], name[48];
  snprintf(key, sizeof key, "%s:%llu", sh->basename, (unsigned long long)i);
  snprintf(name, sizeof name, "sample %llu", (unsigned long long)i);
  s.key = dl__dataset_intern(ds, key, strlen(key));
  s.name = dl__dataset_intern(ds, name, strlen(name));
  if (s.key == UINT32_MAX || s.name == UINT32_MAX || dl__dataset_push(ds, &s))
    return dl__fail(-ENOMEM, "out of memory");
  return 0;
}

/* What reading a sample depends on beside the shard's bytes: each column's name, encoding, size
 * and the part it plays. */
static uint64_t columns_hash(const shard *sh) {
  dl__hasher *h = dl__hasher_new();
  if (!h)
    return 0;
  for (int i = 0; i < sh->ncols; i++) {
    const column *c = &sh->cols[i];
    int64_t parts[4] = {c->size, c->role, c->codec, c->label};
    dl__hasher_update(h, c->name, strlen(c->name) + 1);
    dl__hasher_update(h, c->encoding, strlen(c->encoding) + 1);
    dl__hasher_update(h, parts, sizeof parts);
  }
  uint64_t v = dl__hasher_digest(h);
  dl__hasher_free(h);
  return v;
}

typedef struct scan_arg {
  const shard *sh;
  int on_error;
} scan_arg;

/* The samples of FILE (FD, SIZE bytes), the shard SH describes; 1 when some were left out (said
 * at every open, not cached). */
static int scan_shard(dl__dataset *ds, uint32_t file, int fd, uint64_t size, void *arg) {
  const shard *sh = ((const scan_arg *)arg)->sh;
  int on_error = ((const scan_arg *)arg)->on_error;
  const char *path = ds->files[file];
  uint8_t four[4];
  if (size < 4 || dl__pread_full(fd, four, 4, 0) != 4)
    return dl__fail(DL_ECORRUPT, "MDS shard %s: %llu bytes, too short for a shard", path, (unsigned long long)size);
  uint64_t n = dl__le32(four);
  if (n != sh->samples)
    return dl__fail(DL_ECORRUPT, "MDS shard %s holds %llu samples, its index says %llu (written over since?)", path,
                    (unsigned long long)n, (unsigned long long)sh->samples);
  uint64_t table = 4 * (n + 1);
  if (size < 4 + table)
    return dl__fail(DL_ECORRUPT, "MDS shard %s: its %llu offsets do not fit in its %llu bytes", path,
                    (unsigned long long)(n + 1), (unsigned long long)size);
  uint8_t *offsets = malloc(table);
  if (!offsets)
    return dl__fail(-ENOMEM, "out of memory");
  int64_t got = dl__pread_full(fd, offsets, table, 4);
  if (got != (int64_t)table) {
    free(offsets);
    return dl__fail(got < 0 ? (int)got : DL_ECORRUPT, "MDS shard %s: reading its offsets: %s", path,
                    got < 0 ? strerror((int)-got) : "the file ends early");
  }
  int nvar = 0;
  for (int c = 0; c < sh->ncols; c++)
    nvar += sh->cols[c].size < 0;
  dropped d = {0};
  int rc = 0;
  for (uint64_t i = 0; i < n && !rc; i++) {
    uint32_t a = dl__le32(offsets + 4 * i), b = dl__le32(offsets + 4 * (i + 1));
    if (a < 4 + table || b < a)
      drop(&d, i, "its offsets are out of order");
    else if (b > size)
      drop(&d, i, "past the end of the file");
    else
      rc = add_sample(ds, sh, file, fd, i, a, b - a, nvar, &d);
  }
  free(offsets);
  if (!rc && d.count && on_error == DL__ON_ERROR_FAIL)
    rc = dl__fail(DL_ECORRUPT, "MDS shard %s sample %llu: %s", path, (unsigned long long)d.first, d.why);
  else if (!rc && d.count) {
    ds->left_out += d.count;
    dl__log(DL__LOG_WARN, "MDS shard %s: %llu of its %llu samples left out (sample %llu: %s)", path,
            (unsigned long long)d.count, (unsigned long long)n, (unsigned long long)d.first, d.why);
  }
  return rc ? rc : d.count ? 1 : 0;
}

typedef struct zipped {
  const char *path; /* the compressed shard: a file, or a URL fetched whole first */
  const dl__options *o;
  uint64_t raw_bytes;
  const char *compression; /* as the index names it: "zstd", "gz:6", ... */
} zipped;

/* The uncompressed copy of shard Z into FD. */
static int unpack_into(int fd, void *arg) {
  const zipped *z = arg;
  int in;
  uint64_t size;
  int rc = dl__is_url(z->path) ? dl__remote_copy(z->path, z->o, true, &in, &size)
                               : (in = dl__open_regular(z->path, "MDS shard", NULL)) < 0 ? in : 0;
  if (rc)
    return rc;
  rc = dl__unpack(in, z->compression, z->raw_bytes, z->raw_bytes, fd, "MDS shard", z->path, NULL);
  close(in);
  return rc;
}

/* The version of compressed shard Z: of the remote object, or of the file as it is now. */
static int zipped_version(const zipped *z, uint64_t *version) {
  uint64_t size;
  if (dl__is_url(z->path))
    return dl__remote_version(z->path, z->o, &size, version);
  struct stat st;
  if (stat(z->path, &st))
    return dl__fail(-errno, "MDS shard %s: %s", z->path, strerror(errno));
  uint64_t id[4] = {(uint64_t)st.st_size, (uint64_t)st.st_ino, (uint64_t)st.st_mtim.tv_sec,
                    (uint64_t)st.st_mtim.tv_nsec};
  *version = XXH64(id, sizeof id, XXH64(z->path, strlen(z->path), 3));
  return 0;
}

/* The uncompressed copy of shard Z (RAW_NAME: the path or URL of its uncompressed basename) kept
 * in cache_dir, made once, into *FD; -1 there when none can be kept now (another process makes
 * it, or no room), so that the caller makes a temporary one. */
static int kept_copy(const zipped *z, const char *raw_name, int *fd) {
  uint64_t version;
  *fd = -1;
  int rc = zipped_version(z, &version);
  if (rc)
    return rc;
  /* Named as the raw shard, of the compressed object's version and the size it unpacks to. */
  int got = dl__shard_cache_keep(z->o, raw_name, version ^ z->raw_bytes, z->raw_bytes, unpack_into, (void *)z);
  if (got >= 0)
    *fd = got;
  else if (got == -EBUSY || got == -ENOSPC)
    dl__log(DL__LOG_INFO, "MDS shard %s: its uncompressed copy is not kept in cache_dir (%s); a temporary one is made",
            z->path, got == -EBUSY ? "another process is making it" : "no room within cache_limit");
  else
    return got;
  return 0;
}

/* A shard kept compressed (zip_data): decompressed at open into a temporary file that the loader
 * reads as a local shard (fetched whole first when the dataset is remote). */
static int load_zipped(dl__dataset *ds, const char *root, const shard *sh, const dl__options *o, scan_arg *arg) {
  char path[PATH_MAX * 2 + 2];
  int rc = dl__is_url(root) ? dl__remote_join(path, sizeof path, root, sh->zip)
                            : (snprintf(path, sizeof path, "%s/%s", root, sh->zip), 0);
  if (rc)
    return rc;
  const char *how = sh->compression[0] ? sh->compression : "an unnamed compression";
  if (!dl__unpack_reads(how))
    return dl__fail(DL_EUNSUPPORTED, "MDS shard %s is compressed with %s: zstd, gz and bz2 shards are read; "
                    "decompress it once into %s/%s, or write the dataset with compression='zstd' or none", path,
                    how, root, sh->basename[0] ? sh->basename : "its raw_data name");
  if (!sh->raw_bytes)
    return dl__fail(DL_ECORRUPT, "MDS index: shard %s: the index gives no uncompressed size (raw_data bytes)", path);
  if (sh->raw_bytes > UINT32_MAX) /* a shard's offsets are 32-bit */
    return dl__fail(DL_ECORRUPT, "MDS index: shard %s: an uncompressed size of %llu bytes, above 4 GiB", path,
                    (unsigned long long)sh->raw_bytes);
  zipped z = {path, o, sh->raw_bytes, how};
  int fd = -1;
  if (o->cache_dir[0]) {
    char raw[PATH_MAX * 2 + 2];
    const char *base = sh->basename[0] ? sh->basename : sh->zip;
    rc = dl__is_url(root) ? dl__remote_join(raw, sizeof raw, root, base)
                          : (snprintf(raw, sizeof raw, "%s/%s", root, base), 0);
    if (rc || (rc = kept_copy(&z, raw, &fd)))
      return rc;
  }
  if (fd < 0) {
    if ((fd = dl__scratch_file(0, path)) < 0)
      return fd;
    if ((rc = unpack_into(fd, &z))) {
      close(fd);
      return rc;
    }
  }
  uint32_t file;
  if ((rc = dl__dataset_add_file(ds, path, &file))) {
    close(fd);
    return rc;
  }
  ds->fds[file] = fd;
  ds->unpacked++;
  rc = scan_shard(ds, file, fd, sh->raw_bytes, arg);
  return rc < 0 ? rc : 0;
}

/* Shard SH of the dataset at ROOT (a folder, or a remote index's URL without "/index.json"). */
static int load_shard(dl__dataset *ds, const char *root, const shard *sh, const char *index, const dl__options *o) {
  char path[PATH_MAX * 2 + 2];
  if (!inside(sh->basename) || (sh->zip[0] && !inside(sh->zip)))
    return dl__fail(DL_ECORRUPT, "MDS index %s: shard '%s' lies outside the dataset's folder", index,
                    sh->basename[0] ? sh->basename : sh->zip);
  scan_arg arg = {sh, o->on_error};
  bool remote = dl__is_url(root);
  int rc = remote ? dl__remote_join(path, sizeof path, root, sh->basename)
                  : (snprintf(path, sizeof path, "%s/%s", root, sh->basename), 0);
  if (rc)
    return rc;
  struct stat st;
  if (sh->zip[0] && (remote || stat(path, &st)))
    return load_zipped(ds, root, sh, o, &arg);
  /* A sample table depends on the shard's bytes and on how its columns were read: the index
   * cache keeps it for both. */
  uint64_t salt = columns_hash(sh);
  if (remote)
    return dl__remote_load_scanned(ds, path, o, scan_shard, &arg, salt);
  uint32_t file;
  uint64_t size;
  dl__shard_id id;
  rc = dl__dataset_open_file(ds, path, &file, &size, &id);
  if (rc)
    return rc;
  id.edges ^= salt;
  if (dl__index_file_read(ds, file, path, &id) == 0)
    return 0;
  size_t first = ds->n;
  rc = scan_shard(ds, file, ds->fds[file], size, &arg);
  if (rc == 0)
    dl__index_file_write(ds, first, path, &id);
  return rc < 0 ? rc : 0;
}

bool dl__mds_is(const char *path) {
  size_t n = strlen(path);
  if (n >= 10 && !strcmp(path + n - 10, "index.json") && (n == 10 || path[n - 11] == '/'))
    return true;
  /* A folder whose index.json lists shards: an ImageFolder may hold an index.json of its own. */
  char index[PATH_MAX], head[4096];
  if (snprintf(index, sizeof index, "%s/index.json", path) >= (int)sizeof index)
    return false;
  int fd = open(index, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    if (fd >= 0)
      close(fd);
    return false;
  }
  int64_t got = dl__pread_full(fd, head, sizeof head, 0);
  close(fd);
  return got > 0 && memmem(head, (size_t)got, "\"shards\"", 8);
}

/* The text of index.json at INDEX (a file or a URL) into a new buffer *TEXT, *LEN bytes. */
static int read_index(dl__dataset *ds, const char *index, const dl__options *o, char **text, size_t *len) {
  if (dl__is_url(index))
    return dl__remote_get_text(ds, index, o, INDEX_MAX, text, len);
  *text = NULL;
  struct stat st;
  int fd = dl__open_regular(index, "MDS index", &st);
  if (fd < 0)
    return fd;
  if (st.st_size > INDEX_MAX) {
    close(fd);
    return dl__fail(DL_ELIMIT, "MDS index %s: %lld bytes, above %u", index, (long long)st.st_size, INDEX_MAX);
  }
  *text = malloc((size_t)st.st_size + 1);
  int64_t got = *text ? dl__pread_full(fd, *text, (size_t)st.st_size, 0) : -ENOMEM;
  close(fd);
  if (got < 0)
    return dl__fail((int)got, "MDS index %s: %s", index, strerror((int)-got));
  *len = (size_t)got;
  return 0;
}

/* Calls ON_SHARD for each shard the index at PATH lists, with the dataset's folder (or URL) and
 * the index's path; stops at its first error. */
typedef int (*on_shard_fn)(dl__dataset *ds, const char *root, const char *index, shard *sh, void *arg);

static int walk_index(dl__dataset *ds, const char *path, const dl__options *o, on_shard_fn on_shard, void *arg) {
  char index[PATH_MAX], root[PATH_MAX];
  size_t n = strlen(path);
  bool file = n >= 10 && !strcmp(path + n - 10, "index.json");
  bool slash = n && path[n - 1] == '/';
  if (snprintf(index, sizeof index, file ? "%s" : slash ? "%sindex.json" : "%s/index.json", path) >= (int)sizeof index)
    return dl__fail(DL_ELIMIT, "source %s: path too long", path);
  size_t root_len = strlen(index) - 10;
  snprintf(root, sizeof root, "%.*s", (int)(root_len ? root_len - 1 : 0), index);
  if (!root[0])
    snprintf(root, sizeof root, ".");
  char *text = NULL;
  size_t got = 0;
  shard *sh = malloc(sizeof *sh);
  int rc = !sh ? dl__fail(-ENOMEM, "out of memory") : read_index(ds, index, o, &text, &got);
  const char *p = text, *end = text ? text + got : NULL;
  bool shards = false, malformed = false;
  char key[32];
  int member = 0, more = 0;
  if (!rc) {
    p = dl__json_space(p, end);
    malformed = p >= end || *p++ != '{';
  }
  while (!rc && !malformed && (member = dl__json_member(&p, end, key, sizeof key)) == 1) {
    if (strcmp(key, "shards") || *p != '[') {
      malformed = !(p = dl__json_skip(p, end));
      continue;
    }
    shards = true;
    p++;
    while (!rc && !malformed && (more = dl__json_element(&p, end)) == 1) {
      if (!(p = shard_object(p, end, sh)))
        malformed = true;
      else
        rc = on_shard(ds, root, index, sh, arg);
    }
    malformed = malformed || more < 0;
  }
  if (!rc && (malformed || member < 0 || !shards))
    rc = dl__fail(DL_ECORRUPT, "MDS index %s: %s", index, shards || malformed || member < 0 ? "malformed JSON" : "no \"shards\" list");
  free(text);
  free(sh);
  return rc;
}

static int load_one(dl__dataset *ds, const char *root, const char *index, shard *sh, void *arg) {
  int rc = check_columns(ds, sh, index);
  return rc ? rc : load_shard(ds, root, sh, index, arg);
}

int dl__mds_load(dl__dataset *ds, const char *path, const dl__options *o) {
  return walk_index(ds, path, o, load_one, (void *)o);
}

typedef struct digest_walk {
  int (*each)(const char *file, const dl__mds_digest *d, void *arg);
  void *arg;
} digest_walk;

static int each_digest(dl__dataset *ds, const char *root, const char *index, shard *sh, void *arg) {
  (void)ds;
  const digest_walk *w = arg;
  for (int z = 0; z < 2; z++) {
    const char *name = z ? sh->zip : sh->basename;
    if (!sh->ndigests[z])
      continue;
    if (!inside(name))
      return dl__fail(DL_ECORRUPT, "MDS index %s: shard '%s' lies outside the dataset's folder", index, name);
    char file[PATH_MAX * 2 + 2];
    snprintf(file, sizeof file, "%s/%s", root, name);
    for (int i = 0; i < sh->ndigests[z]; i++) {
      int rc = w->each(file, &sh->digests[z][i], w->arg);
      if (rc)
        return rc;
    }
  }
  return 0;
}

int dl__mds_digests(const char *path, int (*each)(const char *file, const dl__mds_digest *d, void *arg), void *arg) {
  dl__options o;
  dl__options_parse(&o, "");
  dl__dataset ds = {0};
  digest_walk w = {each, arg};
  int rc = walk_index(&ds, path, &o, each_digest, &w);
  dl__dataset_free(&ds);
  return rc;
}

/* An MDS dataset by its name: a folder holding index.json, or the index.json; remote, its index.json
 * or a URL ending in '/' (its folder), or one of its .mds shards, which are read only through it. */
static bool mds_by_name(const char *path, const struct stat *st) {
  if (st)
    return dl__mds_is(path);
  size_t n = strlen(path);
  return (n >= 11 && !strcmp(path + n - 11, "/index.json")) || (n && path[n - 1] == '/') ||
         (n > 4 && !strcmp(path + n - 4, ".mds"));
}

static int mds_open_remote(dl__dataset *ds, const char *url, const dl__options *o, dl__probe *p) {
  (void)p;
  size_t n = strlen(url);
  if (n > 4 && !strcmp(url + n - 4, ".mds"))
    return dl__fail(DL_EUNSUPPORTED, "source %s: an MDS shard is read through its dataset's index.json: give the "
                    "URL of that (or of its folder, ending in '/')", url);
  int rc = dl__mds_load(ds, url, o);
  if (rc == -ENOENT && url[n - 1] == '/') {
    char why[DL__MSG_MAX];
    snprintf(why, sizeof why, "%s", dl_last_error());
    rc = dl__fail(-ENOENT, "%s; a folder is read as an MDS dataset: give tar or ringfeed shards by name, brace "
                  "range or, on s3:// and hf://, a pattern such as %s*.tar", why, url);
  }
  return rc;
}

const dl__format dl__mds_format = {.name = "mds", .what = "MDS dataset", .by_name = mds_by_name,
                                   .open = dl__mds_load, .open_remote = mds_open_remote, .verify = dl__dataset_verify};
