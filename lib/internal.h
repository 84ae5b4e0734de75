/*
 * What every stage of the library shares: errors and the log, time, counter-based randomness,
 * grow-only buffers and the sample table. Each stage adds its own header beside its files (see
 * docs/ARCHITECTURE.md); names shared across files are dl__*, everything else in a .c file is
 * static.
 */
#ifndef RINGFEED_INTERNAL_H
#define RINGFEED_INTERNAL_H

#define DL_BUILDING_LIBRARY 1
#include "ringfeed.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#define DL__ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define DL__MAX_DEVICES 16
#define DL__MSG_MAX 1024

/* ---- errors and logging (util/error.c) ---- */

enum { DL__LOG_QUIET, DL__LOG_ERROR, DL__LOG_WARN, DL__LOG_INFO, DL__LOG_DEBUG };
extern int dl__log_level;

/* Sets the calling thread's last-error message and returns CODE. */
int dl__fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dl__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* On this thread, dl__log counts its messages of info level and above in *HELD instead of writing
 * them (NULL: writes again): for work done ahead, whose messages the work proper says later. */
void dl__log_hold(unsigned *held);
/* Whether NAME is nearer than *LEAST edits (which it lowers) to what a user TYPED and near enough
 * to suggest ("did you mean NAME?"): within two letters added, left out, changed or swapped, and
 * a third of NAME's length; case, and '-' for '_', are free. Start *LEAST at DL__NEAR_EDITS. */
#define DL__NEAR_EDITS 3
bool dl__nearer(const char *typed, const char *name, int *least);

/* A per-sample error: the code and a message with shard, member, offset and reason. */
typedef struct dl__err {
  int code;
  char msg[DL__MSG_MAX];
} dl__err;

int dl__err_set(dl__err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Puts context before E's message ("field x: " + message); returns E's code. */
int dl__err_prefix(dl__err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* MSG with the user names and passwords of the URLs in it taken out, in place. */
void dl__without_credentials(char *msg);

/* A * B into *OUT, or false when it overflows: every size derived from a file goes through it. */
static inline bool dl__mul_ok(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }
/* A little-endian uint32 at P (the formats of other writers: MDS shards and their values). */
static inline uint32_t dl__le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- time ---- */

/* Seconds on the monotonic clock: every duration the stats and the policies measure. */
static inline double dl__now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* ---- counter-based randomness (rng.h-style helpers) ---- */

static inline uint64_t dl__mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline uint64_t dl__hash3(uint64_t a, uint64_t b, uint64_t c) {
  return dl__mix64(dl__mix64(dl__mix64(a) ^ b) ^ c);
}
/* Uniform double in [0, 1) from a key and a draw number. */
static inline double dl__uniform(uint64_t key, uint64_t draw) {
  return (double)(dl__mix64(key ^ dl__mix64(draw)) >> 11) * 0x1.0p-53;
}

/* ---- grow-only buffers (util/buf.c) ---- */

typedef struct dl__buf {
  uint8_t *p;
  size_t cap;
} dl__buf;
/* Grows B to at least N bytes (grow-only, so steady state allocates nothing). */
int dl__buf_reserve(dl__buf *b, size_t n);
/* The same, for O_DIRECT: the memory is aligned to ALIGN (contents are not kept on growth). */
int dl__buf_reserve_aligned(dl__buf *b, size_t n, size_t align);
void dl__buf_free(dl__buf *b);

/* ---- the sample table (built by source/, read by every later stage) ---- */

/* SCAN_CLEAN: the shard's writer read its JPEG's codes through without complaint (an .rfs field's
 * byte 3), and its checksum vouches for the bytes. */
enum { DL__SAMPLE_CHECKSUM = 1, DL__SAMPLE_IMAGE_ZST = 2, DL__SAMPLE_SCAN_CLEAN = 4 };

/* A field of a sample, within the bytes a worker reads for it: a tensor, or a member's bytes as
 * they are (captions, JSON, anything else a WebDataset sample holds). */
enum { DL__REF_NPY, DL__REF_NPY_ZST, DL__REF_TOKENS, DL__REF_BYTES, DL__REF_MDS };
/* What a bytes field holds, where its source says (MDS columns); else its name's extension does. */
enum { DL__BYTES_BY_NAME, DL__BYTES_TEXT, DL__BYTES_JSON, DL__BYTES_RAW };
typedef struct dl__fref {
  uint16_t name; /* index into dl__dataset.field_names */
  uint8_t kind;
  uint32_t at, len;
} dl__fref;
#define DL__MAX_FIELDS 16
/* The most pieces one read of a sample is split into: each tensor payload and what lies around it. */
#define DL__MAX_IOV (2 * DL__MAX_FIELDS + 1)

typedef struct dl__sample {
  uint64_t offset; /* of the bytes a worker reads: a tar member's data, or a whole .rfs record */
  uint64_t size;
  uint64_t checksum; /* dl__rfs_checksum of those bytes, when flags has DL__SAMPLE_CHECKSUM */
  uint32_t image_at, image_len; /* the image's bytes within them */
  int64_t label;   /* -1: no .cls member */
  uint32_t file;   /* index into dl__dataset.files */
  uint32_t name;   /* string pool offset: the image member's name (the key when there is none) */
  uint32_t key;    /* string pool offset: the sample's key */
  uint32_t first_ref; /* its tensor fields: refs[first_ref .. first_ref + nrefs) */
  uint8_t nrefs;
  uint8_t codec;   /* of its image: DL__CODEC_* (decode/decode.h) */
  uint8_t flags;
} dl__sample;

/* A remote shard: where it is requested, its size, and its version (a hash of URL, size and
 * ETag) that names its copy in the shard cache. */
typedef struct dl__remote_file {
  char *url;
  uint64_t size, version;
  void *headers; /* its requests' headers (a curl_slist): If-Match with the ETag indexed, S3's */
} dl__remote_file;

typedef struct dl__dataset {
  char **files;
  uint32_t nfiles, files_cap;
  int *fds;       /* per file, -1 when files are opened per read (ImageFolder) */
  uint32_t *direct; /* per file: O_DIRECT alignment of fds[i], 0 for buffered reads */
  const uint8_t **maps; /* with io=mmap: each kept-open file mapped whole (NULL: read it) */
  uint64_t *map_len;
  _Atomic int *map_changed; /* per file: shrank under its mapping (a SIGBUS was caught); read it */
  dl__sample *samples;
  size_t n, cap;
  char *pool;
  size_t pool_len, pool_cap;
  dl__fref *refs;
  size_t nrefs, refs_cap;
  char *field_names[DL__MAX_FIELDS];
  int nfield_names;
  uint8_t bytes_kind[DL__MAX_FIELDS]; /* DL__BYTES_* per field name */
  struct dl__mds_spec *mds;           /* per field name: how its DL__REF_MDS values are stored, or NULL */
  struct dl__remote_file *remote; /* per file, for remote sources (else NULL) */
  uint32_t nremote;               /* its entries: files after the last remote one have none */
  void *s3;     /* the S3 addressing and credentials of s3:// files (remote/s3.c), or NULL */
  void *hub;    /* the Hugging Face Hub's endpoint and token (remote/hub.c), or NULL */
  int64_t cache_fetches, cache_fetch_bytes; /* remote tars downloaded into the shard cache to index them */
  char skipped_shard[DL__MSG_MAX]; /* the first shard skipped whole, and why: "no samples" says it */
  uint64_t left_out; /* samples an MDS index lists but whose records are damaged (on_error=skip) */
  uint32_t unpacked; /* compressed MDS and tar shards read from uncompressed copies made at open */
  uint32_t unpacked_temp; /* of them, tar shards copied into temporary files, which every open makes */
  uint64_t unpacked_temp_bytes;
  double unpacked_temp_s;
  int64_t *part_first; /* where each "::" part of the source starts in samples (nparts + 1) */
  uint32_t nparts;
  struct dl__declared *declared; /* the distinct column sets of shards that declare theirs */
  uint32_t ndeclared;
  /* Files not named by their descriptor (an ImageFolder's, opened per read; the local copy of a
   * remote compressed shard): the identities they had at open, folded in by dl__dataset_file_named,
   * which name the GPU check's kept verdicts. */
  uint64_t seen_hash;
  uint32_t nseen;
  /* An ImageFolder's class folders, sorted (a label is an index): kept when every sample of the
   * source came from folders with these classes (dl_class_name), else none. */
  char **classes;
  uint32_t nclasses;
  bool classes_differ;
  size_t class_samples; /* the samples such folders gave */
} dl__dataset;

/* Shards whose samples all have the fields their index declares (an MDS shard's columns): a
 * tensor field or an image that such a shard lacks would fail every one of its samples, so the
 * open refuses it instead (dl__fields_schema). One entry per distinct set, naming its first shard. */
typedef struct dl__declared {
  char *shard;     /* as messages name it */
  uint32_t fields; /* bit F: holds field name F */
  bool image;
} dl__declared;

/* What a shard's cached index is checked against: its size and times, its inode (a file replaced
 * by rename has another), and a hash of its first and last 4 KiB. DATA_SIZE, where not 0, is the
 * size of what its samples are read from instead (a compressed shard's uncompressed copy). */
typedef struct dl__shard_id {
  uint64_t size, ino, edges;
  int64_t mtime_ns, ctime_ns;
  uint64_t data_size;
} dl__shard_id;

static inline const char *dl__sample_name(const dl__dataset *ds, const dl__sample *s) {
  return ds->pool + s->name;
}

#endif /* RINGFEED_INTERNAL_H */
