/*
 * The io stage (io/): reading samples' bytes. Each worker keeps many reads in flight through one
 * backend behind dl__io_ops: io_uring, blocking pread, ranged GETs for remote shards (which read
 * the copies the shard cache keeps through a local backend); io=mmap reads mapped files in place.
 * The shard cache (cache_dir=) is a folder of whole remote shards and uncompressed copies, shared
 * by processes. It calls remote/, util/ and internal.h; the loader hands it what it needs in a
 * dl__io_env.
 *
 * To add a backend: a file io/NAME.c that defines `const dl__io_ops dl__io_NAME_ops`, declared
 * here, and its row in dl__io_choose (io/choose.c).
 */
#ifndef RINGFEED_IO_H
#define RINGFEED_IO_H

#include "internal.h"
#include "options.h"
#include "remote/remote.h"
#include "util/util.h"

/* Reads that failed in a row for the storage's sake (local reads with an I/O error, requests that
 * failed after every retry): at this many the storage is down, and a sample it fails is the run's
 * error whatever on_error says. */
#define DL__STORAGE_DOWN 32

/* What the io stage counts for the stats (relaxed atomics: counters only, read once a run). */
typedef struct dl__io_counts {
  _Atomic int64_t requests, retries;                /* remote sources: GETs, and retries among them */
  _Atomic int64_t cache_hits;                       /* remote samples read from the shard cache */
  _Atomic int64_t cache_fetches, cache_fetch_bytes; /* shards the cache downloaded */
} dl__io_counts;

/* What a reader needs of its loader, set once at open. */
typedef struct dl__io_env {
  const dl__dataset *ds;
  const dl__options *o;
  struct dl__shard_cache *cache; /* cache_dir= over remote shards, else NULL */
  _Atomic int *cancel;           /* set as the loader stops: reads and downloads in flight give up */
  _Atomic int *read_failures;    /* in a row; DL__STORAGE_DOWN ends the run */
  dl__io_counts *counts;
} dl__io_env;

typedef struct dl__io dl__io;
typedef struct dl__io_ops {
  const char *name;
  int (*init)(dl__io *io, unsigned depth);
  void (*fini)(dl__io *io);
  /* Queues a read of LEN bytes at OFF into BUF; TAG comes back with the completion. */
  int (*submit)(dl__io *io, int fd, void *buf, size_t len, uint64_t off, uint64_t tag);
  /* Waits for one completion: bytes read or -errno in *RES. */
  int (*wait)(dl__io *io, uint64_t *tag, int64_t *res);
  /* The same without blocking: -EAGAIN when nothing has completed. */
  int (*peek)(dl__io *io, uint64_t *tag, int64_t *res);
  /* A descriptor that polls readable when a completion may be ready, or -1 (NULL: none). */
  int (*poll_fd)(dl__io *io);
  /* Queues a read of the bytes at OFF into the N pieces of IOV, in order (NULL: not offered). */
  int (*submitv)(dl__io *io, int fd, const struct iovec *iov, int n, uint64_t off, uint64_t tag);
} dl__io_ops;

struct dl__io {
  const dl__io_ops *ops;
  void *state;
  const dl__io_env *env;   /* the reading loader's files, options, counters and close */
  char why[DL__MSG_MAX];   /* a backend's message for the read it just completed with an error */
};

extern const dl__io_ops dl__io_pread_ops;
extern const dl__io_ops dl__io_uring_ops; /* init fails with -ENOSYS when built without */
/* Remote files (io/http.c): ranged GETs; a submitted read's "fd" is the file's index. */
extern const dl__io_ops dl__io_http_ops;
/* Chooses the backend for local files for MODE (DL__IO_*) once; writes why into REASON. */
const dl__io_ops *dl__io_choose(int mode, char *reason, size_t cap, int *err);

/* ---- io=mmap (io/mmap.c) ---- */
/* Maps every kept-open file, so workers read samples in place, and catches the SIGBUS of a file
 * that shrinks under its mapping (the handler of SIGBUS is chained, installed once). */
int dl__dataset_map(dl__dataset *ds);
void dl__dataset_unmap(dl__dataset *ds);
/* Whether FILE is read in place: mapped, and not changed under the mapping. */
bool dl__map_usable(const dl__dataset *ds, uint32_t file);
/* Around every read of FILE's mapping by this thread; leave returns true when the file shrank
 * meanwhile: bytes read may be zeros, and the read must be done again with pread. */
void dl__map_guard_enter(dl__dataset *ds, uint32_t file);
bool dl__map_guard_leave(dl__dataset *ds, uint32_t file);
/* ---- the shard cache (io/shard_cache.c) ---- */

/* The copy of the remote object URL (of VERSION) that MAKE writes into FD, SIZE bytes, kept in
 * cache_dir: a read-only descriptor holding a shared lock that keeps it from
 * eviction, found there or made now; -EBUSY while another process makes it, -ENOSPC when it does
 * not fit in cache_limit, or another error with its message. */
int dl__shard_cache_keep(const dl__options *o, const char *url, uint64_t version, uint64_t size,
                   int (*make)(int fd, void *arg), void *arg);
/* The same for a copy whose size is known only once made (a compressed tar's): MAKE writes at most
 * MOST bytes (cache_limit, or what the disk had free less a tenth), and -ENOSPC comes after it
 * when the cache cannot keep what it wrote. NAME names the copy's source (a path or URL). */
int dl__shard_cache_keep_unsized(const dl__options *o, const char *name, uint64_t version,
                           int (*make)(int fd, uint64_t most, void *arg), void *arg);
/* The shard cache's folder: entries named by shard version, locked while read. */
typedef struct dl__shard_dir {
  int dirfd;         /* the folder (its .lock is held while sizes are counted and entries evicted) */
  int64_t limit;     /* bytes its entries and downloads in progress may take */
  char path[512];
} dl__shard_dir;
int dl__shard_dir_open(const dl__options *o, dl__shard_dir *d);
void dl__shard_dir_close(dl__shard_dir *d);
/* A read-only descriptor of remote file F's whole copy, holding a shared lock that keeps it from
 * eviction: found in the folder, or with FETCH downloaded into it (*FETCHED set). -ENOENT when
 * absent (without FETCH), -EBUSY while another process downloads it or holds it for a moment (its
 * writer renaming it, an eviction), -ENOSPC when entries in use
 * fill the limit, or another error with its message. */
int dl__shard_dir_get(dl__shard_dir *d, const dl__dataset *ds, uint32_t f, const dl__options *o, bool fetch,
                      const _Atomic int *cancel, bool *fetched);
/* For one read: a descriptor of FILE's cached copy, or -1 when it is not cached (read it remotely);
 * each descriptor taken is given back with dl__shard_cache_put. */
int dl__shard_cache_take(struct dl__shard_cache *c, uint32_t file);
void dl__shard_cache_put(struct dl__shard_cache *c, uint32_t file);
/* The local backend that reads cached copies. */
const dl__io_ops *dl__shard_cache_io(const struct dl__shard_cache *c);


/* What the shard cache asks of its loader to fetch ahead: where the workers' claims are (a number
 * that changes whenever they move), and the files of the samples from there on, in the order the
 * batches need them, EACH called for every one of the next LIMIT samples. */
typedef struct dl__upcoming {
  int64_t (*position)(void *arg);
  void (*files)(void *arg, int64_t limit, void (*each)(void *ctx, uint32_t file), void *ctx);
  void *arg;
} dl__upcoming;

/* The shard cache of a loader with cache_dir= (REMOTE: its shards are remote, else it only keeps
 * uncompressed copies, made at open): its folder checked, copies already there opened, and fetch
 * threads started, which download what UP says comes next. *OUT stays NULL where there is none to
 * run. Stopped (downloads in flight abandoned: ENV's cancel set) and closed by _stop. */
int dl__shard_cache_start(const dl__io_env *env, bool remote, const dl__upcoming *up, struct dl__shard_cache **out);
void dl__shard_cache_stop(struct dl__shard_cache **c);

#endif /* RINGFEED_IO_H */
