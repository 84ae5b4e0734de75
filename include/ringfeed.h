/*
 * ringfeed: a data loader that keeps GPUs fed.
 * SPDX-License-Identifier: MIT (see LICENSE)
 *
 * This header is the whole public contract: what is not declared here is not API.
 *
 * Threading: dl_next_batch() and dl_next_batch_on() may be called from several threads at once
 * (each call takes the next batch in order). dl_close() may be called from another thread while
 * others wait in dl_next_batch(): they return DL_ECLOSED, and dl_close() returns once they have
 * left. Other calls on a loader (dl_state_save, dl_stats_json) are made by one thread at a time and
 * not during dl_close(). dl_batch_* accessors and dl_batch_release may be called from any thread.
 * Error functions are thread-safe; dl_last_error() is per thread.
 *
 * dl_close() returns within tens of milliseconds: decodes and reads in flight are abandoned.
 *
 * fork(): a child has a copy of its parent's loaders but none of their threads. There, loader
 * calls return DL_EFORKED, dl_batch_release() and dl_close() release nothing (the copy goes with
 * the child), and batches taken before the fork can still be read. A child opens its own loaders.
 *
 * Signals: the library blocks none. With io=mmap it installs a SIGBUS handler (once, chained to
 * the one before it) so that a shard cut short under its mapping gives per-sample errors.
 *
 * Files changed under an open loader: each shard is read through the descriptor opened with the
 * loader, so a deleted or renamed-over shard is still read whole; bytes overwritten in place are
 * read as they now are (checksummed .rfs records then fail); a truncated shard makes every sample
 * past its new end an error naming shard, member and "truncated". The next dl_open indexes a
 * shard again when its size, mtime, ctime or inode differ from the cached index.
 *
 * Limits on untrusted input: images above max_pixels (64 MP) and members above max_member_bytes
 * (256 MiB; also the most a zstd member may inflate to) are per-sample DL_ELIMIT errors; a source
 * pattern may expand to at most 1,000,000 paths; .npy shapes whose size overflows are DL_ELIMIT.
 * Failed reads and allocations are errors naming the file, never a crash; with on_error=skip each
 * failed sample is zeros, counted in the stats and logged with shard, member and reason.
 *
 * Return values: every int function returns >= 0 on success and a negative code on failure,
 * either -errno or one of the DL_E* codes below. Codes are never renumbered.
 */
#ifndef RINGFEED_H
#define RINGFEED_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(DL_BUILDING_LIBRARY)
#define DL_EXTERN __attribute__((visibility("default")))
#else
#define DL_EXTERN
#endif

#define DL_VERSION_MAJOR 0
#define DL_VERSION_MINOR 1
#define DL_VERSION_PATCH 0

/* End of the last epoch: a positive value, returned by dl_next_batch(). */
#define DL_EOF 1

/*
 * Project error codes: negative, far below any -errno. X(name, value, message).
 * The list makes the enum, dl_strerror() and dl_errname().
 */
#define DL_ERRNO_MAP(X)                                                                            \
  X(DL_ECORRUPT, -1001, "corrupt input")                                                         \
  X(DL_EUNSUPPORTED, -1002, "unsupported input")                                                 \
  X(DL_ECUDA, -1003, "CUDA error")                                                               \
  X(DL_ELIMIT, -1004, "input exceeds a configured limit")                                        \
  X(DL_EOPTION, -1005, "bad option")                                                             \
  X(DL_ESTATE, -1006, "bad resume token")                                                        \
  X(DL_EBUSY, -1007, "the consumer holds every batch slot")                                      \
  X(DL_ENOSAMPLES, -1008, "no samples")                                                          \
  X(DL_ENODEVICE, -1009, "no such device")                                                       \
  X(DL_ENOFIELD, -1010, "no such field")                                                         \
  X(DL_ECLOSED, -1011, "the loader was closed")                                                 \
  X(DL_EFORKED, -1012, "the loader belongs to the parent of this fork()")                        \
  X(DL_EREMOTE, -1013, "a remote source failed")

enum dl_error {
#define DL__ERR_ENUM(name, value, msg) name = value,
  DL_ERRNO_MAP(DL__ERR_ENUM)
#undef DL__ERR_ENUM
};

typedef struct dl_loader dl_loader;
typedef struct dl_batch dl_batch;

/* Library version as "MAJOR.MINOR.PATCH"; static storage. */
DL_EXTERN const char *dl_version(void);

/* Message for a code returned by any dl_ function (negative errno or DL_E*); static storage. */
DL_EXTERN const char *dl_strerror(int err);

/* Symbolic name of a code ("DL_ECORRUPT", "ENOENT", "DL_EOF"); static storage. */
DL_EXTERN const char *dl_errname(int err);

/* 1 if KEY is one of dl_open's option keys ("batch_size"), else 0, and dl_last_error() says what
 * dl_open would ("unknown option 'batchsize' (did you mean batch_size?)"). Thread-safe. */
DL_EXTERN int dl_option_exists(const char *key);

/*
 * The calling thread's message for its last failed call, with context (shard, member, offset,
 * option). Valid until the thread's next dl_ call that fails.
 */
DL_EXTERN const char *dl_last_error(void);

/*
 * Opens a loader over SOURCE: WebDataset tar shards or ringfeed shards (.rfs), a list separated by
 * "::", globs and brace ranges ("train-{000000..000146}.tar"), or an ImageFolder directory
 * (root/<class>/<image>); shards may be http:// or https:// URLs (lists and brace ranges, not
 * globs) or s3://bucket/key (globs too), all of a loader's or none.
 * OPTIONS are "key=value" words separated by spaces (NULL or "" for defaults); a value with spaces
 * is written in double quotes (cache_dir="/mnt/My Drive/cache"):
 *   batch_size workers prefetch image_size(N or HxW) crop(random_resized|center|resize|none)
 *   flip channels(1|3) layout(NHWC|NCHW|channels_last) seed shuffle shuffle_block(K shards) epochs(0 = forever)
 *   repeat(R1,R2,...: each "::" part of the source R times an epoch; 0.5 a new half each epoch)
 *   start_epoch drop_last rank
 *   world_size device(cpu|cuda|cuda:N[,M...]) dtype(uint8|float32|float16|bfloat16) mean std
 *   device_slots on_error(skip|fail) io(auto|uring|pread|mmap) io_depth max_pixels max_member_bytes
 *   direct(0|1: O_DIRECT reads of ringfeed shards) pad(0|1) seq_len resume(TOKEN)
 *   retries timeout_ms ca_file s3_addressing(auto|path|virtual) cache_dir cache_limit(50G)
 *   (remote sources) fields(a,b)
 *   log(quiet|error|warn|info|debug) decode(auto|cpu|gpu|hybrid: where JPEGs are decoded; auto is
 *   hybrid on CUDA when nvJPEG loads, the workers decoding every JPEG while it starts in the
 *   background) gpu_share(auto|0..1) gpu_decode_mb gpu_check(1|0: a JPEG's entropy-coded data is
 *   read through on the CPU once a sample before the GPU may decode it; what it finds is kept in
 *   the cache folder for later runs of the same shards or folder; 0 reads only multi-scan
 *   files, progressive and one-component-a-scan) keep_gpu_decoders(1|0: nvJPEG's decoders outlive
 *   dl_close, for the process's next loader of the same batch size, which then decodes on the GPU
 *   from its first batch instead of waiting about a second for nvJPEG to start)
 * decode=gpu|hybrid fail with DL_ENODEVICE, naming the reason, where nvJPEG or a GPU is missing.
 * A build with CUDA, when loaded, sets CUDA_DEVICE_MAX_CONNECTIONS=32 where it is unset: with
 * CUDA's 8 hardware queues the loader's GPU work waits behind the model's. It takes effect only
 * if CUDA starts after that; the stats' cuda_queues says what applies.
 * A SOURCE of "tokens:FILES" reads flat binary token files (dtype=uint16|uint32, seq_len=L) as
 * windows of L+1 tokens.
 * An unknown key or bad value fails with DL_EOPTION and a message naming it.
 * On success *out owns worker threads and memory until dl_close(). Not thread-safe against other
 * calls on the same loader.
 */
DL_EXTERN int dl_open(dl_loader **out, const char *source, const char *options);

/*
 * Blocks until the next batch in order is complete and sets *out to it: returns 0 with a batch,
 * DL_EOF after the last epoch, or a negative code (with on_error=fail, the first failed sample's
 * error). The batch stays valid until dl_batch_release(). DL_EBUSY if the consumer holds every
 * prefetch slot, which would otherwise never complete.
 */
DL_EXTERN int dl_next_batch(dl_loader *l, dl_batch **out);

/*
 * With several devices (device=cuda:0,1,...), the next batch of device DEV's own stream (DEV is
 * an index into the device list). dl_next_batch() is dl_next_batch_on(l, 0, out).
 */
DL_EXTERN int dl_next_batch_on(dl_loader *l, int dev, dl_batch **out);

/*
 * dl_next_batch_on() that waits at most TIMEOUT_MS milliseconds (negative: without a limit) and
 * then returns -ETIMEDOUT with no batch. Lets a caller wait in slices and stay responsive (the
 * Python binding waits this way, so that Ctrl-C interrupts a wait for a batch).
 */
DL_EXTERN int dl_next_batch_timed(dl_loader *l, int dev, int timeout_ms, dl_batch **out);

/* Number of samples in the batch (B, or fewer in a final partial batch). */
DL_EXTERN int dl_batch_size(const dl_batch *b);

/* Key of sample I ("shard-000001/000123" style); owned by the loader; NULL if I is out of range. */
DL_EXTERN const char *dl_batch_key(const dl_batch *b, int i);
/* The keys of all dl_batch_size(b) samples at once, owned by the loader until the batch is released
 * (one call a batch where a binding's calls cost more than the loop over them); NULL for no batch. */
DL_EXTERN const char *const *dl_batch_keys(const dl_batch *b);
/*
 * The keys of all dl_batch_size(b) samples as one string, each key ended by a '\0', and in *LEN its
 * bytes, '\0's included: owned by the loader until the batch is released or this is called again
 * for it. A binding decodes one string a batch rather than reading B. Call it from the thread that
 * holds the batch; NULL (and dl_last_error) for no batch, one released already, or no memory.
 */
DL_EXTERN const char *dl_batch_keys_text(dl_batch *b, size_t *len);

/* 0 if sample I was delivered as read, else the error that made it a substitute (on_error=skip). */
DL_EXTERN int dl_batch_sample_error(const dl_batch *b, int i);

/* How many of the batch's samples have an error (0 almost always: one call instead of B). */
DL_EXTERN int dl_batch_errors(const dl_batch *b);

/* Position of the batch: its epoch, and its index within that whole epoch for this rank: in a
 * first epoch resumed part-way the batches handed out before the state was saved count too, so an
 * epoch's last batch is always at index dl_batches_per_epoch() - 1. */
DL_EXTERN int dl_batch_position(const dl_batch *b, int64_t *epoch, int64_t *index);

/* Batches this rank (device 0 of the process) gets in EPOCH of the run: dl_batches_per_epoch(),
 * fewer in a first epoch resumed part-way (its first at index dl_batches_per_epoch() minus that),
 * 0 for epochs outside the run. */
DL_EXTERN int64_t dl_epoch_batches(const dl_loader *l, int64_t epoch);

/*
 * Describes field NAME ("image", "label") as a DLTensor whose data, shape and strides point into
 * the batch (no copy; valid until release). "image" is uint8 [B,H,W,C] (or [B,C,H,W] with
 * layout=NCHW, or the configured float dtype on a CUDA device); with layout=channels_last it is
 * [B,C,H,W] over [B,H,W,C] memory, the only tensor whose strides are not NULL (compact, row-major).
 * "label" is int64 [B], -1 where a sample has no .cls member. Tensor fields (.npy members, raw fields of .rfs shards, token windows)
 * come as [B, ...] of their own dtype, with "<name>_len" int64 [B] under pad=1. DL_ENOFIELD for an
 * unknown name.
 */
DL_EXTERN int dl_batch_field(const dl_batch *b, const char *name, DLTensor *out);

/* Number of tensor fields every batch of this loader has, and the name of field I (0 <= I < count). */
DL_EXTERN int dl_batch_field_count(const dl_batch *b);
DL_EXTERN const char *dl_batch_field_name(const dl_batch *b, int i);

/*
 * Members delivered as they are: every member of a sample that is not its image, its label or a
 * tensor, named as WebDataset names them (everything after the first dot of the base name:
 * "000123.caption.txt" is field "caption.txt"). dl_batch_bytes() gives sample I's bytes of field
 * NAME and their length in *LEN (followed by a NUL not counted), or NULL when the sample has no
 * such member; valid until the batch is released. The option fields=a,b keeps only the fields
 * named (tensors and bytes alike); the others are then not read.
 */
DL_EXTERN int dl_batch_bytes_count(const dl_batch *b);
DL_EXTERN const char *dl_batch_bytes_name(const dl_batch *b, int f);
DL_EXTERN const void *dl_batch_bytes(const dl_batch *b, const char *name, int i, size_t *len);
/* What bytes field F holds: "text" (UTF-8), "json" or "bytes". Where the source types its
 * columns (MDS: str, json, bytes, pkl ...) that type; else the name's last extension says ("txt"
 * and "text": text, "json": JSON). NULL for no such field. */
DL_EXTERN const char *dl_batch_bytes_kind(const dl_batch *b, int f);

/*
 * Exports field NAME as a DLManagedTensor. Each export holds a reference to the batch; the batch
 * returns to the loader once it has been released and every export's deleter has run. Export
 * before the release: a released batch gives -EINVAL.
 */
DL_EXTERN int dl_batch_export(dl_batch *b, const char *name, DLManagedTensor **out);

/*
 * Copies field NAME (all of it, as dl_batch_field describes it) into DST, which holds CAP bytes.
 * For a device batch DST is device or host memory, and the copy is queued on STREAM after the
 * batch's copy, as dl_batch_wait orders it; for a host batch it is done before the call returns.
 * The copy holds nothing of the batch: the way to keep a batch's labels past its release without
 * a tensor of the slot. Copy before the release.
 */
DL_EXTERN int dl_batch_copy(dl_batch *b, const char *name, void *dst, size_t cap, void *stream);

/*
 * Makes STREAM (a cudaStream_t; NULL for the legacy default stream) wait for the batch's copy
 * without blocking the host. A no-op for host batches.
 */
DL_EXTERN int dl_batch_wait(dl_batch *b, void *stream);

/*
 * Hands the batch back. For device batches the library records an event on STREAM, and the next
 * copy into that device slot waits on it, so work queued on STREAM may still read the batch.
 * Releasing NULL is a no-op; releasing a batch again before the loader hands its slot out anew
 * does nothing but log a warning.
 */
DL_EXTERN void dl_batch_release(dl_batch *b, void *stream);

/* Number of batches each epoch holds for this rank (the first epoch after a resume may be shorter). */
DL_EXTERN int64_t dl_batches_per_epoch(const dl_loader *l);

/* The name of class LABEL when the source is an ImageFolder (root/<class>/...): its class folder's
 * name, as torchvision's ImageFolder.classes[LABEL]; likewise for ringfeed shards that carry their
 * class names (dlshard create from an ImageFolder, dl_writer_classes). NULL past the last class,
 * and for a source whose labels nothing names (tar shards, or parts of different classes in one
 * list). */
DL_EXTERN const char *dl_class_name(const dl_loader *l, int64_t label);

/*
 * Writes a printable resume token (no spaces, NUL-terminated) that continues right after the last
 * batch handed out; pass it back as resume=TOKEN. Returns its length, or -ENOSPC if CAP is short.
 */
DL_EXTERN int dl_state_save(dl_loader *l, char *buf, size_t cap);

/* Writes the loader's counters as one JSON object; returns its length or -ENOSPC. */
DL_EXTERN int dl_stats_json(dl_loader *l, char *buf, size_t cap);

/* Stops the workers and frees the loader; NULL is a no-op. Calls waiting in dl_next_batch() on
 * other threads return DL_ECLOSED first. Batches the consumer still holds become invalid, except
 * through tensors exported with dl_batch_export(), which keep their batch until their deleter runs. */
DL_EXTERN void dl_close(dl_loader *l);

/* ---- Writing ringfeed shards (.rfs; docs/format.md) ---- */

typedef struct dl_writer dl_writer;

/*
 * Creates a ringfeed shard at PATH (replacing it when the writer closes successfully; the data
 * goes to PATH.part until then). OPTIONS: "align=4096" (record alignment: 1 or a power of two up to
 * 1 MiB; 4096 lets readers use O_DIRECT), "zstd_level=3". Not thread-safe; one writer per file.
 */
DL_EXTERN int dl_writer_open(dl_writer **out, const char *path, const char *options);

/* Starts a record with KEY (no NUL inside, at most 4095 bytes) and LABEL (-1: none). */
DL_EXTERN int dl_writer_begin(dl_writer *w, const char *key, int64_t label);

/*
 * Adds field NAME to the current record: CODEC "raw" or "jpeg"/"png" (bytes stored as given) or
 * "zstd" (DATA is compressed here and decompresses back to exactly SIZE bytes). An image codec's
 * DATA is the encoded file: bytes of another image format, or an array's .npy payload, are refused
 * (DL_EOPTION, naming what they are). On failure the current record is dropped, nothing of it
 * written: the next record starts with dl_writer_begin.
 */
DL_EXTERN int dl_writer_field(dl_writer *w, const char *name, const char *codec, const void *data, size_t size);

/* Writes the current record: its fields, padding to the alignment, and its checksum. */
DL_EXTERN int dl_writer_end(dl_writer *w);

/* The names of the shard's classes, label i naming class i (N of them, each 1..65535 bytes), as
 * an ImageFolder's sorted folders name them: readers give them back through dl_class_name(). Any
 * time before dl_writer_close; a second call replaces the first, N = 0 writes none, and a call that
 * fails leaves the table as it was. */
DL_EXTERN int dl_writer_classes(dl_writer *w, const char *const *names, size_t n);

/* Writes the index and trailer, renames PATH.part to PATH and frees W (also on failure). */
DL_EXTERN int dl_writer_close(dl_writer *w);

/* Abandons the shard: removes PATH.part and frees W. NULL is a no-op (and for the calls above,
 * -EINVAL). */
DL_EXTERN void dl_writer_abort(dl_writer *w);

#ifdef __cplusplus
}
#endif

#endif /* RINGFEED_H */
