/*
 * What ringfeed's own command-line tools (dlshard, dlbench's synthetic set) use of the library
 * beyond ringfeed.h: sources as lists of samples, each written into a ringfeed shard; verifying,
 * indexing and listing shards and datasets; and the few file and URL helpers the tools share with
 * the loader. Narrow on purpose, as curl's curlx serves its tool: no internal struct shows through,
 * and these names are not public API (the installed header is ringfeed.h alone).
 */
#ifndef RINGFEED_TOOLS_H
#define RINGFEED_TOOLS_H

#include "ringfeed.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- paths, files and URLs (tools/paths.c) ---- */

/* The paths ARG names, as the loader expands a source: brace ranges ({000..146}, {a,b}), then
 * globs, local or (s3://, hf://) listed; *N of them in *OUT, each and the array freed by
 * dl_tool_free_paths. What cannot be expanded is named on ERR, each line after WHO ("dlshard: "),
 * and the whole of ARG fails. */
int dl_tool_paths(const char *arg, char ***out, size_t *n, FILE *err, const char *who);
void dl_tool_free_paths(char **paths, size_t n);
/* Whether PATH is a URL the loader reads (http://, https://, s3://, hf://). */
bool dl_tool_is_url(const char *path);
/* PATH as a message may show it: a URL without its user name and password. Returns BUF. */
const char *dl_tool_shown(const char *path, char *buf, size_t cap);
/* Whether NAME is nearer than *LEAST (which it lowers; start it at 3) to a flag the user TYPED,
 * and near enough to ask "did you mean NAME?": the loader's rule for its options' names. */
bool dl_tool_nearer(const char *typed, const char *name, int *least);
/* PATH opened for reading if it is a regular file (never waiting on a FIFO): its descriptor, or a
 * negative code with a message naming WHAT ("MDS shard") and PATH. */
int dl_tool_open_regular(const char *path, const char *what);
/* mkdir -p: 0 or -errno. */
int dl_tool_mkdirs(const char *dir);
/* N bytes at OFF of FD, through interrupted and short reads: the bytes read, or -errno. */
int64_t dl_tool_pread(int fd, void *buf, size_t n, uint64_t off);
/* Uploads the local file PATH as URL (s3://bucket/key), with the loader's credentials. */
int dl_tool_upload(const char *path, const char *url);

/* Every loader option with its values and default: a line each, or a Markdown table. */
void dl_tool_options(FILE *out, bool markdown);

/* ---- a source's samples into ringfeed shards (tools/convert.c) ---- */

typedef struct dl_tool_source dl_tool_source;
/* Adds the samples of SOURCE (read as dl_open reads it, under OPTIONS: "on_error=fail") to *S,
 * made when NULL. */
int dl_tool_source_add(dl_tool_source **s, const char *source, const char *options);
void dl_tool_source_free(dl_tool_source *s);
size_t dl_tool_source_count(const dl_tool_source *s);
/* The names of S's classes (label i naming the i-th), as dl_class_name gives them, and *N of them;
 * NULL where its labels no name names (see dl_class_name). */
const char *const *dl_tool_source_classes(const dl_tool_source *s, size_t *n);
/* The bytes of sample I's record: what sizes a shard. */
uint64_t dl_tool_sample_bytes(const dl_tool_source *s, size_t i);

/* A thread's buffers for dl_tool_write_sample. */
typedef struct dl_tool_scratch dl_tool_scratch;
dl_tool_scratch *dl_tool_scratch_new(void);
void dl_tool_scratch_free(dl_tool_scratch *t);
/* Sample I of S written into W as one record (dl_writer_begin to dl_writer_end): its key and label,
 * its image as it is (JPEG, PNG, WebP; an MDS column's raw pixels as PNG, a .jpg.zst inflated) and
 * its tensor and bytes fields, once read and checked as `dlshard verify` checks it (the image
 * decoded whole, the tensors parsed). 0: written; a sample the loader would skip is named in WHY
 * (shard, member, reason) and left out (1), or with KEEP_BAD written all the same (2), unless it
 * cannot be read at all (1); a negative code when writing fails. Safe from several threads, each
 * with its own T. */
int dl_tool_write_sample(const dl_tool_source *s, size_t i, dl_writer *w, dl_tool_scratch *t, bool keep_bad,
                         char *why, size_t cap);

/* ---- verify, index, ls (tools/inspect.c) ---- */

/* What verifying found: records the loader would skip, shards and images read, paths unread. */
typedef struct dl_tool_counts {
  long bad, shards, images, unread;
} dl_tool_counts;

typedef struct dl_tool_verifier dl_tool_verifier;
/* Decoders for verifying, made once. ON_MDS (may be NULL) is called for each MDS dataset once it
 * is loaded and before its samples are read (dlshard checks there the digests its index records),
 * with ARG. Verifying quiets the loader's log: each finding is a line on the OUT it is given. */
int dl_tool_verifier_new(dl_tool_verifier **out, void (*on_mds)(const char *path, long *bad, FILE *out, void *arg),
                         void *arg);
void dl_tool_verifier_free(dl_tool_verifier *v);
/* Reads every record of PATH as the loader would: a shard, local or at a URL (downloaded to a
 * temporary file), an MDS dataset's folder or index.json, or an image folder. Each bad record, and
 * each path that cannot be read, is a line on OUT; C counts them. */
void dl_tool_verify(dl_tool_verifier *v, const char *path, dl_tool_counts *c, FILE *out);
/* Calls EACH with every digest the index of the local MDS dataset at PATH records: the file it is
 * of, its algorithm's name in Streaming's spelling ("sha1", "xxh64") and its hex digest; stops at
 * EACH's first nonzero return, which it returns. */
int dl_tool_mds_digests(const char *path, int (*each)(const char *file, const char *algo, const char *hex, void *arg),
                        void *arg);
/* Builds the index of the tar shard PATH (local or remote) and saves it where the loader looks
 * first; its samples in *N. A local ringfeed shard carries its own: *OWN is set, nothing built. */
int dl_tool_index(const char *path, size_t *n, bool *own);
/* Lists PATH on OUT: a ringfeed shard's fields and codecs (VERBOSE: every record, fetching only
 * the index of a remote one), a tar's samples, an MDS dataset's or image folder's. */
int dl_tool_list(const char *path, bool verbose, FILE *out);

#endif /* RINGFEED_TOOLS_H */
