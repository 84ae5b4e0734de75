/*
 * The GPU path's verdicts on JPEGs (gpu_check: dl__jpeg_rows_clean reads a sample's entropy-coded
 * data through once, about 0.6 of a CPU decode for a baseline file, about a whole one for a
 * progressive file), kept across runs in the cache folder, so that only a dataset's first run
 * pays for them in its first epoch; ringfeed shards (.rfs) carry their writer's, and no run does.
 *
 * One file per dataset, named by a hash of what the verdicts are about: every shard's path and
 * identity (device, inode, size, mtime, ctime) and every sample's place in the shards. A shard
 * changed or replaced gives another name, and its verdicts are read again; a compressed shard
 * read from a temporary copy is named by the compressed file. An image folder's files, opened per
 * read, are named by what stat said of each when the folder was listed (dl__dataset_file_named).
 * A remote shard is named by its URL and version (its size and ETag, or with no ETag its first
 * bytes), what its cached index and copy are kept by; a remote compressed tar read from a local
 * copy, by the same version, given at open.
 *
 * The file is untrusted input: its size, magic, hash and every value are checked, and one that
 * does not pass is ignored (and written again at close). Loaders of one dataset in several
 * processes each add what they learnt to what the file holds when they close.
 *
 * Layout (little-endian): DL__CHECK_CACHE_MAGIC, u64 the dataset's hash, u64 samples, a byte a
 * sample (DL__VERDICT_*: 0 not read, 1 clean, 2 damaged), u64 XXH64 of all before.
 */
#include "gpu/gpu.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Changes whenever what a verdict means does. */
#define DL__CHECK_CACHE_MAGIC "RFGCHK02"
#define HEAD 24

static const dl__remote_file *remote_of(const dl__dataset *ds, uint32_t f) {
  return f < ds->nremote && ds->remote[f].url ? &ds->remote[f] : NULL;
}

/* The dataset's hash, or 0 where it keeps no verdicts. */
static uint64_t dataset_hash(const dl__dataset *ds) {
  if (!ds->fds || !ds->nfiles || !ds->n)
    return 0;
  uint32_t named = 0; /* files not named by their descriptor: every one must have been named at open */
  for (uint32_t f = 0; f < ds->nfiles; f++)
    named += !remote_of(ds, f) && (ds->fds[f] < 0 || dl__is_url(ds->files[f]));
  if (named != ds->nseen)
    return 0;
  XXH64_state_t *h = XXH64_createState();
  if (!h)
    return 0;
  XXH64_reset(h, 0);
  XXH64_update(h, &ds->seen_hash, sizeof ds->seen_hash);
  for (uint32_t f = 0; f < ds->nfiles; f++) {
    char abs[PATH_MAX];
    struct stat st;
    const dl__remote_file *r = remote_of(ds, f);
    if (r) { /* its URL and version (size and ETag, or first bytes), as the shard cache names it */
      XXH64_update(h, r->url, strlen(r->url) + 1);
      XXH64_update(h, &r->version, sizeof r->version);
      continue;
    }
    if (ds->fds[f] < 0 || dl__is_url(ds->files[f])) /* named at open (seen_hash) */
      continue;
    /* An unnamed uncompressed copy (a compressed shard's, made at every open) stands for the file
     * at its path, whose identity names it. */
    if (fstat(ds->fds[f], &st) || (st.st_nlink == 0 && stat(ds->files[f], &st)) ||
        !realpath(ds->files[f], abs)) {
      XXH64_freeState(h);
      return 0;
    }
    dl__file_seen id;
    dl__file_seen_of(&st, &id);
    XXH64_update(h, abs, strlen(abs) + 1);
    XXH64_update(h, &id, sizeof id);
  }
  for (size_t i = 0; i < ds->n; i++) {
    const dl__sample *s = &ds->samples[i];
    uint64_t at[] = {s->file, s->offset, s->size, s->image_at, s->image_len, s->codec};
    XXH64_update(h, at, sizeof at);
  }
  uint64_t v = XXH64_digest(h);
  XXH64_freeState(h);
  return v ? v : 1;
}

/* The verdicts' file in BUF, in the cache folder DIR. */
static int cache_path(uint64_t hash, char dir[PATH_MAX], char *buf, size_t cap) {
  if (dl__user_cache_dir(dir, PATH_MAX))
    return -1;
  int n = snprintf(buf, cap, "%s/%016llx.rfcheck", dir, (unsigned long long)hash);
  return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* The verdicts of the file at PATH for the dataset HASH of N samples, or NULL. */
static uint8_t *read_verdicts(const char *path, uint64_t hash, uint32_t n) {
  uint8_t *p;
  size_t len;
  if (dl__read_file(path, HEAD + 8, &p, &len))
    return NULL;
  uint64_t got_hash, got_n, sum;
  memcpy(&got_hash, p + 8, 8);
  memcpy(&got_n, p + 16, 8);
  memcpy(&sum, p + len - 8, 8);
  bool ok = !memcmp(p, DL__CHECK_CACHE_MAGIC, 8) && got_hash == hash && got_n == n &&
            len == HEAD + (size_t)n + 8 && XXH64(p, len - 8, 0) == sum;
  for (uint32_t i = 0; ok && i < n; i++)
    ok = p[HEAD + i] <= DL__VERDICT_DAMAGED;
  if (!ok) {
    dl__log(DL__LOG_INFO, "%s: not the GPU check's verdicts for this dataset; they are read again", path);
    free(p);
    return NULL;
  }
  memmove(p, p + HEAD, n);
  return p;
}

/* The verdicts the shards' writer gave (DL__SAMPLE_SCAN_CLEAN), taken with gpu_check on or off: the
 * record's checksum, checked at every read before the GPU may take its image, vouches for the bytes. */
static void take_from_shards(dl_loader *l, uint32_t n) {
  uint8_t *v = NULL;
  for (uint32_t i = 0; i < n; i++)
    if (l->ds.samples[i].flags & DL__SAMPLE_SCAN_CLEAN) {
      if (!v && !(v = calloc(n, 1)))
        return; /* read as usual */
      v[i] = DL__VERDICT_CLEAN;
    }
  if (v)
    l->st.check_shards = dl__jpeg_rows_take_verdicts(l->jpeg_rows, v, n);
  free(v);
}

void dl__check_verdicts_load(dl_loader *l) {
  uint32_t n = dl__jpeg_rows_verdicts(l->jpeg_rows, NULL);
  char path[PATH_MAX + 64], dir[PATH_MAX];
  take_from_shards(l, n);
  l->check_hash = l->o.gpu_check && n == l->ds.n ? dataset_hash(&l->ds) : 0;
  if (!l->check_hash || cache_path(l->check_hash, dir, path, sizeof path))
    return;
  uint8_t *v = read_verdicts(path, l->check_hash, n);
  if (!v)
    return;
  l->st.check_kept = dl__jpeg_rows_take_verdicts(l->jpeg_rows, v, n);
  free(v);
  dl__log(DL__LOG_DEBUG, "GPU check: %" PRId64 " verdicts from %s", l->st.check_kept, path);
}

void dl__check_verdicts_save(dl_loader *l) {
  uint32_t n = dl__jpeg_rows_verdicts(l->jpeg_rows, NULL);
  char path[PATH_MAX + 64], dir[PATH_MAX];
  if (!l->check_hash || !dl__jpeg_rows_walked(l->jpeg_rows) ||
      cache_path(l->check_hash, dir, path, sizeof path))
    return;
  uint8_t *p = malloc(HEAD + (size_t)n + 8);
  if (!p)
    return;
  /* What another process wrote meanwhile, under what this one learnt. */
  uint8_t *theirs = read_verdicts(path, l->check_hash, n);
  if (theirs)
    dl__jpeg_rows_take_verdicts(l->jpeg_rows, theirs, n);
  free(theirs);
  memcpy(p, DL__CHECK_CACHE_MAGIC, 8);
  uint64_t hash = l->check_hash, count = n;
  memcpy(p + 8, &hash, 8);
  memcpy(p + 16, &count, 8);
  dl__jpeg_rows_verdicts(l->jpeg_rows, p + HEAD);
  uint64_t sum = XXH64(p, HEAD + (size_t)n, 0);
  memcpy(p + HEAD + n, &sum, 8);
  dl__mkdirs(dir);
  int r = dl__write_file(path, p, HEAD + (size_t)n + 8);
  if (r)
    dl__log(DL__LOG_INFO, "GPU check: verdicts not kept in %s (%s)", path, strerror(-r));
  free(p);
}
