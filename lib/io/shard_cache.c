/*
 * The shard cache (cache_dir=, cache_limit=): remote shards downloaded whole, once, into a folder
 * on local disk and read from there by the local I/O backend. The processes of one host (the ranks
 * of a node) may share the folder, and it outlives them:
 *  - an entry is named by its shard's version (URL, size and ETag) and base name, so a changed
 *    object is another entry;
 *  - a download goes to ENTRY.part, held with an exclusive flock while it is written, and becomes
 *    ENTRY by rename once whole and flushed: a half-written shard is never opened, and a .part no
 *    process holds (its writer died) is removed;
 *  - a process reading an entry holds a shared flock on it; eviction, least recently used first
 *    (opening an entry sets its mtime), removes only entries it can lock exclusively, under the
 *    folder's .lock, so nothing in use disappears;
 *  - entries and downloads in progress (counted at full size from their start) stay within
 *    cache_limit.
 * Per loader, fetch threads download the shards the next batches need, in the order they need
 * them, as many as the limit holds (with shuffle_block=K: the current block and the next);
 * samples of shards not cached yet are read with ranged GETs meanwhile.
 *
 * Lock order: the cache's mu, then the loader's (which dl__upcoming's callbacks take while the
 * plan is made); never the other way round: the loader's threads call in here without theirs.
 */
#include "io/io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define FETCHERS 2
#define LOOKAHEAD_SAMPLES 65536 /* how far ahead in the sample order the fetchers plan */

/* ---- the folder ---- */

/* ENTRY's name: the shard's version and its base name (without a query). */
static void entry_name(const dl__remote_file *rf, char *out, size_t cap) {
  const char *base = strrchr(rf->url, '/');
  base = base ? base + 1 : rf->url;
  size_t n = strcspn(base, "?#");
  char clean[96];
  size_t k = 0;
  for (size_t i = 0; i < n && k < sizeof clean - 1; i++)
    clean[k++] = (base[i] == '.' || base[i] == '-' || base[i] == '_' || (base[i] >= '0' && base[i] <= '9') ||
                  (base[i] >= 'a' && base[i] <= 'z') || (base[i] >= 'A' && base[i] <= 'Z'))
                     ? base[i]
                     : '_';
  clean[k] = 0;
  snprintf(out, cap, "%016" PRIx64 "-%s", rf->version, clean);
}

static bool is_part(const char *name) {
  size_t n = strlen(name);
  return n > 5 && !strcmp(name + n - 5, ".part");
}

typedef struct item {
  char name[128];
  int64_t size;
  struct timespec mtime;
  bool part;
} item;

static int by_age(const void *a, const void *b) {
  const item *x = a, *y = b;
  if (x->part != y->part)
    return x->part ? -1 : 1; /* abandoned downloads go first */
  if (x->mtime.tv_sec != y->mtime.tv_sec)
    return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
  return (x->mtime.tv_nsec > y->mtime.tv_nsec) - (x->mtime.tv_nsec < y->mtime.tv_nsec);
}

/* The folder's entries (and their bytes in *USED); the caller frees *OUT. Folder lock held. */
static int list(const dl__shard_dir *d, item **out, size_t *n, int64_t *used) {
  *out = NULL;
  *n = 0;
  *used = 0;
  int fd = dup(d->dirfd);
  DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
  if (!dir) {
    if (fd >= 0)
      close(fd);
    return -errno;
  }
  rewinddir(dir);
  size_t cap = 0;
  struct dirent *e;
  while ((e = readdir(dir))) {
    struct stat st;
    if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof((item *)0)->name ||
        fstatat(d->dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
      continue;
    if (*n == cap) {
      item *grown = realloc(*out, (cap = cap ? 2 * cap : 64) * sizeof *grown);
      if (!grown) {
        closedir(dir);
        return -ENOMEM;
      }
      *out = grown;
    }
    item *it = &(*out)[(*n)++];
    snprintf(it->name, sizeof it->name, "%s", e->d_name);
    it->size = (int64_t)st.st_size;
    it->mtime = st.st_mtim;
    it->part = is_part(e->d_name);
    *used += it->size;
  }
  closedir(dir);
  return 0;
}

/* Frees room for NEED more bytes by removing what nobody holds, oldest first. Folder lock held. */
static int make_room(const dl__shard_dir *d, int64_t need) {
  item *items;
  size_t n;
  int64_t used;
  int r = list(d, &items, &n, &used);
  if (r)
    return r;
  if (n)
    qsort(items, n, sizeof *items, by_age);
  for (size_t i = 0; i < n; i++) {
    if (used + need <= d->limit && !items[i].part)
      break;
    int fd = openat(d->dirfd, items[i].name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
      continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && unlinkat(d->dirfd, items[i].name, 0) == 0) {
      used -= items[i].size;
      dl__log(DL__LOG_DEBUG, "shard cache %s: removed %s (%s)", d->path, items[i].name,
              items[i].part ? "an abandoned download" : "least recently used");
    }
    close(fd);
  }
  free(items);
  return used + need <= d->limit ? 0 : -ENOSPC;
}

/* The folder's lock, held while sizes are counted and entries evicted: an open of its own each
 * time, because flock excludes open files, not threads, and the fetchers of one loader share D. */
static int lock_folder(const dl__shard_dir *d) {
  int fd = openat(d->dirfd, ".lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return -errno;
  flock(fd, LOCK_EX);
  return fd;
}

static void unlock_folder(int fd) { close(fd); }

int dl__shard_dir_open(const dl__options *o, dl__shard_dir *d) {
  memset(d, 0, sizeof *d);
  d->dirfd = -1;
  snprintf(d->path, sizeof d->path, "%s", o->cache_dir);
  int made = dl__mkdirs(o->cache_dir); /* with the folders above it, as `mkdir -p` would */
  if (made)
    return dl__fail(made, "cache_dir=%s: cannot create it: %s", o->cache_dir, strerror(-made));
  d->dirfd = open(o->cache_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int lock = d->dirfd >= 0 ? lock_folder(d) : -errno;
  if (lock < 0) {
    dl__shard_dir_close(d);
    return dl__fail(lock, "cache_dir=%s: %s", o->cache_dir, strerror(-lock));
  }
  d->limit = o->cache_limit;
  if (!d->limit) { /* what the disk has free now, less a tenth, plus what the cache holds */
    struct statvfs v;
    item *items = NULL;
    size_t n;
    int64_t used = 0;
    list(d, &items, &n, &used);
    free(items);
    d->limit = used + (fstatvfs(d->dirfd, &v) ? 0 : (int64_t)((double)v.f_bavail * (double)v.f_frsize * 0.9));
  }
  unlock_folder(lock);
  return 0;
}

void dl__shard_dir_close(dl__shard_dir *d) {
  if (d->dirfd >= 0)
    close(d->dirfd);
  d->dirfd = -1;
}

/* The size of an entry known only once it is made (an uncompressed copy). */
#define SIZE_UNKNOWN UINT64_MAX

/* NAME's whole copy, read-locked and marked as just used. */
static int open_entry(const dl__shard_dir *d, const char *name, uint64_t size) {
  int fd = openat(d->dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return -errno;
  struct stat st;
  int r = flock(fd, LOCK_SH | LOCK_NB) ? -EBUSY /* its writer is just done, or it is being removed */
          : fstat(fd, &st) || (size != SIZE_UNKNOWN && (uint64_t)st.st_size != size)
              ? -ESTALE /* not what it must be: fetched again */
                                                            : 0;
  if (r) {
    close(fd);
    return r;
  }
  futimens(fd, NULL);
  return fd;
}

/* Whether FD is the file NAME in the folder now. */
static bool is_named(const dl__shard_dir *d, const char *name, int fd) {
  struct stat a, b;
  return !fstat(fd, &a) && !fstatat(d->dirfd, name, &b, AT_SYMLINK_NOFOLLOW) && a.st_ino == b.st_ino &&
         a.st_dev == b.st_dev;
}

/* Under the folder's lock: room for NEED more bytes, what nobody holds evicted oldest first, then
 * FD grown to SIZE (sparse) so that other processes count it; SIZE_UNKNOWN leaves it as it is. */
static int reserve(const dl__shard_dir *d, int fd, int64_t need, uint64_t size) {
  int lock = lock_folder(d);
  int r = lock < 0 ? lock : make_room(d, need);
  if (!r && size != SIZE_UNKNOWN && ftruncate(fd, (off_t)size))
    r = -errno;
  if (lock >= 0)
    unlock_folder(lock);
  return r;
}

/* How an entry's bytes are written: into FD, which is already SIZE bytes long (sparse). */
typedef struct writer {
  int (*write)(int fd, void *arg);
  void *arg;
  const char *what; /* the entry's source, in messages */
} writer;

/* Entry NAME (SIZE bytes) written by W into NAME.part, then renamed: its read-locked descriptor.
 * *WROTE says whether W wrote it here: another process may have finished it meanwhile. */
static int fill(dl__shard_dir *d, const char *name, uint64_t size, const writer *w, bool *wrote) {
  char part[160];
  snprintf(part, sizeof part, "%s.part", name);
  *wrote = false;
  int fd = openat(d->dirfd, part, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0)
    return dl__fail(-errno, "shard cache %s: cannot create %s: %s", d->path, part, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) || !is_named(d, part, fd)) {
    close(fd);
    return -EBUSY; /* another process writes it (or just finished) */
  }
  int r = open_entry(d, name, size); /* finished by another process meanwhile */
  if (r >= 0 || r == -EBUSY) {
    unlinkat(d->dirfd, part, 0);
    close(fd);
    return r; /* the copy, or one held for a moment by its writer or an eviction: look again */
  }
  /* Room made for it before it is written, or, its size unknown, once written (its .part is then
   * among the entries counted). */
  bool unsized = size == SIZE_UNKNOWN;
  r = ftruncate(fd, 0) ? -errno : reserve(d, fd, unsized ? 0 : (int64_t)size, size);
  bool room = r != 0; /* what failed was making room (the writer's errors have their message) */
  if (!r && (r = w->write(fd, w->arg)) == 0 && fdatasync(fd))
    r = dl__fail(-errno, "shard cache %s: cannot write %s: %s", d->path, w->what, strerror(errno));
  if (!r && unsized)
    room = (r = reserve(d, fd, 0, size)) != 0;
  if (r == -ENOSPC) {
    unlinkat(d->dirfd, part, 0);
    close(fd);
    return -ENOSPC;
  }
  if (room)
    r = dl__fail(r, "shard cache %s: cannot make room for %s: %s", d->path, w->what, strerror(-r));
  /* Renamed while still locked exclusively: no process sees it whole but unlocked. */
  if (!r && renameat(d->dirfd, part, d->dirfd, name))
    r = dl__fail(-errno, "shard cache %s: cannot store %s: %s", d->path, w->what, strerror(errno));
  if (r) {
    unlinkat(d->dirfd, part, 0);
    close(fd);
    return r;
  }
  flock(fd, LOCK_SH);
  *wrote = true;
  return fd;
}

typedef struct download_job {
  const dl__options *o;
  const dl__target *t;
  uint64_t size;
  const _Atomic int *cancel;
} download_job;

static int download(int fd, void *arg) {
  const download_job *j = arg;
  return dl__http_download(j->o, j->t, fd, j->size, j->cancel);
}

int dl__shard_dir_get(dl__shard_dir *d, const dl__dataset *ds, uint32_t f, const dl__options *o, bool fetch,
                      const _Atomic int *cancel, bool *fetched) {
  char name[128];
  entry_name(&ds->remote[f], name, sizeof name);
  *fetched = false;
  int fd = open_entry(d, name, ds->remote[f].size);
  if (fd >= 0 || fd == -EBUSY || !fetch)
    return fd;
  const dl__remote_file *rf = &ds->remote[f];
  if ((int64_t)rf->size > d->limit)
    return -ENOSPC;
  dl__target t = {ds->files[f], rf->url, ds->s3, rf->headers};
  download_job j = {o, &t, rf->size, cancel};
  return fill(d, name, rf->size, &(writer){download, &j, t.name}, fetched);
}

/* A copy that dl__shard_cache_keep or dl__shard_cache_keep_unsized makes: MADE writes it (with the most it may
 * write where its size is unknown). */
typedef struct keep_job {
  int (*sized)(int fd, void *arg);
  int (*unsized)(int fd, uint64_t most, void *arg);
  void *arg;
  uint64_t most;
} keep_job;

static int keep_write(int fd, void *arg) {
  const keep_job *j = arg;
  return j->sized ? j->sized(fd, j->arg) : j->unsized(fd, j->most, j->arg);
}

/* The entry of URL's VERSION, SIZE bytes (or SIZE_UNKNOWN): found in the folder, or made by J. */
static int keep(const dl__options *o, const char *url, uint64_t version, uint64_t size, keep_job *j) {
  dl__shard_dir d;
  int rc = dl__shard_dir_open(o, &d);
  if (rc)
    return rc;
  char name[128];
  entry_name(&(dl__remote_file){.url = (char *)url, .version = version}, name, sizeof name);
  int fd = open_entry(&d, name, size);
  j->most = d.limit > 0 ? (uint64_t)d.limit : 0;
  if ((fd == -ENOENT || fd == -ESTALE) && size != SIZE_UNKNOWN && (int64_t)size > d.limit)
    fd = -ENOSPC;
  else if (fd == -ENOENT || fd == -ESTALE)
    fd = fill(&d, name, size, &(writer){keep_write, j, url}, &(bool){false});
  dl__shard_dir_close(&d);
  return fd;
}

int dl__shard_cache_keep(const dl__options *o, const char *url, uint64_t version, uint64_t size,
                   int (*make)(int fd, void *arg), void *arg) {
  return keep(o, url, version, size, &(keep_job){.sized = make, .arg = arg});
}

int dl__shard_cache_keep_unsized(const dl__options *o, const char *name, uint64_t version,
                           int (*make)(int fd, uint64_t most, void *arg), void *arg) {
  return keep(o, name, version, SIZE_UNKNOWN, &(keep_job){.unsized = make, .arg = arg});
}

/* ---- a loader's fetchers ---- */

enum { ABSENT, FETCHING, CACHED, FAILED };

typedef struct shard {
  int fd;   /* while CACHED */
  int refs; /* reads in flight on fd */
  uint8_t state;
  bool wanted;
  int64_t retry_at_ms;
  int64_t looked_at_ms; /* a worker last looked for its copy in the folder (dl__shard_cache_take) */
} shard;

struct dl__shard_cache {
  const dl__io_env *env;
  dl__upcoming up;
  dl__shard_dir dir;
  const dl__io_ops *io; /* reads of cached copies */
  pthread_mutex_t mu;   /* lock order: mu, then whatever up.position takes (the loader's mu) */
  pthread_cond_t cv;
  shard *s;
  uint32_t *plan, nplan; /* the wanted shards in the order the next batches need them */
  int64_t planned_at;    /* the claim position the plan was made at */
  int64_t budget;        /* while planning: bytes the limit still holds */
  bool stop;
  pthread_t threads[FETCHERS];
  int nthreads;
};

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* A sample of the next batches lies in FILE: its shard is wanted, if the limit still holds it. */
static void want(void *ctx, uint32_t f) {
  struct dl__shard_cache *c = ctx;
  const dl__dataset *ds = c->env->ds;
  if (c->s[f].wanted || (int64_t)ds->remote[f].size > c->budget)
    return;
  c->s[f].wanted = true;
  c->budget -= (int64_t)ds->remote[f].size;
  c->plan[c->nplan++] = f;
}

/* Marks the shards the next batches need, in order, as many as the limit holds (c->mu held). */
static void plan(struct dl__shard_cache *c) {
  int64_t position = c->up.position(c->up.arg);
  if (c->nplan && position == c->planned_at)
    return;
  c->planned_at = position;
  for (uint32_t f = 0; f < c->env->ds->nfiles; f++)
    c->s[f].wanted = false;
  c->nplan = 0;
  c->budget = c->dir.limit;
  c->up.files(c->up.arg, LOOKAHEAD_SAMPLES, want, c);
}

/* Copies no batch ahead needs go back to the folder, where they may be evicted (c->mu held). */
static void release_unwanted(struct dl__shard_cache *c) {
  for (uint32_t f = 0; f < c->env->ds->nfiles; f++) {
    shard *s = &c->s[f];
    if (s->state == CACHED && !s->wanted && s->refs == 0) {
      close(s->fd);
      s->fd = -1;
      s->state = ABSENT;
    }
  }
}

static void *fetch_loop(void *arg) {
  struct dl__shard_cache *c = arg;
  pthread_setname_np(pthread_self(), "rf-fetch");
  const dl__io_env *env = c->env;
  pthread_mutex_lock(&c->mu);
  while (!c->stop) {
    plan(c);
    release_unwanted(c);
    int64_t now = now_ms(), f = -1;
    for (uint32_t i = 0; i < c->nplan && f < 0; i++) {
      shard *s = &c->s[c->plan[i]];
      if (s->state == ABSENT && s->retry_at_ms <= now)
        f = c->plan[i];
    }
    if (f < 0) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += 20 * 1000000;
      if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&c->cv, &c->mu, &until);
      continue;
    }
    shard *s = &c->s[f];
    s->state = FETCHING;
    pthread_mutex_unlock(&c->mu);
    bool fetched;
    int fd = dl__shard_dir_get(&c->dir, env->ds, (uint32_t)f, env->o, true, env->cancel, &fetched);
    if (fetched) {
      atomic_fetch_add_explicit(&env->counts->cache_fetches, 1, memory_order_relaxed);
      atomic_fetch_add_explicit(&env->counts->cache_fetch_bytes, (int64_t)env->ds->remote[f].size,
                                memory_order_relaxed);
    }
    pthread_mutex_lock(&c->mu);
    s->state = ABSENT;
    if (fd >= 0) {
      s->fd = fd;
      s->state = CACHED;
    } else if (fd == -EBUSY || fd == -ENOSPC) {
      s->retry_at_ms = now_ms() + (fd == -EBUSY ? 50 : 250); /* another process fetches it; or full */
    } else if (fd != DL_ECLOSED) {
      s->state = FAILED;
      dl__log(DL__LOG_WARN, "%s; its samples are read with ranged GETs", dl_last_error());
    }
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

int dl__shard_cache_take(struct dl__shard_cache *c, uint32_t file) {
  pthread_mutex_lock(&c->mu);
  shard *s = &c->s[file];
  /* A whole copy in the folder that no fetcher has opened: not planned yet, or let go when no batch
   * ahead needed it. Opening it here (a lookup, no download) spares the ranged GET a worker would
   * otherwise make before a fetcher comes round to it. A shard with no copy is looked for again
   * only every 20 ms, as often as the fetchers look: not once per sample. */
  int64_t now = s->state == ABSENT ? now_ms() : 0;
  if (s->state == ABSENT && now - s->looked_at_ms >= 20) {
    s->looked_at_ms = now;
    bool fetched;
    int fd = dl__shard_dir_get(&c->dir, c->env->ds, file, c->env->o, false, NULL, &fetched);
    if (fd >= 0) {
      s->fd = fd;
      s->state = CACHED;
    }
  }
  int fd = s->state == CACHED ? s->fd : -1;
  if (fd >= 0)
    s->refs++;
  pthread_mutex_unlock(&c->mu);
  return fd;
}

void dl__shard_cache_put(struct dl__shard_cache *c, uint32_t file) {
  pthread_mutex_lock(&c->mu);
  c->s[file].refs--;
  pthread_mutex_unlock(&c->mu);
}

const dl__io_ops *dl__shard_cache_io(const struct dl__shard_cache *c) { return c->io; }

void dl__shard_cache_stop(struct dl__shard_cache **cp) {
  struct dl__shard_cache *c = *cp;
  if (!c)
    return;
  atomic_store_explicit(c->env->cancel, 1, memory_order_relaxed); /* downloads in flight give up */
  pthread_mutex_lock(&c->mu);
  c->stop = true;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  for (int i = 0; i < c->nthreads; i++)
    pthread_join(c->threads[i], NULL);
  for (uint32_t f = 0; c->s && f < c->env->ds->nfiles; f++)
    if (c->s[f].state == CACHED)
      close(c->s[f].fd);
  dl__shard_dir_close(&c->dir);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c->s);
  free(c->plan);
  free(c);
  *cp = NULL;
}

int dl__shard_cache_start(const dl__io_env *env, bool remote, const dl__upcoming *up, struct dl__shard_cache **out) {
  const dl__options *o = env->o;
  const dl__dataset *ds = env->ds;
  *out = NULL;
  if (!o->cache_dir[0])
    return 0;
  if (!remote) {
    if (!ds->unpacked)
      return dl__fail(DL_EOPTION, "option cache_dir keeps remote shards (and uncompressed copies of compressed "
                      "MDS and tar shards); the source is on local disk, uncompressed");
    dl__log(DL__LOG_INFO, "cache_dir %s: holds the uncompressed copies of this source's compressed shards, made at "
            "open; every sample is read from them", o->cache_dir);
    return 0;
  }
  struct dl__shard_cache *c = calloc(1, sizeof *c);
  if (!c)
    return dl__fail(-ENOMEM, "out of memory");
  c->env = env;
  c->up = *up;
  c->dir.dirfd = -1;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  *out = c;
  c->s = calloc(ds->nfiles, sizeof *c->s);
  c->plan = calloc(ds->nfiles, sizeof *c->plan);
  if (!c->s || !c->plan) {
    dl__shard_cache_stop(out);
    return dl__fail(-ENOMEM, "out of memory");
  }
  for (uint32_t f = 0; f < ds->nfiles; f++)
    c->s[f].fd = -1;
  char reason[128];
  int err;
  c->io = dl__io_choose(DL__IO_AUTO, reason, sizeof reason, &err);
  int r = err ? err : dl__shard_dir_open(o, &c->dir);
  if (!r) { /* copies already in the folder serve the first batches */
    pthread_mutex_lock(&c->mu);
    plan(c);
    for (uint32_t i = 0; i < c->nplan; i++) {
      bool fetched;
      int fd = dl__shard_dir_get(&c->dir, ds, c->plan[i], o, false, NULL, &fetched);
      if (fd >= 0) {
        c->s[c->plan[i]].fd = fd;
        c->s[c->plan[i]].state = CACHED;
      }
    }
    pthread_mutex_unlock(&c->mu);
  }
  for (int i = 0; !r && i < FETCHERS && (uint32_t)i < ds->nfiles; i++) {
    if ((r = -pthread_create(&c->threads[i], NULL, fetch_loop, c)))
      r = dl__fail(r, "could not start the shard cache's fetchers: %s", strerror(-r));
    else
      c->nthreads++;
  }
  if (r) {
    dl__shard_cache_stop(out);
    return r;
  }
  dl__log(DL__LOG_INFO, "shard cache %s: up to %.1f GB, cached shards read with %s", c->dir.path,
          (double)c->dir.limit / 1e9, c->io->name);
  uint32_t over = 0, largest = 0; /* shards that never fit: read in place all run long, which is said */
  for (uint32_t f = 0; f < ds->nremote; f++) {
    if ((int64_t)ds->remote[f].size <= c->dir.limit)
      continue;
    if (!over++ || ds->remote[f].size > ds->remote[largest].size)
      largest = f;
  }
  if (over)
    dl__log(DL__LOG_WARN, "shard cache %s: %u shard%s larger than its %.0f MB (%s, %.0f MB%s) %s read in "
            "place with ranged GETs, never cached: raise cache_limit", c->dir.path, over,
            over == 1 ? "" : "s", (double)c->dir.limit / 1e6, ds->files[largest],
            (double)ds->remote[largest].size / 1e6, over == 1 ? "" : ", the largest",
            over == 1 ? "is" : "are");
  return 0;
}
