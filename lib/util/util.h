/*
 * The utilities under every stage (util/): JSON from untrusted bytes, the record checksum, files
 * (full reads, regular files only, scratch files, the user's cache folder), read faults for tests,
 * and decompression. They call nothing of the library's but each other and internal.h.
 */
#ifndef RINGFEED_UTIL_H
#define RINGFEED_UTIL_H

#include "internal.h"

#include <string.h>

struct stat;

/* ---- JSON from untrusted bytes (util/json.c): P..END, never past END ---- */
const char *dl__json_space(const char *p, const char *end);
/* The string whose opening quote is at P into OUT, escapes undone ("" when it does not fit in
 * CAP): the position after its closing quote, or NULL when malformed. */
const char *dl__json_string(const char *p, const char *end, char *out, size_t cap);
/* Past the value at P, whatever it is; NULL when malformed. */
const char *dl__json_skip(const char *p, const char *end);
int dl__json_member(const char **p, const char *end, char *key, size_t cap);
int dl__json_element(const char **p, const char *end);
const char *dl__json_uint(const char *p, const char *end, uint64_t *v);
bool dl__json_null(const char *p, const char *end, const char **after);

/* The checksum of ringfeed shard records and indexes: XXH3-64, seed 0 (util/checksum.c). */
uint64_t dl__rfs_checksum(const void *p, size_t n);
/* The same checksum fed piece by piece; _copy also copies what it hashes, reading it once. */
typedef struct dl__hasher dl__hasher;
dl__hasher *dl__hasher_new(void);
void dl__hasher_free(dl__hasher *h);
void dl__hasher_reset(dl__hasher *h);
void dl__hasher_update(dl__hasher *h, const void *p, size_t n);
void dl__hasher_copy(dl__hasher *h, void *dst, const void *src, size_t n);
uint64_t dl__hasher_digest(dl__hasher *h);

/* ---- files (util/files.c) ---- */

/* Reads N bytes at OFF, through interrupted and short reads: the bytes read (fewer only at the end
 * of the file) or -errno. Every read goes through dl__io_fault. */
int64_t dl__pread_full(int fd, void *buf, size_t n, uint64_t off);
/* The same into the N pieces of IOV, in order (at most DL__MAX_IOV). */
int64_t dl__preadv_full(int fd, const struct iovec *iov, int n, uint64_t off);
/* Reads N bytes at OFF only as far as the page cache holds them, never waiting for the disk: N,
 * fewer, -EAGAIN (none cached) or another -errno (-EOPNOTSUPP: the file system cannot tell). */
int64_t dl__pread_cached(int fd, void *buf, size_t n, uint64_t off);
/* The pieces of IOV (N of them) that follow its first SKIP bytes, into REST; returns how many. */
int dl__iov_after(const struct iovec *iov, int n, size_t skip, struct iovec *rest);
/* Opens PATH for reading if it is a regular file, never blocking on a FIFO: the descriptor, or a
 * negative code with a message naming WHAT ("shard", "source tokens:") and PATH. ST gets its
 * metadata (may be NULL). */
int dl__open_regular(const char *path, const char *what, struct stat *st);
/* Why such a file is not read, in its messages and in an ImageFolder's list of what it left out. */
#define DL__NOT_REGULAR "not a regular file (a FIFO, device or socket)"
/* An unnamed file in $TMPDIR (gone when closed), SIZE bytes long (sparse); errors name FOR_WHAT. */
int dl__scratch_file(uint64_t size, const char *for_what);
/* mkdir -p. */
int dl__mkdirs(const char *dir);
/* The user's cache folder ($XDG_CACHE_HOME/ringfeed or ~/.cache/ringfeed) into BUF; -1 without one. */
int dl__user_cache_dir(char *buf, size_t cap);
/* A file of at least LEAST bytes read whole into *OUT (malloc'd); -1 when it is not there or
 * shorter. */
int dl__read_file(const char *path, size_t least, uint8_t **out, size_t *len);
/* LEN bytes written as TARGET whole or not at all (a temporary file renamed over it); -errno. */
int dl__write_file(const char *target, const uint8_t *p, size_t len);

/* Whether S names a remote object (http://, https://, s3://, hf://). */
static inline bool dl__is_url(const char *s) {
  return !strncmp(s, "http://", 7) || !strncmp(s, "https://", 8) || !strncmp(s, "s3://", 5) ||
         !strncmp(s, "hf://", 5);
}

/* ---- read faults for tests (util/fault.c) ---- */

/* Reads DL_IO_FAULTS once; dl__io_fault(RES) is the result a raw read of RES (bytes or -errno) is
 * to be taken as. */
void dl__io_faults_init(void);
int64_t dl__io_fault(int64_t res);

/* ---- decompression (util/inflate.c) ---- */

/* Whether COMPRESSION (as an MDS index names it: "zstd", "gz:6", "bz2") is read, and
 * file IN's compressed streams decompressed into FD from its start; they must come to exactly
 * EXPECT bytes, or where EXPECT is 0 to at most MOST (DL_ELIMIT past it); *SIZE (may be NULL) gets
 * what they came to. WHAT and NAME head the messages ("MDS shard", its path). */
bool dl__unpack_reads(const char *compression);
int dl__unpack(int in, const char *compression, uint64_t expect, uint64_t most, int fd, const char *what,
               const char *name, uint64_t *size);
/* Decompresses one zstd frame into OUT (at most LIMIT bytes, or DL_ELIMIT). */
int dl__zstd_inflate(void **ctx, const uint8_t *src, size_t n, size_t limit, dl__buf *out, size_t *len,
                     dl__err *e);

#endif /* RINGFEED_UTIL_H */
