/*
 * Writing ringfeed shards (docs/format.md): records padded to the alignment, checksummed as they
 * are written; the index is kept in memory and written with the trailer at close. The file is
 * written as PATH.part and renamed, so a reader never sees a half-written shard.
 */
#include "source/source.h"
#include "decode/jpeg.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

struct dl_writer {
  FILE *f;
  char path[PATH_MAX], part[PATH_MAX + 8];
  uint32_t align;
  int zstd_level;
  uint64_t pos;
  dl__buf record;   /* the current record's stored bytes */
  size_t record_len;
  bool open_record;
  dl__buf index;    /* record entries, as they will be written */
  size_t index_len;
  uint64_t nrecords;
  dl__buf keys;
  size_t keys_len;
  char *names[256];
  uint32_t nnames;
  dl__buf classes; /* the class table as it will be written, less its checksum; empty: none */
  size_t classes_len;
  /* the current record */
  uint32_t key_off;
  int64_t label;
  uint8_t fields[64][20];
  uint16_t nfields;
  ZSTD_CCtx *zc;
};

static int put(dl__buf *b, size_t *len, const void *p, size_t n) {
  if (dl__buf_reserve(b, *len + n))
    return -ENOMEM;
  memcpy(b->p + *len, p, n);
  *len += n;
  return 0;
}

static int write_bytes(dl_writer *w, const void *p, size_t n) {
  if (n && fwrite(p, 1, n, w->f) != n)
    return dl__fail(-EIO, "writing %s: %s", w->part, strerror(errno));
  w->pos += n;
  return 0;
}

static int pad_to(dl_writer *w, uint64_t boundary) {
  static const uint8_t zeros[4096];
  while (w->pos % boundary) {
    size_t n = (size_t)(boundary - w->pos % boundary);
    int r = write_bytes(w, zeros, n < sizeof zeros ? n : sizeof zeros);
    if (r)
      return r;
  }
  return 0;
}

int dl_writer_open(dl_writer **out, const char *path, const char *options) {
  if (!out || !path)
    return dl__fail(-EINVAL, "dl_writer_open: %s is NULL", !out ? "OUT" : "PATH");
  *out = NULL;
  dl_writer *w = calloc(1, sizeof *w);
  if (!w)
    return dl__fail(-ENOMEM, "out of memory");
  w->align = 4096;
  w->zstd_level = 3;
  const char *p = options ? options : "";
  while (*p) {
    while (*p == ' ')
      p++;
    if (!*p)
      break;
    long v;
    int used = 0;
    if (sscanf(p, "align=%ld%n", &v, &used) == 1 && used) {
      if (v < 1 || v > (1 << 20) || (v & (v - 1))) {
        free(w);
        return dl__fail(DL_EOPTION, "writer option align=%ld: expected 1 or a power of two up to 1048576", v);
      }
      w->align = (uint32_t)v;
    } else if (sscanf(p, "zstd_level=%ld%n", &v, &used) == 1 && used) {
      if (v < 1 || v > ZSTD_maxCLevel()) {
        free(w);
        return dl__fail(DL_EOPTION, "writer option zstd_level=%ld: expected 1..%d", v, ZSTD_maxCLevel());
      }
      w->zstd_level = (int)v;
    } else {
      free(w);
      return dl__fail(DL_EOPTION, "unknown writer option '%.*s'", (int)strcspn(p, " "), p);
    }
    p += used;
  }
  /* Refused now rather than when the finished shard cannot be renamed over it. */
  struct stat st;
  int refused = strlen(path) >= sizeof w->path ? -ENAMETOOLONG : !stat(path, &st) && S_ISDIR(st.st_mode) ? -EISDIR : 0;
  if (refused) {
    free(w);
    return dl__fail(refused, "cannot write a shard to %.200s: %s", path,
                    refused == -EISDIR ? "it is a folder" : "the path is too long");
  }
  snprintf(w->path, sizeof w->path, "%s", path);
  snprintf(w->part, sizeof w->part, "%s.part", path);
  w->f = fopen(w->part, "wb");
  if (!w->f) {
    int e = errno;
    free(w);
    return dl__fail(-e, "cannot create %s.part: %s", path, strerror(e));
  }
  uint8_t head[64] = DL__RFS_MAGIC;
  uint32_t version = 1;
  memcpy(head + 8, &version, 4);
  memcpy(head + 12, &w->align, 4);
  int r = write_bytes(w, head, sizeof head);
  if (!r)
    r = pad_to(w, w->align > 64 ? w->align : 64);
  if (r) {
    dl_writer_abort(w);
    return r;
  }
  *out = w;
  return 0;
}

int dl_writer_begin(dl_writer *w, const char *key, int64_t label) {
  if (!w)
    return dl__fail(-EINVAL, "dl_writer_begin: the writer is NULL (closed already?)");
  if (w->open_record)
    return dl__fail(-EINVAL, "%s: dl_writer_begin inside a record", w->path);
  if (!key)
    return dl__fail(-EINVAL, "%s: dl_writer_begin without a key", w->path);
  size_t n = strlen(key);
  if (n >= 4096)
    return dl__fail(-EINVAL, "%s: key of %zu bytes is too long", w->path, n);
  if (w->keys_len + n + 1 > UINT32_MAX)
    return dl__fail(DL_ELIMIT, "%s: too many keys for one shard", w->path);
  w->key_off = (uint32_t)w->keys_len;
  if (put(&w->keys, &w->keys_len, key, n + 1))
    return dl__fail(-ENOMEM, "out of memory");
  w->label = label;
  w->nfields = 0;
  w->record_len = 0;
  w->open_record = true;
  return 0;
}

static int add_field(dl_writer *w, const char *name, const char *codec, const void *data, size_t size) {
  int c = -1;
  for (int i = 0; i < DL__RFS_CODECS; i++)
    if (dl__rfs_codec_name(i) && !strcmp(codec, dl__rfs_codec_name(i)))
      c = i;
  if (c < 0) {
    char known[160] = "";
    for (size_t i = 0, n = 0; i < DL__RFS_CODECS && n < sizeof known; i++)
      if (dl__rfs_codec_name((int)i))
        n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", n ? ", " : "", dl__rfs_codec_name((int)i));
    return dl__fail(DL_EOPTION, "%s: unknown codec '%s' (%s)", w->path, codec, known);
  }
  /* Bytes every read would fail on: another image format's (the codec mistyped), or an array's
   * .npy payload where the encoded image belongs. Other bytes go in as given, for a bad sample
   * kept on purpose (dlshard create --keep-bad) is the loader's to skip. */
  const dl__codec *image = dl__codec_of_rfs(c), *is = image ? dl__codec_of(dl__sniff_codec(data, size)) : NULL;
  const char *key = (const char *)w->keys.p + w->key_off;
  if (image && size >= 6 && !memcmp(data, "\x93NUMPY", 6))
    return dl__fail(DL_EOPTION, "%s: field '%s' of record '%s': codec %s, but its bytes are an array's .npy payload "
                    "(encode the image first, or give codec raw)", w->path, name, key, codec);
  if (is && is != image && is->rfs >= 0)
    return dl__fail(DL_EOPTION, "%s: field '%s' of record '%s': codec %s, but its bytes are a %s file (give codec %s)",
                    w->path, name, key, codec, is->label, is->name);
  if (w->nfields == 64)
    return dl__fail(DL_ELIMIT, "%s: more than 64 fields in a record", w->path);
  uint32_t name_idx = w->nnames;
  for (uint32_t i = 0; i < w->nnames; i++)
    if (!strcmp(w->names[i], name))
      name_idx = i;
  for (int i = 0; i < w->nfields && name_idx < w->nnames; i++) {
    uint16_t seen;
    memcpy(&seen, w->fields[i], 2);
    if (seen == name_idx) /* a reader would have to pick one of the two */
      return dl__fail(DL_EOPTION, "%s: field '%s' given twice in record '%s'", w->path, name, key);
  }
  if (name_idx == w->nnames) {
    if (w->nnames == 256 || !*name || strlen(name) > 255)
      return dl__fail(DL_ELIMIT, "%s: field name '%s' not accepted (256 names of 1..255 bytes)", w->path, name);
    if (!(w->names[w->nnames++] = strdup(name)))
      return dl__fail(-ENOMEM, "out of memory");
  }
  size_t at = w->record_len, stored = size;
  if (c == DL__RFS_ZSTD) {
    if (!w->zc && !(w->zc = ZSTD_createCCtx()))
      return dl__fail(-ENOMEM, "out of memory");
    size_t bound = ZSTD_compressBound(size);
    if (dl__buf_reserve(&w->record, at + bound))
      return dl__fail(-ENOMEM, "out of memory");
    stored = ZSTD_compressCCtx(w->zc, w->record.p + at, bound, data, size, w->zstd_level);
    if (ZSTD_isError(stored))
      return dl__fail(DL_ECORRUPT, "%s: zstd: %s", w->path, ZSTD_getErrorName(stored));
    w->record_len += stored;
  } else if (put(&w->record, &w->record_len, data, size)) {
    return dl__fail(-ENOMEM, "out of memory");
  }
  if (w->record_len > UINT32_MAX)
    return dl__fail(DL_ELIMIT, "%s: record larger than 4 GiB", w->path);
  uint8_t *e = w->fields[w->nfields++];
  uint16_t n16 = (uint16_t)name_idx;
  uint32_t off32 = (uint32_t)at, st32 = (uint32_t)stored;
  uint64_t raw = size;
  memset(e, 0, 20);
  memcpy(e, &n16, 2);
  e[2] = (uint8_t)c;
  /* A single-scan JPEG's codes read through as the loader's gpu_check reads them (docs/format.md):
   * every record read is checked against its checksum, so a loader's first run over these shards
   * need not read them again before the GPU decodes them. */
  if (image && image->id == DL__CODEC_JPEG && dl__jpeg_scan_vouched(data, size))
    e[3] = DL__RFS_SCAN_CLEAN;
  memcpy(e + 4, &off32, 4);
  memcpy(e + 8, &st32, 4);
  memcpy(e + 12, &raw, 8);
  return 0;
}

int dl_writer_field(dl_writer *w, const char *name, const char *codec, const void *data, size_t size) {
  if (!w)
    return dl__fail(-EINVAL, "dl_writer_field: the writer is NULL (closed already?)");
  if (!w->open_record)
    return dl__fail(-EINVAL, "%s: dl_writer_field outside a record", w->path);
  int r = !name || !codec || (!data && size)
              ? dl__fail(-EINVAL, "%s: dl_writer_field: %s is NULL", w->path, !name ? "NAME" : !codec ? "CODEC" : "DATA")
              : add_field(w, name, codec, data, size);
  if (r) { /* the record is dropped, key and all: the writer goes on with the next one */
    w->open_record = false;
    w->keys_len = w->key_off;
  }
  return r;
}

int dl_writer_end(dl_writer *w) {
  if (!w)
    return dl__fail(-EINVAL, "dl_writer_end: the writer is NULL (closed already?)");
  if (!w->open_record)
    return dl__fail(-EINVAL, "%s: dl_writer_end outside a record", w->path);
  w->open_record = false;
  int r = pad_to(w, w->align);
  if (r)
    return r;
  uint64_t offset = w->pos;
  uint32_t size = (uint32_t)w->record_len;
  uint64_t sum = dl__rfs_checksum(w->record.p, w->record_len);
  if ((r = write_bytes(w, w->record.p, w->record_len)))
    return r;
  uint8_t e[34];
  memcpy(e, &offset, 8);
  memcpy(e + 8, &size, 4);
  memcpy(e + 12, &w->key_off, 4);
  memcpy(e + 16, &w->label, 8);
  memcpy(e + 24, &sum, 8);
  memcpy(e + 32, &w->nfields, 2);
  if (put(&w->index, &w->index_len, e, sizeof e) ||
      put(&w->index, &w->index_len, w->fields, (size_t)w->nfields * 20))
    return dl__fail(-ENOMEM, "out of memory");
  w->nrecords++;
  return 0;
}

int dl_writer_classes(dl_writer *w, const char *const *names, size_t n) {
  if (!w)
    return dl__fail(-EINVAL, "dl_writer_classes: the writer is NULL (closed already?)");
  if (!names && n)
    return dl__fail(-EINVAL, "%s: dl_writer_classes: NAMES is NULL", w->path);
  if (n > DL__RFS_CLASS_TABLE_MAX / 3) /* each name takes 3 bytes or more */
    return dl__fail(DL_ELIMIT, "%s: %zu classes pass the class table's 64 MiB", w->path, n);
  /* Every name checked and the room taken before the table changes: a call that fails leaves the
   * table the last call made. */
  size_t len = n ? 12 : 0; /* "RFCLASS1", the count, then each name's length and bytes */
  for (size_t i = 0; i < n; i++) {
    size_t one = names[i] ? strlen(names[i]) : 0;
    if (one == 0 || one > UINT16_MAX)
      return dl__fail(DL_ELIMIT, "%s: class name %zu not accepted (1..65535 bytes)", w->path, i);
    if ((len += 2 + one) + 8 > DL__RFS_CLASS_TABLE_MAX)
      return dl__fail(DL_ELIMIT, "%s: class name %zu passes the class table's 64 MiB", w->path, i);
  }
  if (dl__buf_reserve(&w->classes, len))
    return dl__fail(-ENOMEM, "out of memory");
  w->classes_len = 0;
  if (!n)
    return 0;
  uint32_t count = (uint32_t)n;
  put(&w->classes, &w->classes_len, "RFCLASS1", 8); /* within the room taken: these cannot fail */
  put(&w->classes, &w->classes_len, &count, 4);
  for (size_t i = 0; i < n; i++) {
    uint16_t len16 = (uint16_t)strlen(names[i]);
    put(&w->classes, &w->classes_len, &len16, 2);
    put(&w->classes, &w->classes_len, names[i], len16);
  }
  return 0;
}

/* The class table before the index, and where it is in the header (whose bytes 16-31 it was
 * written with as zero). */
static int write_classes(dl_writer *w, uint64_t place[2]) {
  place[0] = w->pos;
  place[1] = w->classes_len + 8;
  uint64_t sum = dl__rfs_checksum(w->classes.p, w->classes_len);
  int r = write_bytes(w, w->classes.p, w->classes_len);
  return r ? r : write_bytes(w, &sum, 8);
}

static void writer_free(dl_writer *w) {
  for (uint32_t i = 0; i < w->nnames; i++)
    free(w->names[i]);
  dl__buf_free(&w->record);
  dl__buf_free(&w->index);
  dl__buf_free(&w->keys);
  dl__buf_free(&w->classes);
  ZSTD_freeCCtx(w->zc);
  free(w);
}

void dl_writer_abort(dl_writer *w) {
  if (!w)
    return;
  if (w->f)
    fclose(w->f);
  unlink(w->part);
  writer_free(w);
}

int dl_writer_close(dl_writer *w) {
  if (!w)
    return dl__fail(-EINVAL, "dl_writer_close: the writer is NULL (closed already?)");
  if (w->open_record) {
    int r = dl__fail(-EINVAL, "%s: closed inside a record", w->path);
    dl_writer_abort(w);
    return r;
  }
  int r = pad_to(w, w->align);
  uint64_t classes[2] = {0, 0};
  if (!r && w->classes_len)
    r = write_classes(w, classes);
  /* The index, assembled in memory so its hash can go into the trailer. */
  dl__buf idx = {0};
  size_t n = 0;
  uint64_t k = w->keys_len;
  put(&idx, &n, "RFINDEX1", 8);
  put(&idx, &n, &w->nrecords, 8);
  put(&idx, &n, &w->nnames, 4);
  for (uint32_t i = 0; i < w->nnames; i++) {
    uint16_t len = (uint16_t)strlen(w->names[i]);
    put(&idx, &n, &len, 2);
    put(&idx, &n, w->names[i], len);
  }
  put(&idx, &n, &k, 8);
  put(&idx, &n, w->keys.p, w->keys_len);
  if (put(&idx, &n, w->index.p, w->index_len))
    r = r ? r : dl__fail(-ENOMEM, "out of memory");
  uint64_t ioff = w->pos, isize = n, hash = dl__rfs_checksum(idx.p, n);
  uint8_t tail[32];
  memcpy(tail, &ioff, 8);
  memcpy(tail + 8, &isize, 8);
  memcpy(tail + 16, &hash, 8);
  memcpy(tail + 24, "RFTAIL1", 8);
  if (!r)
    r = write_bytes(w, idx.p, n);
  if (!r)
    r = write_bytes(w, tail, sizeof tail);
  dl__buf_free(&idx);
  if (!r && classes[0] && (fseek(w->f, 16, SEEK_SET) || fwrite(classes, 8, 2, w->f) != 2))
    r = dl__fail(-EIO, "writing %s: %s", w->part, strerror(errno));
  if (!r && fflush(w->f))
    r = dl__fail(-errno, "writing %s: %s", w->part, strerror(errno));
  if (!r && fsync(fileno(w->f)))
    r = dl__fail(-errno, "writing %s: %s", w->part, strerror(errno));
  if (fclose(w->f) && !r)
    r = dl__fail(-errno, "writing %s: %s", w->part, strerror(errno));
  w->f = NULL;
  if (!r && rename(w->part, w->path))
    r = dl__fail(-errno, "renaming %s: %s", w->part, strerror(errno));
  if (r)
    unlink(w->part);
  writer_free(w);
  return r;
}
