/*
 * Private declarations shared between the library's files. Names shared across files are dl__*;
 * everything else in a .c file is static.
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

#define DL__ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define DL__MAX_DEVICES 16
#define DL__MSG_MAX 1024

/* ---- errors and logging (error.c) ---- */

enum { DL__LOG_QUIET, DL__LOG_ERROR, DL__LOG_WARN, DL__LOG_INFO, DL__LOG_DEBUG };
extern int dl__log_level;

/* Sets the calling thread's last-error message and returns CODE. */
int dl__fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dl__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

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

/* ---- options (options.c) ---- */

enum { DL__CROP_RANDOM_RESIZED, DL__CROP_CENTER, DL__CROP_RESIZE, DL__CROP_NONE };
enum { DL__LAYOUT_NHWC, DL__LAYOUT_NCHW };
enum { DL__DTYPE_UINT8, DL__DTYPE_FLOAT32, DL__DTYPE_FLOAT16, DL__DTYPE_BFLOAT16, DL__DTYPE_UINT16,
       DL__DTYPE_UINT32 };
enum { DL__ON_ERROR_SKIP, DL__ON_ERROR_FAIL };
enum { DL__IO_AUTO, DL__IO_URING, DL__IO_PREAD, DL__IO_MMAP };
enum { DL__DECODE_AUTO, DL__DECODE_CPU, DL__DECODE_GPU, DL__DECODE_HYBRID };

#define DL__MAX_PARTS 256 /* "::" parts of a source that repeat= can weigh */
#define DL__MAX_PATHS 1000000 /* the shards one pattern may name: braces expanded, or a listing's matches */

typedef struct dl__options {
  int batch_size;
  int workers;  /* 0: auto (dl_open chooses: choose_counts in loader.c) */
  int prefetch; /* 0: auto */
  int height, width;
  int crop;
  int flip;
  int channels;
  int layout;
  uint64_t seed;
  int shuffle;
  int64_t epochs; /* 0: forever */
  int64_t start_epoch; /* the run's first epoch (without a resume token) */
  int drop_last;
  int rank, world_size;
  int ndevices; /* 0: host batches */
  int device_ids[DL__MAX_DEVICES];
  int dtype;
  float mean[3], std[3]; /* on the 0..1 scale of pixels */
  bool mean_std_255;      /* ... given on the 0..255 scale, and divided by 255 */
  int device_slots;
  int on_error;
  int io;
  int io_depth;
  int64_t max_pixels;
  int64_t max_member_bytes;
  char resume[256];
  char fields[512]; /* fields=a,b: the only fields delivered (and read); empty: all */
  int retries;      /* remote sources: attempts after the first for a failing request */
  int timeout_ms;   /* remote sources: connecting, or a body that stops coming, for this long fails */
  char ca_file[512]; /* remote sources: a CA bundle for TLS (else the system's) */
  int shuffle_block; /* shuffle within blocks of this many shards (0: the whole dataset at once) */
  double repeat[DL__MAX_PARTS]; /* repeat=: times each "::" part of the source is seen an epoch */
  int nrepeat;                  /* values given (0: every part once) */
  char cache_dir[512]; /* remote sources: whole shards kept here (empty: no cache) */
  int64_t cache_limit; /* bytes the cache folder may hold */
  int64_t memory_budget; /* bytes the batch slots may take (prefetch=auto); 0: auto */
  int s3_addressing; /* DL__S3_*: path-style (endpoint/bucket/key) or virtual-hosted (bucket.host/key) */
  int log_level;
  int direct;
  int pad;
  int seq_len;
  int token_dtype; /* DL__DTYPE_UINT16/UINT32 for token sources */
  int decode;        /* DL__DECODE_*, as asked */
  int gpu_decode_mb; /* device memory per device for decoded JPEGs */
  double gpu_share;  /* hybrid: the GPU's fixed share of each batch; < 0 adapts it */
  int gpu_check;     /* a JPEG's entropy-coded data is read through on the CPU before its first GPU decode */
} dl__options;

enum { DL__S3_AUTO, DL__S3_PATH, DL__S3_VIRTUAL };

int dl__options_parse(dl__options *o, const char *text);

/* ---- JSON from untrusted bytes (json.c): P..END, never past END ---- */
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

/* ---- the sample table (dataset.c, tar.c, folder.c, source.c) ---- */

/* (Values are kept in cached indexes: new ones go last.) PIL: raw pixels of an MDS "pil" column. */
enum { DL__CODEC_NONE, DL__CODEC_JPEG, DL__CODEC_PNG, DL__CODEC_WEBP, DL__CODEC_OTHER, DL__CODEC_PIL };

enum { DL__SAMPLE_CHECKSUM = 1, DL__SAMPLE_IMAGE_ZST = 2 };

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
  uint8_t codec;
  uint8_t flags;
} dl__sample;

/* A remote shard: where it is requested, its size, and its version (a hash of URL, size and
 * ETag) that names its copy in the shard cache. */
#define DL__STORAGE_DOWN 32

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
} dl__dataset;

/* Shards whose samples all have the fields their index declares (an MDS shard's columns): a
 * tensor field or an image that such a shard lacks would fail every one of its samples, so the
 * open refuses it instead (dl__fields_schema). One entry per distinct set, naming its first shard. */
typedef struct dl__declared {
  char *shard;     /* as messages name it */
  uint32_t fields; /* bit F: holds field name F */
  bool image;
} dl__declared;
int dl__dataset_declare(dl__dataset *ds, const char *shard, uint32_t fields, bool image);

/* Index of field NAME (LEN bytes), added when new; -1 past DL__MAX_FIELDS names or on ENOMEM. */
int dl__dataset_field(dl__dataset *ds, const char *name, size_t len);
/* Why a field name of LEN bytes got no index from dl__dataset_field, for the warning naming it. */
const char *dl__field_refusal(const dl__dataset *ds, size_t len);
int dl__dataset_add_ref(dl__dataset *ds, const dl__fref *ref);

int dl__dataset_add_file(dl__dataset *ds, const char *path, uint32_t *index);
/* Opens PATH for reading if it is a regular file, never blocking on a FIFO: the descriptor, or a
 * negative code with a message naming WHAT ("shard", "source tokens:") and PATH. ST gets its
 * metadata (may be NULL). */
struct stat;
int dl__open_regular(const char *path, const char *what, struct stat *st);
/* Why such a file is not read, in its messages and in an ImageFolder's list of what it left out. */
#define DL__NOT_REGULAR "not a regular file (a FIFO, device or socket)"
/* An unnamed file in $TMPDIR (gone when closed), SIZE bytes long (sparse); errors name FOR_WHAT. */
int dl__scratch_file(uint64_t size, const char *for_what);
/* What a shard's cached index is checked against: its size and times, its inode (a file replaced
 * by rename has another), and a hash of its first and last 4 KiB. DATA_SIZE, where not 0, is the
 * size of what its samples are read from instead (a compressed shard's uncompressed copy). */
typedef struct dl__shard_id {
  uint64_t size, ino, edges;
  int64_t mtime_ns, ctime_ns;
  uint64_t data_size;
} dl__shard_id;
/* Adds PATH and opens it for the loader's life (ds->fds); its identity (ID may be NULL for the
 * size alone in *SIZE). */
int dl__dataset_open_file(dl__dataset *ds, const char *path, uint32_t *file, uint64_t *size, dl__shard_id *id);
/* ---- io=mmap (io_mmap.c) ---- */
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
/* mkdir -p. */
int dl__mkdirs(const char *dir);
uint32_t dl__dataset_intern(dl__dataset *ds, const char *s, size_t len);
int dl__dataset_push(dl__dataset *ds, const dl__sample *s);
void dl__dataset_free(dl__dataset *ds);
static inline const char *dl__sample_name(const dl__dataset *ds, const dl__sample *s) {
  return ds->pool + s->name;
}

/* Reads one tar shard's samples (through the cached index when it is valid); a compressed one
 * through an uncompressed copy (o->cache_dir). */
int dl__tar_load(dl__dataset *ds, const char *path, const dl__options *o);
/* For the tar shard PATH open as IN: where it is compressed (gzip, zstd, bzip2), a descriptor of its
 * uncompressed copy in *COPY (kept in o->cache_dir by ID's version where both are given, else a
 * temporary file) and its size; *COPY -1 where it is not. 1 when the copy holds only what came
 * before damage (o->on_error other than fail; dl_last_error says what), 0, or a negative code. */
int dl__tar_uncompressed(int in, const char *path, const dl__shard_id *id, const dl__options *o, int *copy,
                         uint64_t *size);
/* The compression ("gz", "zstd", "bz2", as inflate.c names it) of a file whose first N bytes are H,
 * or NULL: one that begins with a tar header is a tar, whatever its first member's name begins with. */
const char *dl__tar_compression(const uint8_t *h, size_t n);
/* Reads FILE of DS, a tar compressed with HOW (of identity ID: its version for the index cache and
 * cache_dir), through its uncompressed copy; FETCH (given ARG) opens its compressed bytes where no
 * kept copy serves (a remote shard, downloaded), a descriptor the copy's maker closes. */
int dl__tar_load_fetched(dl__dataset *ds, uint32_t file, const char *how, dl__shard_id *id,
                         int (*fetch)(void *arg), void *arg, const dl__options *o);
/* Scans a tar shard into DS (no cache); used by dl__tar_load and by tools. */
int dl__tar_scan(dl__dataset *ds, uint32_t file, int fd, uint64_t file_size, int on_error);
/* The integer label of a .cls member's N bytes (spaces around it allowed); *WHY NULL, or why it is
 * none ("is not an integer", "is out of range ..."), and -1. */
int64_t dl__parse_label(const uint8_t *p, size_t n, const char **why);
int dl__folder_load(dl__dataset *ds, const char *root);
/* Reads a ringfeed shard's index into DS; DIRECT asks for O_DIRECT reads where the shard allows. */
int dl__rfs_load(dl__dataset *ds, const char *path, int direct);
/* The records of the ringfeed shard FILE of DS, read through FD (SIZE bytes), as samples. */
int dl__rfs_load_fd(dl__dataset *ds, uint32_t file, int fd, uint64_t size);

/* A parsed .rfs index (rfs.c), for the loader, dlshard and the fuzz harness. */
enum { DL__RFS_RAW, DL__RFS_ZSTD, DL__RFS_JPEG, DL__RFS_PNG, DL__RFS_WEBP, DL__RFS_BYTES, DL__RFS_TEXT, DL__RFS_JSON };
typedef struct dl__rfs_field {
  uint16_t name;
  uint8_t codec;
  uint32_t offset, size;
  uint64_t raw_size;
} dl__rfs_field;
typedef struct dl__rfs_record {
  uint64_t offset;
  uint32_t size, key;
  int64_t label;
  uint64_t checksum;
  uint64_t first_field;
  uint16_t nfields;
} dl__rfs_record;
typedef struct dl__rfs {
  uint32_t align;
  uint64_t nrecords, nfields_total;
  dl__rfs_record *records;
  dl__rfs_field *fields;
  uint32_t nnames;
  char **names;
  char *keys;
  uint64_t keys_len;
} dl__rfs;
/* Reads and checks the header, trailer and index of the shard open as FD; WHY gets the reason. */
int dl__rfs_open(dl__rfs *r, int fd, uint64_t file_size, char *why, size_t cap);
/* Parses index bytes (the part after the trailer checks); exposed for the fuzz harness. */
int dl__rfs_parse_index(dl__rfs *r, const uint8_t *p, size_t n, uint64_t first, uint64_t index_offset,
                        char *why, size_t cap);
void dl__rfs_free(dl__rfs *r);
/* The checksum of ringfeed shard records and indexes: XXH3-64, seed 0 (checksum.c). */
uint64_t dl__rfs_checksum(const void *p, size_t n);
/* The same checksum fed piece by piece; _copy also copies what it hashes, reading it once. */
typedef struct dl__hasher dl__hasher;
dl__hasher *dl__hasher_new(void);
void dl__hasher_free(dl__hasher *h);
void dl__hasher_reset(dl__hasher *h);
void dl__hasher_update(dl__hasher *h, const void *p, size_t n);
void dl__hasher_copy(dl__hasher *h, void *dst, const void *src, size_t n);
uint64_t dl__hasher_digest(dl__hasher *h);
extern const char *const dl__rfs_codec_names[8];
/* Whether S names a remote object (http://, https://, s3://). */
bool dl__is_url(const char *s);
/* Adds the shard at URL to DS (remote/load.c): its index from the cache, or built from one
 * download (tar) or a ranged read of its footer (ringfeed shard). */
int dl__remote_load(dl__dataset *ds, const char *url, const dl__options *o);
/* Builds the sample table of FILE from FD (a whole local copy of SIZE bytes): 0 when the table
 * may be cached, 1 when usable but its warnings should come at every open, or an error. */
typedef int (*dl__scan_fn)(dl__dataset *ds, uint32_t file, int fd, uint64_t size, void *arg);
/* Adds the remote object URL to DS with the samples SCAN finds in it: from the index cache when it
 * holds this version of the object (and SALT, what else the table depends on), else from one
 * download. */
int dl__remote_load_scanned(dl__dataset *ds, const char *url, const dl__options *o, dl__scan_fn scan, void *arg,
                            uint64_t salt);
/* The URL of NAME (a relative path) in the remote folder ROOT into OUT (CAP bytes), NAME
 * percent-encoded where ROOT is HTTP(S) ("a b?.mds" is a name, not a query). */
int dl__remote_join(char *out, size_t cap, const char *root, const char *name);
/* The whole body of URL (at most MAX bytes) into a new NUL-terminated buffer *OUT, *LEN bytes. */
int dl__remote_get_text(dl__dataset *ds, const char *url, const dl__options *o, size_t max, char **out, size_t *len);
/* The s3:// objects (ListObjectsV2) or hf:// files (the Hub's tree API) a pattern with wildcards
 * names, sorted; the caller frees. */
int dl__remote_list(dl__dataset *ds, const char *pattern, const dl__options *o, char ***out, size_t *n);
/* LEN bytes at OFF of remote FILE of DS into BUF (one ranged request, retried): LEN, or an error
 * with its message. */
int64_t dl__remote_read(const dl__dataset *ds, uint32_t file, const dl__options *o, void *buf, size_t len,
                        uint64_t off);
/* A temporary copy of the remote object URL (deleted when *FD closes): the whole object, or with
 * WHOLE false and a ringfeed shard, its head and index only; *SIZE is the object's size. */
int dl__remote_copy(const char *url, const dl__options *o, bool whole, int *fd, uint64_t *size);
/* The size and version (a hash of URL, size and ETag) of the remote object URL, from one probe. */
int dl__remote_version(const char *url, const dl__options *o, uint64_t *size, uint64_t *version);
/* The copy of the remote object URL (of VERSION) that MAKE writes into FD, SIZE bytes, kept in
 * cache_dir (remote/cache.c): a read-only descriptor holding a shared lock that keeps it from
 * eviction, found there or made now; -EBUSY while another process makes it, -ENOSPC when it does
 * not fit in cache_limit, or another error with its message. */
int dl__cache_keep(const dl__options *o, const char *url, uint64_t version, uint64_t size,
                   int (*make)(int fd, void *arg), void *arg);
/* The same for a copy whose size is known only once made (a compressed tar's): MAKE writes at most
 * MOST bytes (cache_limit, or what the disk had free less a tenth), and -ENOSPC comes after it
 * when the cache cannot keep what it wrote. NAME names the copy's source (a path or URL). */
int dl__cache_keep_unsized(const dl__options *o, const char *name, uint64_t version,
                           int (*make)(int fd, uint64_t most, void *arg), void *arg);
/* Uploads SIZE bytes of FD as URL (s3://bucket/key). */
int dl__remote_put(const char *url, const dl__options *o, int fd, uint64_t size);
/* What dl__remote_load kept in DS (URLs, credentials). */
void dl__remote_free(dl__dataset *ds);
/* The shard cache of a loader over remote shards with cache_dir= (remote/cache.c): its folder
 * checked and fetch threads started; stopped (downloads in flight abandoned) and closed. */
int dl__cache_start(dl_loader *l);
void dl__cache_stop(dl_loader *l);
/* Expands SOURCE ("::" lists, brace ranges, globs) and loads every part. */
int dl__source_load(dl__dataset *ds, const char *source, const dl__options *o);
int dl__expand_braces(const char *pattern, char ***out, size_t *count);

/* Cached tar index beside the shard or in the cache folder (index_cache.c). The magic changes
 * whenever a shard's index would come out otherwise (08: sparse members are left out). */
#define DL__INDEX_CACHE_MAGIC "RFTIDX08"
int dl__index_cache_read(dl__dataset *ds, uint32_t file, const char *path, const dl__shard_id *id);
void dl__index_cache_write(const dl__dataset *ds, size_t first, const char *path, const dl__shard_id *id);
/* The samples of cache bytes P (LEN of them) into DS as file FILE, when they match ID; -1 when not
 * (the cache is untrusted: every field is checked). */
int dl__index_cache_parse(dl__dataset *ds, uint32_t file, const uint8_t *p, size_t len, const dl__shard_id *id);
/* The cache folder ($XDG_CACHE_HOME/ringfeed or ~/.cache/ringfeed); a cache file of at least LEAST
 * bytes read whole into *OUT (malloc'd); one written whole under TARGET or not at all (-errno). */
int dl__cache_folder(char *buf, size_t cap);
int dl__cache_read(const char *path, size_t least, uint8_t **out, size_t *len);
int dl__cache_write(const char *target, const uint8_t *p, size_t len);
/* The GPU check's verdicts on JPEG scans kept across runs (check_cache.c): read at open into
 * l->jpeg_rows, written at close when the run read any scan. */
void dl__check_cache_load(dl_loader *l);
void dl__check_cache_save(dl_loader *l);
/* What a file opened per read was at open (stat), for the verdicts' name: a file that changes
 * after gives the dataset another. */
typedef struct dl__file_seen {
  uint64_t dev, ino, size;
  int64_t mtime_ns, ctime_ns;
} dl__file_seen;
void dl__file_seen_of(const struct stat *st, dl__file_seen *out);
/* Folds in ID (LEN bytes, at most 64), the identity of FILE, just added to DS: what stat said of a
 * file read per read (a dl__file_seen), or a remote object's version for its local copy. */
void dl__dataset_file_named(dl__dataset *ds, uint32_t file, const void *id, size_t len);

/* ---- .npy payloads (npy.c) ---- */

#define DL__NPY_MAX_DIMS 8
typedef struct dl__npy {
  DLDataType dtype;
  int ndim;
  int64_t shape[DL__NPY_MAX_DIMS];
  const uint8_t *data;
  uint64_t bytes;
} dl__npy;
int dl__npy_parse(const uint8_t *p, size_t n, size_t total, dl__npy *out, dl__err *e);
/* numpy's descr ("<f4", "|u1") as a DLPack type; -1 when unsupported. */
int dl__dtype_parse(const char *descr, DLDataType *t);
/* ---- MosaicML Streaming's MDS datasets (mds.c) ---- */
/* How a tensor column of an MDS dataset stores its values: its dtype and shape where its encoding
 * fixes them (numbers: shape ()), else each value says (ndarray). */
typedef struct dl__mds_spec {
  DLDataType dtype;
  bool dtype_fixed;
  int ndim; /* -1: each value says */
  int64_t shape[DL__NPY_MAX_DIMS];
  bool used; /* a column of this name was seen */
} dl__mds_spec;
/* Whether PATH names a local MDS dataset: a folder holding index.json, or an index.json. */
bool dl__mds_is(const char *path);
/* inflate.c: whether COMPRESSION (as an MDS index names it: "zstd", "gz:6", "bz2") is read, and
 * file IN's compressed streams decompressed into FD from its start; they must come to exactly
 * EXPECT bytes, or where EXPECT is 0 to at most MOST (DL_ELIMIT past it); *SIZE (may be NULL) gets
 * what they came to. WHAT and NAME head the messages ("MDS shard", its path). */
bool dl__unpack_reads(const char *compression);
int dl__unpack(int in, const char *compression, uint64_t expect, uint64_t most, int fd, const char *what,
               const char *name, uint64_t *size);
/* Loads the MDS dataset at PATH: a local folder or index.json, or the URL of a remote one's
 * index.json (or of its folder, ending in '/'). */
int dl__mds_load(dl__dataset *ds, const char *path, const dl__options *o);
/* A digest index.json records of a shard file: Streaming's name of its algorithm ("sha1",
 * "xxh64", ...) and its hex digest. */
typedef struct dl__mds_digest {
  char algo[16];
  char hex[132];
} dl__mds_digest;
/* Calls EACH with every digest the index of the local MDS dataset at PATH records, and the path of
 * the file it is of (raw or compressed, whether or not the file is there); stops at its first
 * nonzero return, which it returns. */
int dl__mds_digests(const char *path, int (*each)(const char *file, const dl__mds_digest *d, void *arg), void *arg);
/* One value of a tensor column (N bytes at P) as a .npy payload would describe it. */
int dl__mds_parse(const dl__mds_spec *spec, const uint8_t *p, size_t n, dl__npy *out, dl__err *e);
/* Loads a token source ("tokens:" stripped): windows of seq_len+1 tokens as samples. */
int dl__tokens_load(dl__dataset *ds, const char *paths, int token_bytes, int seq_len);

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

/* ---- sampler (sampler.c) ---- */

typedef struct dl__sampler {
  int64_t n;           /* samples in the dataset */
  int world, rank;
  int batch;
  int drop_last, shuffle;
  uint64_t seed;
  int64_t epochs;      /* 0: forever */
  int64_t start_epoch; /* first epoch of this run (resume) */
  int64_t start_off;   /* permutation positions of start_epoch already consumed by all ranks */
  int64_t nb_first;    /* batches in the first epoch for this rank */
  int64_t nb;          /* batches in every later epoch */
  int64_t total;       /* batches in the run, -1 forever */
  uint64_t fingerprint; /* of the dataset (its keys in order), carried by resume tokens */
  int64_t token_block;  /* the shuffle_block a resume token was saved with */
  struct dl__blocks *blocks; /* shuffle_block=K: the two-level order's tables, else NULL */
  const struct dl__mix *mix; /* repeat=: positions run over copies of the source's parts, else NULL */
} dl__sampler;

/* repeat=: an epoch runs over copies of each "::" part of the source. Part P's samples are the
 * dataset's FIRST[P] .. FIRST[P + 1] - 1, its copies the epoch's positions VFIRST[P] ..
 * VFIRST[P + 1] - 1 (round(R x samples) of them: whole copies, then a subset). */
typedef struct dl__mix {
  uint32_t nparts;
  int64_t *first, *vfirst; /* nparts + 1 each */
} dl__mix;
/* The mix of DS's parts under the factors R (NR of them: one per part), or an error naming what
 * does not fit. */
int dl__mix_init(dl__mix *m, const dl__dataset *ds, const double *r, int nr);
void dl__mix_free(dl__mix *m);
/* What the mix adds to a dataset's fingerprint: a token saved under other factors is refused. */
uint64_t dl__mix_fingerprint(const dl__mix *m);

int dl__sampler_init(dl__sampler *s, int64_t n, int world, int rank, int batch, int drop_last,
                     int shuffle, uint64_t seed, int64_t epochs, int64_t start_epoch, const char *resume,
                     uint64_t fingerprint);
/* Shuffles in blocks of K shards (K = 0: over the whole dataset): each epoch permutes the shards,
 * then the samples within each run of K of them. FIRST (NFILES + 1 entries) is where each shard's
 * samples start; they must be grouped by shard. Checks a resume token's block against K. */
int dl__sampler_set_blocks(dl__sampler *s, uint32_t k, uint32_t nfiles, const int64_t *first);
void dl__sampler_free(dl__sampler *s);
/* Batches this rank gets in EPOCH of the run: fewer in a resumed first epoch, 0 outside the run. */
int64_t dl__sampler_epoch_batches(const dl__sampler *s, int64_t epoch);
/* The dataset's fingerprint: a hash of its samples' keys in order, the same for a tar and the
 * ringfeed shard made from it. */
uint64_t dl__dataset_fingerprint(const dl__dataset *ds);
/* Batch K of the run: its epoch, index within the epoch, and the epoch's start offset. */
void dl__sampler_locate(const dl__sampler *s, int64_t k, int64_t *epoch, int64_t *index, int64_t *off);
int dl__sampler_batch_len(const dl__sampler *s, int64_t k);
/* Dataset index of sample I of batch K, its epoch, and (DRAW, may be NULL) what its random draws
 * are keyed by: its place in the epoch's order of the dataset (of the parts' copies with repeat=,
 * so that two copies of one sample are cropped apart). */
int64_t dl__sampler_sample(const dl__sampler *s, int64_t k, int i, int64_t *epoch, int64_t *draw);
/* Token for the state after batches [0, K) of the run were handed out. */
int dl__sampler_token(const dl__sampler *s, int64_t k, char *buf, size_t cap);
/* The index that position POS of epoch E's permutation holds. */
int64_t dl__permute(uint64_t seed, int64_t epoch, int64_t n, int64_t pos);

/* ---- I/O backends (io_uring.c, io_pread.c) ---- */

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
  dl_loader *l;            /* the loader whose worker reads (its options, files, stats, close) */
  char why[DL__MSG_MAX];   /* a backend's message for the read it just completed with an error */
};

extern const dl__io_ops dl__io_pread_ops;
/* Reads N bytes at OFF, through interrupted and short reads: the bytes read (fewer only at the end
 * of the file) or -errno (io_pread.c). */
int64_t dl__pread_full(int fd, void *buf, size_t n, uint64_t off);
/* The pieces of IOV (N of them) that follow its first SKIP bytes, into REST; returns how many. */
int dl__iov_after(const struct iovec *iov, int n, size_t skip, struct iovec *rest);
extern const dl__io_ops dl__io_uring_ops; /* init fails with -ENOSYS when built without */
/* Remote files (remote/io_http.c): ranged GETs; a submitted read's "fd" is the file's index. */
extern const dl__io_ops dl__io_http_ops;
/* Faults for tests (io_fault.c): reads DL_IO_FAULTS once; dl__io_fault(RES) is the result a raw
 * read of RES (bytes or -errno) is to be taken as. */
void dl__io_faults_init(void);
int64_t dl__io_fault(int64_t res);
/* Chooses the backend for MODE once; writes why into REASON. */
const dl__io_ops *dl__io_choose(int mode, char *reason, size_t cap, int *err);

/* ---- decoders (jpeg.c, png.c) ---- */

typedef struct dl__buf {
  uint8_t *p;
  size_t cap;
} dl__buf;
/* Grows B to at least N bytes (grow-only, so steady state allocates nothing). */
int dl__buf_reserve(dl__buf *b, size_t n);
/* The same, for O_DIRECT: the memory is aligned to ALIGN (contents are not kept on growth). */
int dl__buf_reserve_aligned(dl__buf *b, size_t n, size_t align);
void dl__buf_free(dl__buf *b);

typedef struct dl__rect {
  double x, y, w, h;
} dl__rect;

typedef struct dl__decode_job dl__decode_job;
struct dl__decode_job {
  /* in */
  const uint8_t *src;
  size_t len;
  int channels;       /* 1 or 3 */
  int out_w, out_h;   /* final size, so a decoder may decode at a reduced scale */
  int64_t max_pixels;
  /* Called once the image size is known: fills job->rect (source pixels) or fails. */
  int (*plan)(dl__decode_job *job, int width, int height, dl__err *e);
  void *plan_arg;
  dl__buf *scratch;
  const _Atomic int *cancel; /* when it turns nonzero, the decode stops with DL_ECLOSED (may be NULL) */
  bool pil;                  /* SRC is an MDS "pil" value (raw pixels have no signature to sniff) */
  struct dl__jpeg_rows *rows; /* where the rows of JPEGs begin, by SAMPLE (may be NULL) */
  uint32_t sample;
  /* set by plan */
  dl__rect rect;
  /* out: decoded pixels (channels interleaved) and rect mapped into them */
  const uint8_t *pixels;
  int width, height;
  size_t stride;
  dl__rect mapped;
  int src_width, src_height;
};

typedef struct dl__decoder_ops {
  const char *name;
  int (*create)(void **ctx);
  void (*destroy)(void *ctx);
  int (*decode)(void *ctx, dl__decode_job *job, dl__err *e);
} dl__decoder_ops;

extern const dl__decoder_ops dl__jpeg_ops;
extern const dl__decoder_ops dl__pil_ops;
/* Grey from RGB as PIL's convert("L") and libjpeg take it (ITU-R 601-2 luma), for every decoder. */
static inline uint8_t dl__luma(unsigned r, unsigned g, unsigned b) {
  return (uint8_t)((19595u * r + 38470u * g + 7471u * b + 32768u) >> 16);
}
/* A Streaming "pil" value (pil_raw.c) of mode RGB, RGBA, L or LA: BPP bytes a pixel from PIXELS,
 * rows without padding; anything else, or a size that does not add up, is an error in E. */
typedef struct dl__pil_image {
  uint32_t width, height;
  int bpp;
  char mode[16];
  const uint8_t *pixels;
} dl__pil_image;
int dl__pil_header(const uint8_t *p, size_t len, int64_t max_pixels, dl__pil_image *im, dl__err *e);
extern const dl__decoder_ops dl__png_ops;
extern const dl__decoder_ops dl__webp_ops;
/* The codec of an image by its leading bytes, or by a name's last extension (image.c). */
int dl__sniff_codec(const uint8_t *p, size_t n);
int dl__codec_of_ext(const char *name);

/*
 * Where the rows of MCUs of each sample's JPEG begin, learnt as decodes walk past them
 * (jpeg_rows.c): up to BUDGET bytes for SAMPLES samples, shared by a loader's workers.
 */
typedef struct dl__jpeg_rows dl__jpeg_rows;
dl__jpeg_rows *dl__jpeg_rows_new(uint32_t samples, uint64_t budget);
void dl__jpeg_rows_free(dl__jpeg_rows *s);
uint64_t dl__jpeg_rows_bytes(const dl__jpeg_rows *s);
uint64_t dl__jpeg_rows_skipped(const dl__jpeg_rows *s); /* MCU rows decodes did not Huffman-decode */
uint64_t dl__jpeg_rows_walked(const dl__jpeg_rows *s);  /* scans dl__jpeg_rows_clean read */
/* What a read of a whole image's codes found (dl__jpeg_rows_clean), a byte a sample. */
enum { DL__VERDICT_UNREAD, DL__VERDICT_CLEAN, DL__VERDICT_DAMAGED };
/* The verdicts of dl__jpeg_rows_clean into OUT (may be NULL); the number of samples. */
uint32_t dl__jpeg_rows_verdicts(const dl__jpeg_rows *s, uint8_t *out);
/* Takes the verdicts V[0, N) from an earlier run where it has none; how many it took. */
uint32_t dl__jpeg_rows_take_verdicts(dl__jpeg_rows *s, const uint8_t *v, uint32_t n);
struct jpeg_decompress_struct;
/* For a decode of SRC (LEN bytes, its scan's data from ENTROPY_AT, D started) that needs no row
 * above iMCU row IMCU_ROW: stand-ins for the rows above in OUT (*PREFIX_LEN bytes) that SRC from
 * *TAIL_AT follows. -1 when the file or the row does not allow it: decode it as it is. */
int dl__jpeg_rows_prefix(dl__jpeg_rows *st, uint32_t sample, struct jpeg_decompress_struct *d, const uint8_t *src,
                         size_t len, size_t entropy_at, int imcu_row, dl__buf *out, size_t *prefix_len,
                         size_t *tail_at);
/* Whether the JPEG P (LEN bytes), the dataset's SAMPLE, reads to its end as libjpeg would read it
 * without complaint: 1 it does, 0 it does not (libjpeg would find the data ends early, a code no
 * table has, or the walk something it does not expect). A baseline scan is walked here, its row
 * starts kept on the way; any other image is read by libjpeg (dl__jpeg_sound), and is not
 * sound over MAX_PIXELS. Read once a sample. */
int dl__jpeg_rows_clean(dl__jpeg_rows *st, uint32_t sample, const uint8_t *p, size_t len, int64_t max_pixels);
/* Whether libjpeg reads every scan of the JPEG P (LEN bytes), of at most MAX_PIXELS, to its
 * coefficients without an error or a warning: 1, else 0. */
int dl__jpeg_sound(const uint8_t *p, size_t len, int64_t max_pixels);
/* The first iMCU row a decode of D needs for output rows from Y0 on. */
int dl__jpeg_rows_first(struct jpeg_decompress_struct *d, int y0);

/* The DCT scaling (1, 2, 4 or 8) the JPEG decoder uses for CROP at the output size (jpeg.c). */
int dl__jpeg_scale(const dl__rect *crop, int out_w, int out_h);

/* What a JPEG's markers say, without decoding (jpeg_probe.c). */
enum { DL__CSS_444, DL__CSS_422, DL__CSS_420, DL__CSS_440, DL__CSS_411, DL__CSS_410, DL__CSS_GRAY, DL__CSS_OTHER };
typedef struct dl__jpeg_info {
  int width, height, components, precision;
  int sof;         /* the frame marker, 0xC0..0xCF */
  int subsampling; /* DL__CSS_* */
  uint8_t samp[4][2];
  int first_scan_components;
  int scans;            /* counted up to the EOI only when the whole file was read */
  bool tables_complete; /* every table the frame and its first scan use is defined before it */
  bool rgb, cmyk;       /* the colour space libjpeg assumes is not YCbCr or grey */
  bool restarts;
  bool between_scans;   /* marker segments after the first scan (progressive, multi-scan) */
  bool bogus_progression; /* a progressive scan refines what no scan coded (libjpeg warns) */
  bool ends;            /* with WHOLE: the entropy-coded data runs to an EOI marker */
  int64_t blocks;       /* 8x8 blocks the frame codes (with the MCUs' padding) */
  size_t entropy_bytes; /* with WHOLE: bytes of entropy-coded data in all scans */
} dl__jpeg_info;
/* 0, or -1 when the markers before the first scan are malformed. WHOLE also reads the scans. */
int dl__jpeg_probe(const uint8_t *p, size_t n, bool whole, dl__jpeg_info *j);

/* ---- crop and resize (augment.c, resize.c) ---- */

/* Chooses the source rectangle for MODE; draws come from KEY. */
int dl__crop_rect(int mode, int width, int height, int out_w, int out_h, uint64_t key, dl__rect *r,
                  dl__err *e);
/* Where the crop for KEY begins and ends down its image (0..1), before the image is read. */
void dl__crop_rows_hint(int mode, int out_w, int out_h, uint64_t key, double *top, double *bottom);

typedef struct dl__resize_scratch {
  dl__buf tmp, coef, wide;
} dl__resize_scratch;
void dl__resize_scratch_free(dl__resize_scratch *s);
/* Tests: the portable loops even where the processor has AVX2 (false: choose again). */
void dl__resize_force_portable(bool portable);

/*
 * Resamples RECT of SRC (w x h x ch, row stride) to OUT (ow x oh) with an antialiasing triangle
 * filter; FLIP mirrors horizontally. Output is interleaved (pixel stride ch) or planar (NCHW).
 */
int dl__resize(const uint8_t *src, int w, int h, size_t stride, int ch, dl__rect rect, uint8_t *out,
               int ow, int oh, int planar, int flip, dl__resize_scratch *s);

/* ---- one image into its place in a batch on the CPU (image.c) ---- */

typedef struct dl__image_decoder {
  void *jpeg, *png, *webp;
  dl__jpeg_rows *rows; /* the loader's, or NULL */
  dl__buf scratch;
  dl__resize_scratch rs;
} dl__image_decoder;

int dl__image_decoder_init(dl__image_decoder *d);
void dl__image_decoder_free(dl__image_decoder *d);
/* JOB decoded by the decoder its bytes call for (JPEG, PNG or WebP), or MDS raw pixels. */
int dl__image_decode_job(dl__image_decoder *d, dl__decode_job *job, dl__err *e);
/* Decodes IMAGE (LEN bytes; CODEC the sample's, which only DL__CODEC_PIL overrides sniffing) of
 * the sample whose draws come from KEY into DST: the crop, resized, maybe flipped, in the slot's
 * layout. */
int dl__image_decode(dl__image_decoder *d, const dl_loader *l, const uint8_t *image, size_t len, int codec,
                     uint64_t key, uint32_t sample, uint8_t *dst, dl__err *e);

/* ---- the loader (loader.c, ring.c, worker.c) ---- */

enum { DL__SLOT_FREE, DL__SLOT_FILLING, DL__SLOT_COMPLETE, DL__SLOT_HELD };

typedef struct dl__gpu_job dl__gpu_job; /* gpu/gpu.h */

struct dl_batch {
  dl_loader *l;
  int stream;        /* which output stream (device) it belongs to */
  int state;
  int64_t k;         /* batch number within its stream's run */
  int64_t epoch, index;
  int len, done;
  bool ready;        /* complete (host) or its copy queued (device): the consumer may take it */
  bool is_device;    /* a device slot of the copy stage rather than a host slot */
  int refs;          /* the consumer's hold (until release) + exports */
  pthread_t holder;  /* the thread it was handed to */
  int exports;       /* DLManagedTensors still alive */
  void *release_stream;
  int64_t image_shape[4], label_shape[1];
  int err;           /* the failure of the first failing sample, with on_error=fail */
  int err_i;         /* ... and that sample's place, so the report does not depend on timing */
  char errmsg[DL__MSG_MAX];
  uint8_t *image;    /* host image bytes for this slot */
  int64_t *label;
  const char **key;
  int *sample_err;
  void *gpu;         /* per-slot device state (gpu/copy_stage.c) */
  /* With JPEG decoding on the GPU (host slots): the compressed JPEGs the GPU decodes, and per
   * sample what it decodes (jobs[i].len 0: the sample was done on the CPU). */
  uint8_t *arena;
  size_t arena_used;
  int cpu_n;         /* hybrid's split: the workers decode this many (dl__gpu_arena_take) */
  uint8_t *on_cpu;   /* ... these ones (dl__gpu_split_batch) */
  dl__gpu_job *jobs;
  uint8_t *fields;   /* this slot's tensor fields (loader.fields layout); host or device memory */
  /* Bytes fields: per sample a grow-only buffer holding its members, and per sample and field
   * where in it (brefs[i * nbfields + f]); host memory, handed to the device slot with the batch. */
  dl__buf *blobs;
  struct dl__bytes_ref *brefs;
  int64_t field_shape[DL__MAX_FIELDS][DL__NPY_MAX_DIMS + 1];
  int64_t len_shape[1];
};

/* Where a bytes field of one sample lies in the sample's blob (len 0 and !present: absent). */
typedef struct dl__bytes_ref {
  uint32_t at, len;
  bool present;
} dl__bytes_ref;

/* A bytes field of every batch: a member delivered as it is. */
typedef struct dl__bfield {
  char name[72];
  int ds_index;
} dl__bfield;

/* A tensor field of every batch: its type and per-sample shape (leading dimension padded to the
 * dataset's largest with pad=1), and where it sits in a slot's field block. */
typedef struct dl__field {
  char name[72];
  int ds_index; /* dl__dataset field name index */
  DLDataType dtype;
  int ndim;
  int64_t shape[DL__NPY_MAX_DIMS];
  size_t sample_bytes;
  size_t at;     /* offset of [B, ...] data in the slot's field block */
  size_t len_at; /* offset of the int64 [B] lengths with pad=1 */
} dl__field;

typedef struct dl__stream {
  dl__sampler sm;
  int64_t claim_k;   /* next batch to hand to workers */
  int claim_i;
  int64_t next_out;  /* next batch for the consumer */
  int64_t handed;    /* batches handed out */
  /* Host prefetch slots, and the device slots of the copy stage (or NULL). A batch takes whichever
   * slot is free when it starts, so a batch the consumer keeps costs one slot, not the ring's turn;
   * dl__slot_of finds it again by its number. */
  dl_batch *slots;
  dl_batch *dslots;
  dl_batch *filling; /* the host slot of batch claim_k once its first sample is claimed */
  /* A consumer waiting for next_out while every slot holds a batch another thread was handed:
   * since when (0: not so), and whether the warning about it was given. */
  double held_since;
  bool held_told;
} dl__stream;

typedef struct dl__stats {
  _Atomic int64_t samples, errors, bytes_read;
  _Atomic int64_t decode_ns, read_wait_ns;
  _Atomic int64_t slot_wait_ns; /* workers with nothing to read or decode: every slot was taken */
  _Atomic int64_t parked_ns;    /* workers=auto: workers set aside while the consumer kept up */
  _Atomic int64_t cpu_decoded, gpu_planned; /* images decoded by the workers; handed to the GPU */
  _Atomic int64_t cpu_decode_ns;            /* the workers' time on those decodes */
  _Atomic int64_t gpu_decoded, gpu_fallbacks; /* by nvJPEG; refused by it and decoded on the CPU */
  _Atomic int64_t requests, retries;          /* remote sources: the workers' GETs, and retries among them */
  _Atomic int64_t cache_hits;                 /* remote samples read from the shard cache */
  _Atomic int64_t cache_fetches, cache_fetch_bytes; /* shards this loader downloaded into it */
  _Atomic int64_t placed;       /* samples whose tensors were read straight into the slot */
  _Atomic int64_t placed_again; /* and those read again whole instead (a .npy header not as assumed) */
  int64_t check_kept; /* the GPU check's verdicts an earlier run left (check_cache.c) */
  int64_t batches;
  int64_t starved; /* batches the consumer had to wait for */
  double consumer_wait_s;
  /* Of consumer_wait_s: waits while the consumer's GPU still ran the work it had queued on earlier
   * batches (a CUDA consumer queues ahead of its GPU): they left the GPU nothing to wait for. */
  double consumer_wait_gpu_busy_s;
  /* The consumer's stream, having reached dl_batch_wait, waiting there for the batch's copy and
   * decode: its GPU idle for want of the batch although its thread had it (the copy thread hands a
   * batch out as soon as its GPU work is queued). Measured device_slots batches later, when the
   * slot is filled again. Reported apart: counted by pacing and the hybrid split it made them worse (an H200 beside steps at 1.2x hybrid's batch time: the workers all kept at
   * work slowed the copy thread's nvJPEG calls, and the split moved 16-17 times instead of 0-2,
   * GPU idle 0.025-0.059 against 0.018-0.022). */
  double consumer_stream_wait_s;
  _Atomic int64_t release_wait_ns; /* copy threads waiting for the consumer's GPU to free a slot */
  _Atomic int64_t copy_wait_workers_ns; /* copy threads waiting for the workers' next host batch */
  double first_batch_ms;
  double first_wait_s; /* of consumer_wait_s, waiting for the first batch (start-up) */
  double last_batch_s; /* when the last batch was handed out, from dl_open */
  /* dl_open's own time, by step: the source's index, the devices (CUDA's start and the copy
   * stage), the GPU's JPEG decoders, the host slots (pinned when a device is used), starting the
   * workers, all of it */
  double open_index_ms, open_cuda_ms, open_gpu_decode_ms, open_slots_ms, open_workers_ms, open_ms;
} dl__stats;

/* The consumer's waiting that could have left it idle: not a CUDA consumer's wait while its GPU
 * still ran earlier work. What pacing, the hybrid split and the verdict go by. */
static inline double dl__consumer_idle_s(const dl__stats *st) {
  return st->consumer_wait_s - st->consumer_wait_gpu_busy_s;
}

/* A sample of a batch as hybrid's split ranks it (gpu/plan.c). */
typedef struct dl__split_rank {
  float cost;     /* a worker's decode of it, in whole decodes (dl__split_cost) */
  uint8_t spread; /* 0: one of an even spread of the workers' share over the batch (the tie-break) */
  int i;
} dl__split_rank;

/* Hybrid's measurements (gpu/plan.c, under l->mu). */
typedef struct dl__split {
  double gpu_ms, cpu_ms;  /* smoothed time per image: one device's decoder, one worker */
  double balanced;        /* the share at which both sides would finish together */
  int votes;              /* batches since the last step: + the GPU should take more, - less */
  int64_t cpu_decoded, cpu_ns, starved, release_wait_ns; /* the counters at the last update */
  double t;                                              /* and its time */
  double period;          /* ms between a stream's batches, the consumer's when it is ahead */
  double win_t;           /* over windows of at least 0.1 s from this time, */
  int64_t win_n;          /* with this many updates so far */
  int64_t updates, moves, holds;
  dl__split_rank *rank; /* one batch's samples, ranked for the split (scratch) */
} dl__split;

/* workers=auto while running (ring.c, under l->mu): how many workers claim samples. Workers the
 * consumer does not need wait aside, their CPUs left to the training process; a consumer that
 * waits gets them back. Decided over windows of batches. */
typedef struct dl__pace {
  bool on;      /* workers=auto, with more than one worker */
  int active;   /* workers that may claim samples; the others wait aside */
  double t, wait;           /* the window's start: time, the consumer's wait */
  int64_t batches, slot_ns; /* and the batches handed out, the workers' wait for slots */
  int calm;     /* windows to sit out after giving workers back, before setting any aside */
  char why[200]; /* the last change, for the stats */
} dl__pace;

struct dl_loader {
  dl__options o;
  dl__dataset ds;
  dl__mix mix; /* repeat=: the parts' copies the samplers run over (nparts 0: none) */
  dl__jpeg_rows *jpeg_rows; /* where each sample's JPEG rows begin (NULL: not kept) */
  uint64_t check_hash;      /* the dataset's, naming its GPU check's verdicts (0: none kept) */
  int nstreams;
  dl__stream streams[DL__MAX_DEVICES];
  size_t image_bytes; /* one batch's image bytes */
  size_t sample_bytes;
  bool has_image;     /* the dataset has images: the "image" field exists */
  dl__field fields[DL__MAX_FIELDS];
  dl__bfield bfields[DL__MAX_FIELDS];
  int nbfields;
  int nfields;
  size_t field_block; /* bytes of one slot's tensor fields (and lengths) */
  char len_names[DL__MAX_FIELDS][80];
  /* Every host slot, one after the other: its images, its tensor fields and its arena for the
   * GPU's JPEGs, each starting on a page (pinned with CUDA, a slot at a time: gpu/copy_stage.c). */
  uint8_t *host_mem;
  size_t host_mem_bytes;
  size_t slot_stride;  /* bytes of one host slot in host_mem */
  const dl__io_ops *io_ops;
  char io_reason[160];
  char workers_reason[256], prefetch_reason[200]; /* how workers= and prefetch= were chosen */
  bool remote; /* every file is a URL: read through dl__io_http_ops */
  /* Reads that failed in a row for the storage's sake: local reads with an I/O error (worker.c),
   * requests that failed after every retry (5xx, 429, timeouts, resets; not 404s nor a changed
   * object: remote/io_http.c). At DL__STORAGE_DOWN the storage or server is down, and a sample it
   * fails is the run's error whatever on_error says (ring.c). */
  _Atomic int read_failures;
  struct dl__cache *cache; /* cache_dir=: whole remote shards on local disk (remote/cache.c) */
  pthread_mutex_t mu;
  pthread_cond_t work_cv;  /* workers wait for a free slot */
  pthread_cond_t ready_cv; /* the consumer waits for a complete batch */
  int stop;
  _Atomic int cancel; /* set as the workers stop: decodes in progress give up (read without l->mu) */
  int closing;       /* dl_close() began: waiting consumers leave with DL_ECLOSED */
  int consumers;     /* threads inside dl_next_batch_on(), which dl_close() waits out */
  int closed;        /* dl_close() ran; freed when the last export goes */
  int nworkers;
  struct dl__worker *workers;
  dl__stats st;
  double open_time;
  pid_t pid; /* the process that opened it: a child of fork() has none of its threads */
  void *cuda; /* gpu/copy_stage.c state, NULL for host batches */
  /* JPEG decoding on the GPU, chosen at open (gpu/decode.c). */
  int decode;          /* DL__DECODE_CPU, _GPU or _HYBRID: what runs */
  char decode_reason[256];
  bool gpu_hw;         /* the devices' JPEG engines decode (else nvJPEG's CUDA decoder) */
  size_t gpu_pool;     /* device bytes for one batch's decoded JPEGs: a larger image goes to the CPU */
  size_t arena_bytes;  /* per host slot, for the compressed JPEGs */
  bool decode_starting; /* decode=auto: nvJPEG starts while the workers decode every JPEG (under mu) */
  double share;        /* hybrid: the GPU's share of the next batch opened (under mu) */
  dl__split split;
  dl__pace pace;
};

double dl__now(void);

/* Batch slots' memory: pages of its own, in 2 MiB pages where the kernel allows (madvise), so
 * that the first pass over the slots faults a huge page at a time rather than 4 KiB. */
void *dl__slots_map(size_t bytes);
void dl__slots_unmap(void *p, size_t bytes);

/* Claim one sample to work on; returns 1 with a claim, 0 when none is available now (NONBLOCK)
 * or there is no more work, -1 when the loader stops. */
typedef struct dl__claim {
  dl_batch *slot;
  int i;
  int64_t index; /* dataset index */
  int64_t draw;  /* what its random draws are keyed by (dl__sampler_sample) */
  int64_t epoch;
  uint8_t *arena; /* where the sample's bytes go when the GPU may decode it, else NULL */
  bool hybrid;    /* its batch is split between the workers and the GPU */
} dl__claim;
int dl__ring_claim(dl_loader *l, dl__claim *c, bool block, int worker);
/* After each batch handed out (under l->mu): workers=auto's count for the next window. */
void dl__pace_locked(dl_loader *l, double now);
/* Marks sample C done; signals the consumer when its batch is complete. */
void dl__ring_done(dl_loader *l, const dl__claim *c, const dl__err *e);
void dl__slot_free_locked(dl_batch *b);
/* Under l->mu: the slot of N that holds batch K (in any state but free), or NULL; the first free
 * slot of N after LAST (in turn, so with none kept batch k takes slot k % N), or NULL. */
dl_batch *dl__slot_of(dl_batch *slots, int n, int64_t k);
dl_batch *dl__slot_free_after(dl_batch *slots, int n, const dl_batch *last);

/* Tensor fields (fields.c): the batch schema at open, and one sample's fields into slot B. */
int dl__fields_schema(dl_loader *l);
/* Decompresses one zstd frame into OUT (at most LIMIT bytes, or DL_ELIMIT). */
int dl__zstd_inflate(void **ctx, const uint8_t *src, size_t n, size_t limit, dl__buf *out, size_t *len,
                     dl__err *e);
/* fields=a,b: shrinks each sample's read to its image and the fields kept. */
void dl__fields_narrow(dl_loader *l);
/* A slot's storage for bytes fields (none without them), freed with the slot. */
int dl__slot_bytes_alloc(const dl_loader *l, dl_batch *b);
void dl__slot_bytes_free(const dl_loader *l, dl_batch *b);
/* Swaps the bytes of FROM's batch into TO (a device slot taking over a host slot's batch). */
void dl__slot_bytes_hand_over(dl_batch *from, dl_batch *to);
/* A read that puts sample S's tensor payloads (uncompressed .npy of the field's exact size, and
 * token windows) straight into their place in slot B, sample I: IOV covers the record in order,
 * the payloads in the slot and every other byte in BUF at its offset in the record, so BUF reads
 * as the record everywhere else. Returns the number of pieces (0: nothing goes straight, read it
 * whole) and in IN_PLACE a bit per ref (its index among S's) whose payload the read places. */
#define DL__MAX_IOV (2 * DL__MAX_FIELDS + 1)
int dl__fields_direct(const dl_loader *l, const dl__sample *s, dl_batch *b, int i, uint8_t *buf, struct iovec *iov,
                      uint32_t *in_place);
/* After such a read: whether every .npy header in BYTES has the length the read assumed (else the
 * payloads landed off by some bytes, and the record must be read again whole). */
bool dl__fields_in_place_ok(const dl_loader *l, const dl__sample *s, const uint8_t *bytes, uint32_t in_place);
/* Fills sample I of B with S's fields from BYTES (the record), checking the record's checksum
 * along the copies with VERIFY (NULL: checked already, and necessarily so with IN_PLACE). */
int dl__fields_fill(dl_loader *l, const dl__sample *s, const uint8_t *bytes, dl_batch *b, int i, void **zctx,
                    dl__buf *zbuf, dl__hasher *verify, uint32_t in_place, dl__err *e);

/* Fills T for field NAME of B whose memory is on DEVICE; shared by host and device batches. */
int dl__batch_describe(const dl_batch *b, const char *name, DLDevice device, DLTensor *t);

int dl__workers_start(dl_loader *l);
void dl__workers_stop(dl_loader *l);
/* A failed sample's place in batch B: zeros (the deterministic substitute). */
void dl__sample_zero(const dl_loader *l, dl_batch *b, int i);
/* A sample that failed: names shard, member and offset in E's message, logs and counts it. */
void dl__sample_failed(dl_loader *l, const dl__sample *s, dl__err *e);

/* The key of a sample's random draws (crop, flip): a function of (seed, epoch, index) only. */
static inline uint64_t dl__sample_key(const dl_loader *l, int64_t epoch, int64_t index) {
  return dl__hash3(l->o.seed, (uint64_t)epoch, (uint64_t)index);
}
static inline bool dl__sample_flip(const dl_loader *l, uint64_t key) {
  return l->o.flip && dl__uniform(key, 1000) < 0.5;
}

#endif /* RINGFEED_INTERNAL_H */
