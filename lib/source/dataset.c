/* The flat sample table: files, samples and one string pool for names. */
#include "source/source.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return 0;
  size_t n = *cap ? *cap : 64;
  while (n < need)
    n *= 2;
  void *q = realloc(*p, n * elem);
  if (!q)
    return -ENOMEM;
  *p = q;
  *cap = n;
  return 0;
}

int dl__dataset_add_file(dl__dataset *ds, const char *path, uint32_t *index) {
  size_t cap = ds->files_cap;
  if (grow((void **)&ds->files, &cap, ds->nfiles + 1u, sizeof *ds->files))
    return dl__fail(-ENOMEM, "out of memory adding %s", path);
  size_t fcap = ds->files_cap, dcap = ds->files_cap;
  if (grow((void **)&ds->fds, &fcap, ds->nfiles + 1u, sizeof *ds->fds) ||
      grow((void **)&ds->direct, &dcap, ds->nfiles + 1u, sizeof *ds->direct))
    return dl__fail(-ENOMEM, "out of memory adding %s", path);
  ds->files_cap = (uint32_t)cap;
  char *copy = strdup(path);
  if (!copy)
    return dl__fail(-ENOMEM, "out of memory adding %s", path);
  ds->files[ds->nfiles] = copy;
  ds->fds[ds->nfiles] = -1;
  ds->direct[ds->nfiles] = 0;
  *index = ds->nfiles++;
  return 0;
}

int dl__dataset_open_file(dl__dataset *ds, const char *path, uint32_t *file, uint64_t *size, dl__shard_id *id) {
  int rc = dl__dataset_add_file(ds, path, file);
  if (rc)
    return rc;
  struct stat st;
  int fd = dl__open_regular(path, "shard", &st);
  if (fd < 0)
    return fd;
  ds->fds[*file] = fd;
  *size = (uint64_t)st.st_size;
  if (id) {
    *id = (dl__shard_id){.size = (uint64_t)st.st_size,
                         .ino = (uint64_t)st.st_ino,
                         .mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec,
                         .ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec};
    uint8_t edge[8192];
    size_t half = st.st_size < 8192 ? (size_t)st.st_size / 2 : 4096;
    int64_t a = dl__pread_full(fd, edge, half, 0);
    int64_t b = dl__pread_full(fd, edge + half, half, (uint64_t)st.st_size - half);
    if (a < 0 || b < 0)
      return dl__fail(a < 0 ? (int)a : (int)b, "shard %s: %s", path, strerror(-(a < 0 ? (int)a : (int)b)));
    id->edges = dl__rfs_checksum(edge, (size_t)(a + b));
  }
  return 0;
}

uint32_t dl__dataset_intern(dl__dataset *ds, const char *s, size_t len) {
  if (ds->pool_len + len + 1 > UINT32_MAX)
    return UINT32_MAX;
  if (grow((void **)&ds->pool, &ds->pool_cap, ds->pool_len + len + 1, 1))
    return UINT32_MAX;
  uint32_t at = (uint32_t)ds->pool_len;
  memcpy(ds->pool + at, s, len);
  ds->pool[at + len] = 0;
  ds->pool_len += len + 1;
  return at;
}

int dl__dataset_push(dl__dataset *ds, const dl__sample *s) {
  if (grow((void **)&ds->samples, &ds->cap, ds->n + 1, sizeof *s))
    return -ENOMEM;
  ds->samples[ds->n++] = *s;
  return 0;
}

int dl__dataset_field(dl__dataset *ds, const char *name, size_t len) {
  for (int i = 0; i < ds->nfield_names; i++)
    if (strlen(ds->field_names[i]) == len && !memcmp(ds->field_names[i], name, len))
      return i;
  if (ds->nfield_names == DL__MAX_FIELDS || len == 0 || len > 63)
    return -1;
  if (!(ds->field_names[ds->nfield_names] = strndup(name, len)))
    return -1;
  return ds->nfield_names++;
}

_Static_assert(DL__MAX_FIELDS == 16, "dl__field_refusal names the limit");
const char *dl__field_refusal(const dl__dataset *ds, size_t len) {
  if (len == 0)
    return "its field name is empty";
  if (len > 63)
    return "its field name is longer than 63 bytes";
  if (ds->nfield_names == DL__MAX_FIELDS)
    return "a dataset has at most 16 distinct fields besides image and label";
  return "out of memory";
}

int dl__dataset_add_ref(dl__dataset *ds, const dl__fref *ref) {
  if (grow((void **)&ds->refs, &ds->refs_cap, ds->nrefs + 1, sizeof *ref))
    return -ENOMEM;
  ds->refs[ds->nrefs++] = *ref;
  return 0;
}

int dl__dataset_declare(dl__dataset *ds, const char *shard, uint32_t fields, bool image) {
  for (uint32_t i = 0; i < ds->ndeclared; i++)
    if (ds->declared[i].fields == fields && ds->declared[i].image == image)
      return 0;
  dl__declared *grown = realloc(ds->declared, (ds->ndeclared + 1) * sizeof *grown);
  if (!grown)
    return -ENOMEM;
  ds->declared = grown;
  if (!(grown[ds->ndeclared].shard = strdup(shard)))
    return -ENOMEM;
  grown[ds->ndeclared].fields = fields;
  grown[ds->ndeclared++].image = image;
  return 0;
}

static void free_classes(dl__dataset *ds) {
  for (uint32_t c = 0; c < ds->nclasses; c++)
    free(ds->classes[c]);
  free(ds->classes);
  ds->classes = NULL;
  ds->nclasses = 0;
}

void dl__dataset_classes(dl__dataset *ds, char ***classes, uint32_t n, size_t samples) {
  ds->class_samples += samples;
  if (ds->classes_differ)
    return;
  if (!ds->classes) { /* the first folder */
    ds->classes = *classes;
    ds->nclasses = n;
    *classes = NULL;
    return;
  }
  bool same = ds->nclasses == n;
  for (uint32_t c = 0; same && c < n; c++)
    same = !strcmp(ds->classes[c], (*classes)[c]);
  if (!same) {
    ds->classes_differ = true;
    free_classes(ds);
  }
}

void dl__dataset_free(dl__dataset *ds) {
  free_classes(ds);
  for (uint32_t i = 0; i < ds->nfiles; i++) {
    if (ds->fds && ds->fds[i] >= 0)
      close(ds->fds[i]);
    free(ds->files[i]);
  }
  free(ds->files);
  dl__dataset_unmap(ds);
  dl__remote_free(ds);
  free(ds->fds);
  free(ds->direct);
  free(ds->samples);
  free(ds->pool);
  free(ds->refs);
  free(ds->mds);
  free(ds->part_first);
  for (uint32_t i = 0; i < ds->ndeclared; i++)
    free(ds->declared[i].shard);
  free(ds->declared);
  for (int i = 0; i < ds->nfield_names; i++)
    free(ds->field_names[i]);
  memset(ds, 0, sizeof *ds);
}

uint64_t dl__dataset_fingerprint(const dl__dataset *ds) {
  dl__hasher *h = dl__hasher_new();
  if (!h)
    return 0;
  for (size_t i = 0; i < ds->n; i++) {
    const char *key = ds->pool + ds->samples[i].key;
    dl__hasher_update(h, key, strlen(key) + 1);
  }
  uint64_t fp = dl__hasher_digest(h);
  dl__hasher_free(h);
  return fp;
}

void dl__file_seen_of(const struct stat *st, dl__file_seen *out) {
  *out = (dl__file_seen){.dev = (uint64_t)st->st_dev,
                         .ino = (uint64_t)st->st_ino,
                         .size = (uint64_t)st->st_size,
                         .mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec,
                         .ctime_ns = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec};
}

/* A chain of small hashes, one a file, rather than a hash state kept in the dataset. */
void dl__dataset_file_named(dl__dataset *ds, uint32_t file, const void *id, size_t len) {
  uint64_t link[2 + 8] = {ds->seen_hash, file};
  len = len < sizeof link - 16 ? len : sizeof link - 16;
  memcpy(link + 2, id, len);
  ds->seen_hash = XXH64(link, 16 + len, 0);
  ds->nseen++;
}
