/*
 * The cached member index of a tar shard, kept beside it (<shard>.rfidx) or, when that folder is
 * not writable, in $XDG_CACHE_HOME/ringfeed. Valid while the shard is the one it was made from:
 * the same size, mtime, ctime and inode, and the same first and last 4 KiB (a shard replaced by
 * another of the same size and mtime is not). The cache file is untrusted input like the shard:
 * every field is checked, and an XXH64 covers it.
 *
 * Layout (little-endian): DL__INDEX_FILE_MAGIC, u64 shard size, i64 mtime ns, i64 ctime ns, u64 inode,
 * u64 hash of the shard's edges, u64 samples, u64 pool bytes,
 * u64 record bytes, then per sample {u64 offset, u64 size, i64 label, u32 name, u32 key, u8 codec,
 * u8 nrefs, u8 flags (2: the image is zstd-compressed), u8 0, u32 image_at, u32 image_len} followed
 * by nrefs x {u32 field name, u8 kind (0 .npy, 1 .npy.zst, 3 bytes, 4 an MDS value), 3 x u8 0, u32 at, u32 len}, then the string pool (names, keys, field names), then u64 XXH64 of
 * everything before it. (String fields are offsets into the pool.)
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

#define HEADER_BYTES 72
#define RECORD_BYTES 44
#define REF_BYTES 16

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* The fallback location (the only one for a URL): the cache folder, named by a hash of the
 * shard's absolute path or URL. */
static int fallback_path(const char *shard, char *buf, size_t cap) {
  char dir[PATH_MAX], abs[PATH_MAX];
  if (dl__user_cache_dir(dir, sizeof dir))
    return -1;
  if (dl__is_url(shard))
    snprintf(abs, sizeof abs, "%s", shard);
  else if (!realpath(shard, abs))
    return -1;
  const char *base = strrchr(abs, '/');
  int n = snprintf(buf, cap, "%s/%016llx-%s.rfidx", dir,
                   (unsigned long long)XXH64(abs, strlen(abs), 0), base ? base + 1 : abs);
  return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* Whether the first 48 bytes of an index file P name the shard ID. */
static bool made_from(const uint8_t *p, const dl__shard_id *id) {
  return !memcmp(p, DL__INDEX_FILE_MAGIC, 8) && get64(p + 8) == id->size && (int64_t)get64(p + 16) == id->mtime_ns &&
         (int64_t)get64(p + 24) == id->ctime_ns && get64(p + 32) == id->ino && get64(p + 40) == id->edges;
}

int dl__index_file_parse(dl__dataset *ds, uint32_t file, const uint8_t *p, size_t len, const dl__shard_id *id) {
  if (len < HEADER_BYTES + 8)
    return -1;
  uint64_t size = id->data_size ? id->data_size : id->size; /* where the samples lie */
  if (!made_from(p, id))
    return -1;
  uint64_t n = get64(p + 48), pool = get64(p + 56), recs = get64(p + 64);
  if (n > len / RECORD_BYTES || pool > len || recs > len || HEADER_BYTES + recs + pool + 8 != len)
    return -1;
  if (XXH64(p, len - 8, 0) != get64(p + len - 8))
    return -1;
  const uint8_t *rec = p + HEADER_BYTES, *end = rec + recs;
  const char *names = (const char *)end;
  if (pool && names[pool - 1] != 0)
    return -1;
  size_t first = ds->n, first_ref = ds->nrefs;
  for (uint64_t i = 0; i < n; i++) {
    if (rec + RECORD_BYTES > end)
      goto bad;
    dl__sample s = {0};
    s.offset = get64(rec);
    s.size = get64(rec + 8);
    s.label = (int64_t)get64(rec + 16);
    uint32_t name, key;
    memcpy(&name, rec + 24, 4);
    memcpy(&key, rec + 28, 4);
    s.codec = rec[32];
    uint8_t nrefs = rec[33];
    s.flags = rec[34] & DL__SAMPLE_IMAGE_ZST;
    memcpy(&s.image_at, rec + 36, 4);
    memcpy(&s.image_len, rec + 40, 4);
    rec += RECORD_BYTES;
    if (name >= pool || key >= pool || s.codec > DL__CODEC_PIL || s.offset > size ||
        s.size > size - s.offset || nrefs > DL__MAX_FIELDS || rec + (size_t)nrefs * REF_BYTES > end ||
        (uint64_t)s.image_at + s.image_len > s.size)
      goto bad;
    s.name = dl__dataset_intern(ds, names + name, strlen(names + name));
    s.key = dl__dataset_intern(ds, names + key, strlen(names + key));
    if (s.name == UINT32_MAX || s.key == UINT32_MAX)
      goto bad;
    s.file = file;
    s.first_ref = (uint32_t)ds->nrefs;
    s.nrefs = nrefs;
    for (uint8_t r = 0; r < nrefs; r++, rec += REF_BYTES) {
      uint32_t fname;
      dl__fref f = {.kind = rec[4]};
      memcpy(&fname, rec, 4);
      memcpy(&f.at, rec + 8, 4);
      memcpy(&f.len, rec + 12, 4);
      if (fname >= pool || f.kind > DL__REF_MDS || f.kind == DL__REF_TOKENS || (uint64_t)f.at + f.len > s.size)
        goto bad;
      int idx = dl__dataset_field(ds, names + fname, strlen(names + fname));
      /* An MDS value is read as its column's encoding says: known (from the dataset's index) or bad. */
      if (idx < 0 || (f.kind == DL__REF_MDS && !(ds->mds && ds->mds[idx].used)))
        goto bad;
      f.name = (uint16_t)idx;
      if (dl__dataset_add_ref(ds, &f))
        goto bad;
    }
    if (dl__dataset_push(ds, &s))
      goto bad;
  }
  if (rec != end)
    goto bad;
  return 0;
bad:
  ds->n = first;
  ds->nrefs = first_ref;
  return -1;
}

bool dl__is_index_file(const char *path, char *why, size_t cap) {
  size_t n = strlen(path);
  if (n <= 6 || strcmp(path + n - 6, ".rfidx"))
    return false;
  if (why)
    snprintf(why, cap, "%s is the index saved beside shard %.*s, not a shard", path, (int)(n - 6), path);
  return true;
}

/* Where the index of shard PATH may be: beside it (ATTEMPT 0) or in the cache folder (1). */
static int index_path(const char *path, int attempt, char *cpath, size_t cap) {
  if (attempt == 0)
    return snprintf(cpath, cap, "%s.rfidx", path) < (int)cap ? 0 : -1;
  return fallback_path(path, cpath, cap);
}

bool dl__index_file_current(const char *path, const dl__shard_id *id) {
  char cpath[PATH_MAX + 64];
  bool current = false;
  for (int attempt = dl__is_url(path); attempt < 2 && !current && !index_path(path, attempt, cpath, sizeof cpath);
       attempt++) {
    uint8_t head[48];
    int fd = open(cpath, O_RDONLY | O_CLOEXEC);
    current = fd >= 0 && dl__pread_full(fd, head, sizeof head, 0) == (int64_t)sizeof head && made_from(head, id);
    if (fd >= 0)
      close(fd);
  }
  return current;
}

int dl__index_file_read(dl__dataset *ds, uint32_t file, const char *path, const dl__shard_id *id) {
  char cpath[PATH_MAX + 64];
  for (int attempt = dl__is_url(path); attempt < 2; attempt++) {
    if (index_path(path, attempt, cpath, sizeof cpath))
      return -1;
    uint8_t *p;
    size_t len;
    if (dl__read_file(cpath, HEADER_BYTES + 8, &p, &len))
      continue;
    int r = dl__index_file_parse(ds, file, p, len, id);
    free(p);
    if (r == 0)
      return 0;
  }
  return -1;
}

/* Whether the folder holding PATH has no write permission for anyone: a dataset folder marked
 * read-only is left as it is even by root, whom the permission would not stop. */
static bool folder_marked_read_only(const char *path) {
  char dir[PATH_MAX];
  const char *slash = strrchr(path, '/');
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
  struct stat st;
  return stat(dir, &st) == 0 && !(st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH));
}

void dl__index_file_write(const dl__dataset *ds, size_t first, const char *path, const dl__shard_id *id) {
  size_t n = ds->n - first, pool = 0, recs = 0;
  for (size_t i = first; i < ds->n; i++) {
    const dl__sample *s = &ds->samples[i];
    pool += strlen(ds->pool + s->name) + strlen(ds->pool + s->key) + 2;
    recs += RECORD_BYTES + (size_t)s->nrefs * REF_BYTES;
    for (uint8_t r = 0; r < s->nrefs; r++)
      pool += strlen(ds->field_names[ds->refs[s->first_ref + r].name]) + 1;
  }
  size_t len = HEADER_BYTES + recs + pool + 8;
  uint8_t *p = calloc(1, len);
  if (!p)
    return;
  memcpy(p, DL__INDEX_FILE_MAGIC, 8);
  put64(p + 8, id->size);
  put64(p + 16, (uint64_t)id->mtime_ns);
  put64(p + 24, (uint64_t)id->ctime_ns);
  put64(p + 32, id->ino);
  put64(p + 40, id->edges);
  put64(p + 48, n);
  put64(p + 56, pool);
  put64(p + 64, recs);
  uint8_t *rec = p + HEADER_BYTES;
  char *names = (char *)(rec + recs);
  uint32_t at = 0;
#define PUT_STRING(str, dst)                                                                       \
  do {                                                                                             \
    size_t nl_ = strlen(str) + 1;                                                                  \
    memcpy(dst, &at, 4);                                                                           \
    memcpy(names + at, str, nl_);                                                                  \
    at += (uint32_t)nl_;                                                                           \
  } while (0)
  for (size_t i = first; i < ds->n; i++) {
    const dl__sample *s = &ds->samples[i];
    put64(rec, s->offset);
    put64(rec + 8, s->size);
    put64(rec + 16, (uint64_t)s->label);
    PUT_STRING(ds->pool + s->name, rec + 24);
    PUT_STRING(ds->pool + s->key, rec + 28);
    rec[32] = s->codec;
    rec[33] = s->nrefs;
    rec[34] = s->flags & DL__SAMPLE_IMAGE_ZST;
    memcpy(rec + 36, &s->image_at, 4);
    memcpy(rec + 40, &s->image_len, 4);
    rec += RECORD_BYTES;
    for (uint8_t r = 0; r < s->nrefs; r++, rec += REF_BYTES) {
      const dl__fref *f = &ds->refs[s->first_ref + r];
      PUT_STRING(ds->field_names[f->name], rec);
      rec[4] = f->kind;
      memcpy(rec + 8, &f->at, 4);
      memcpy(rec + 12, &f->len, 4);
    }
  }
#undef PUT_STRING
  put64(p + len - 8, XXH64(p, len - 8, 0));
  char target[PATH_MAX + 64];
  snprintf(target, sizeof target, "%s.rfidx", path);
  int r = dl__is_url(path) || folder_marked_read_only(path) ? -EROFS : dl__write_file(target, p, len);
  if (r) {
    char dir[PATH_MAX];
    if (fallback_path(path, target, sizeof target) == 0 && dl__user_cache_dir(dir, sizeof dir) == 0) {
      dl__mkdirs(dir);
      r = dl__write_file(target, p, len);
    }
    if (r)
      dl__log(DL__LOG_INFO, "shard %s: index not cached (%s)", path, strerror(-r));
  }
  free(p);
}
