/*
 * The source stage (source/): a source spec into the sample table. The formats (WebDataset tars,
 * ringfeed shards, MosaicML Streaming datasets, image folders; token files) each in a file of its
 * own behind one table, dl__formats (source/formats.c); their saved indexes; remote shards' loading
 * through remote/ and the shard cache; .npy payloads. It calls decode/ (which codec a member is),
 * io/, remote/, util/ and internal.h.
 *
 * To add a format: a file source/NAME.c that defines `const dl__format dl__NAME_format` and one
 * line in DL__FORMATS below.
 */
#ifndef RINGFEED_SOURCE_H
#define RINGFEED_SOURCE_H

#include "decode/decode.h"
#include "internal.h"
#include "io/io.h"
#include "options.h"
#include "util/util.h"

#include <stdio.h>
#include <sys/stat.h>

/* ---- the sample table (source/dataset.c) ---- */

int dl__dataset_declare(dl__dataset *ds, const char *shard, uint32_t fields, bool image);
/* Index of field NAME (LEN bytes), added when new; -1 past DL__MAX_FIELDS names or on ENOMEM. */
int dl__dataset_field(dl__dataset *ds, const char *name, size_t len);
/* Why a field name of LEN bytes got no index from dl__dataset_field, for the warning naming it. */
const char *dl__field_refusal(const dl__dataset *ds, size_t len);
int dl__dataset_add_ref(dl__dataset *ds, const dl__fref *ref);
int dl__dataset_add_file(dl__dataset *ds, const char *path, uint32_t *index);
/* Adds PATH and opens it for the loader's life (ds->fds); its identity (ID may be NULL for the
 * size alone in *SIZE). */
int dl__dataset_open_file(dl__dataset *ds, const char *path, uint32_t *file, uint64_t *size, dl__shard_id *id);
uint32_t dl__dataset_intern(dl__dataset *ds, const char *s, size_t len);
int dl__dataset_push(dl__dataset *ds, const dl__sample *s);
void dl__dataset_free(dl__dataset *ds);
/* An ImageFolder's sorted class folders (N of them, *CLASSES taken: set to NULL when kept) and the
 * SAMPLES it gave; the first folder's are kept, a later folder's must be the same or none are. */
void dl__dataset_classes(dl__dataset *ds, char ***classes, uint32_t n, size_t samples);
/* The dataset's fingerprint: a hash of its samples' keys in order, the same for a tar and the
 * ringfeed shard made from it. */
uint64_t dl__dataset_fingerprint(const dl__dataset *ds);
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

/* ---- the formats (source/formats.c) ---- */

typedef struct dl__probe dl__probe;     /* a remote shard probed once (source/remote.c) */
typedef struct dl__checker dl__checker; /* what dlshard verify decodes with (source/verify.c) */

/* What verifying finds: records the loader would skip, and what was read. */
typedef struct dl__verified {
  long bad, shards, images;
} dl__verified;

/* One source format. A local path is asked by name first (a folder, an index.json), then by its
 * first bytes; a URL likewise, its bytes from its probe. */
typedef struct dl__format {
  const char *name;
  const char *what; /* in listings: "tar", "MDS dataset" */
  /* Whether local PATH (ST its stat) or a URL (ST NULL) is of this format by its name alone. */
  bool (*by_name)(const char *path, const struct stat *st);
  /* Whether a file whose first N bytes are HEAD is (NULL: never said by its bytes). */
  bool (*by_bytes)(const uint8_t *head, size_t n);
  /* Adds the local shard or dataset PATH to DS. */
  int (*open)(dl__dataset *ds, const char *path, const dl__options *o);
  /* Adds the remote one at URL: probed as P where its bytes said it (NULL: by its name). NULL where
   * the format is not read remotely. */
  int (*open_remote)(dl__dataset *ds, const char *url, const dl__options *o, dl__probe *p);
  /* A temporary copy of what a listing reads of remote P (NULL: the whole object). */
  int (*index_copy)(dl__probe *p, const dl__options *o);
  /* Checks every record of PATH, a shard open as FD of SIZE bytes (FD -1: a dataset named by its
   * path), as the loader reads it: each bad record a line on OUT, counted in N. */
  int (*verify)(const char *path, int fd, uint64_t size, dl__checker *c, dl__verified *n, FILE *out);
} dl__format;

/* Every format, one line each, in the order they are asked (tar last: it takes any file). */
#define DL__FORMATS(X) X(mds) X(folder) X(rfs) X(tar)
#define DL__FORMAT_EXTERN(name) extern const dl__format dl__##name##_format;
DL__FORMATS(DL__FORMAT_EXTERN)
#undef DL__FORMAT_EXTERN

/* The format local PATH (ST its stat) or a URL (ST NULL) names by its name alone, else the one
 * its first N bytes HEAD say (HEAD NULL: not read yet); NULL when none. */
const dl__format *dl__format_of(const char *path, const struct stat *st, const uint8_t *head, size_t n);

/* Expands SOURCE ("::" lists, brace ranges, globs) and loads every part. */
int dl__source_load(dl__dataset *ds, const char *source, const dl__options *o);
int dl__expand_braces(const char *pattern, char ***out, size_t *count);

/* The next "::" that separates parts of a source, or NULL; whether a local PATH is a glob (not a
 * name that exists as written); a file:// URL made a path, in place. */
const char *dl__next_separator(const char *s);
bool dl__is_pattern(const char *path);
void dl__strip_file_scheme(char *path);
/* The paths SOURCE names, in order: its "::" parts (empty ones left out), brace ranges expanded, file:// taken off, local
 * globs matched (one that matches nothing kept as written, for its open to name); URLs as written.
 * *OUT (*N paths) is the caller's to free, each path and the array. */
int dl__source_paths(const char *source, char ***out, size_t *n);

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
/* Writes the index file of local tar PATH where it has none and its scan finds nothing to say; true
 * where it scanned PATH. */
bool dl__tar_index_ahead(const char *path, const dl__options *o);
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

/* A ringfeed shard begins with these 8 bytes (docs/format.md). */
#define DL__RFS_MAGIC "RFSHARD1"
/* A parsed .rfs index (source/rfs.c), for the loader, dlshard and the fuzz harness. */
/* Field codecs (docs/format.md); 2-4 and any other number an image codec's row gives (its rfs). */
enum { DL__RFS_RAW = 0, DL__RFS_ZSTD = 1, DL__RFS_BYTES = 5, DL__RFS_TEXT = 6, DL__RFS_JSON = 7, DL__RFS_CODECS = 32 };
/* The most bytes of a class table (docs/format.md) that the reader takes. */
#define DL__RFS_CLASS_TABLE_MAX (64u << 20)
/* A field entry's byte 3 (docs/format.md): the writer read the JPEG's codes through clean. */
enum { DL__RFS_SCAN_CLEAN = 1 };
typedef struct dl__rfs_field {
  uint16_t name;
  uint8_t codec, scan; /* scan: DL__RFS_SCAN_CLEAN or 0 */
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
  char **classes; /* the class table's names (label i names class i), or NULL */
  uint32_t nclasses;
} dl__rfs;
/* Reads and checks the header, trailer, index and class table of the shard open as FD; WHY gets
 * the reason. */
int dl__rfs_open(dl__rfs *r, int fd, uint64_t file_size, char *why, size_t cap);
/* Parses index bytes (the part after the trailer checks); exposed for the fuzz harness. */
int dl__rfs_parse_index(dl__rfs *r, const uint8_t *p, size_t n, uint64_t first, uint64_t index_offset,
                        char *why, size_t cap);
void dl__rfs_free(dl__rfs *r);
/* The name of field codec C ("raw", "jpeg"), or NULL where it is none. */
const char *dl__rfs_codec_name(int c);

/* ---- remote shards (source/remote.c) ---- */

/* Probes URL once: its size, its version (URL, size and ETag) and its first bytes; DS keeps the
 * S3 or Hub credentials its requests need. Freed by dl__probe_free. */
int dl__probe_open(dl__dataset *ds, const char *url, const dl__options *o, dl__probe **out);
void dl__probe_free(dl__probe *p);
const uint8_t *dl__probe_head(const dl__probe *p, size_t *n);
/* The source as given (messages name it). */
const char *dl__probe_name(const dl__probe *p);
uint64_t dl__probe_size(const dl__probe *p);
/* What its saved index and copies are named by: its version and size. */
uint64_t dl__probe_version(const dl__probe *p);
dl__shard_id *dl__probe_id(dl__probe *p);
/* Adds it to DS as a file read by ranged requests of the version probed (*FILE). */
int dl__probe_add(dl__dataset *ds, dl__probe *p, uint32_t *file);
/* LEN bytes at OFF of it into BUF (one ranged request, retried). */
int dl__probe_range(const dl__probe *p, const dl__options *o, uint64_t off, size_t len, void *buf);
/* A temporary copy of the whole object, of the version probed: its descriptor, or an error. */
int dl__probe_copy(dl__probe *p, const dl__options *o);
/* Adds it to DS with the samples SCAN finds in it: from its saved index when it holds this
 * version (and SALT, what else the table depends on), else from one download. */
typedef int (*dl__scan_fn)(dl__dataset *ds, uint32_t file, int fd, uint64_t size, void *arg);
int dl__probe_scan(dl__dataset *ds, dl__probe *p, const dl__options *o, dl__scan_fn scan, void *arg, uint64_t salt);

/* Adds the shard or dataset at URL to DS, as its format reads it. */
int dl__remote_load(dl__dataset *ds, const char *url, const dl__options *o);
/* The same, probing URL first. SCAN builds the sample table of FILE from FD (a whole local copy of
 * SIZE bytes): 0 when the table may be saved, 1 when usable but its warnings should come at every
 * open, or an error. */
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
/* Uploads SIZE bytes of FD as URL (s3://bucket/key). */
int dl__remote_put(const char *url, const dl__options *o, int fd, uint64_t size);
/* What dl__remote_load kept in DS (URLs, credentials). */
void dl__remote_free(dl__dataset *ds);

/* ---- verifying (source/verify.c): dlshard verify's reading of every record ---- */

/* Decoders and buffers for checking, made once for all paths; ON_DATASET (may be NULL) is called
 * for each dataset (an MDS dataset, an image folder) once loaded, before its samples are read. */
int dl__checker_new(dl__checker **out,
                    void (*on_dataset)(const char *path, const dl__format *f, dl__verified *n, FILE *out, void *arg),
                    void *arg);
void dl__checker_free(dl__checker *c);
/* The whole image at P (N bytes; zstd-compressed where ZST, raw pixels where PIL) decoded. */
int dl__check_image(dl__checker *c, const uint8_t *p, size_t n, bool zst, bool pil, dl__err *e);
/* A tensor value as the loader takes it: a .npy payload (zstd-compressed where ZST) whose header
 * parses and whose data holds its whole shape. */
int dl__check_npy(dl__checker *c, const uint8_t *p, size_t n, bool zst, dl__err *e);
/* Sample S of DS, read into BYTES: its image decoded, its tensor values checked. */
int dl__check_sample(dl__checker *c, const dl__dataset *ds, const dl__sample *s, const uint8_t *bytes, dl__err *e);
/* A JPEG field whose scan byte is 1 (docs/format.md): 0 when it is so, else the error into E. */
int dl__check_scan_claim(const uint8_t *p, size_t n, dl__err *e);
/* Sample S of DS read (from FD, the shard's copy; FD -1: as the loader reads it, its checksum
 * checked) and checked; true when E says what the loader would find wrong with it. HAS_IMAGES:
 * the dataset's samples have images, so one without is skipped. */
bool dl__verify_sample(dl__checker *c, const dl__dataset *ds, const dl__sample *s, bool has_images, int fd,
                       dl__buf *buf, dl__err *e);
/* Whether any sample of DS has an image: then the loader skips those without one. */
bool dl__any_image(const dl__dataset *ds);
#define DL__NO_IMAGE "sample has no image member, where the others have one: the loader skips it"
/* Sample S of DS read whole into BUF (its record's checksum checked), with a message on failure. */
int dl__sample_read(const dl__dataset *ds, const dl__sample *s, dl__buf *buf);
/* An MDS column's value as a .npy payload (version 1.0 header, little-endian) into OUT. */
int dl__npy_of_mds(const struct dl__mds_spec *spec, const uint8_t *p, size_t n, dl__buf *out, size_t *len, dl__err *e);
/* The verify of a dataset named by its path (MDS, image folder): loaded as the loader loads it,
 * each sample then read and checked; samples the load left out are named by its warnings and
 * counted as bad. Its files count as shards (MDS) or images. */
int dl__dataset_verify(const char *path, int fd, uint64_t size, dl__checker *c, dl__verified *n, FILE *out);

/* ---- saved indexes (source/index_file.c) ---- */

/* A tar's index saved beside the shard or in the user's cache folder. The magic changes
 * whenever a shard's index would come out otherwise (08: sparse members are left out). */
#define DL__INDEX_FILE_MAGIC "RFTIDX08"
int dl__index_file_read(dl__dataset *ds, uint32_t file, const char *path, const dl__shard_id *id);
/* Whether shard PATH has an index file made from it (ID), by its header alone. */
bool dl__index_file_current(const char *path, const dl__shard_id *id);
void dl__index_file_write(const dl__dataset *ds, size_t first, const char *path, const dl__shard_id *id);
/* The samples of cache bytes P (LEN of them) into DS as file FILE, when they match ID; -1 when not
 * (the cache is untrusted: every field is checked). */
int dl__index_file_parse(dl__dataset *ds, uint32_t file, const uint8_t *p, size_t len, const dl__shard_id *id);
/* Whether PATH names a saved index (<shard>.rfidx), which a glob over a shard folder also matches:
 * no shard, and left out of a list; if so, WHY (CAP bytes, may be NULL) says so, naming its shard. */
bool dl__is_index_file(const char *path, char *why, size_t cap);

/* ---- .npy payloads (source/npy.c) ---- */

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

/* ---- MosaicML Streaming's MDS datasets (source/mds.c) ---- */

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
/* ---- token files (source/tokens.c) ---- */

/* Loads a token source ("tokens:" stripped): windows of seq_len+1 tokens as samples. */
int dl__tokens_load(dl__dataset *ds, const char *paths, int token_bytes, int seq_len);

#endif /* RINGFEED_SOURCE_H */
