/*
 * The loader's options as every stage reads them: one struct filled by dl__options_parse from
 * "key=value" words (options.c, whose table names each option's type, range and help).
 */
#ifndef RINGFEED_OPTIONS_H
#define RINGFEED_OPTIONS_H

#include "internal.h"

#include <stdio.h>

enum { DL__CROP_RANDOM_RESIZED, DL__CROP_CENTER, DL__CROP_RESIZE, DL__CROP_NONE };
enum { DL__LAYOUT_NHWC, DL__LAYOUT_NCHW, DL__LAYOUT_CHANNELS_LAST }; /* the last: NCHW shape, NHWC memory */
enum { DL__DTYPE_UINT8, DL__DTYPE_FLOAT32, DL__DTYPE_FLOAT16, DL__DTYPE_BFLOAT16, DL__DTYPE_UINT16,
       DL__DTYPE_UINT32 };
enum { DL__ON_ERROR_SKIP, DL__ON_ERROR_FAIL };
enum { DL__IO_AUTO, DL__IO_URING, DL__IO_PREAD, DL__IO_MMAP };
enum { DL__DECODE_AUTO, DL__DECODE_CPU, DL__DECODE_GPU, DL__DECODE_HYBRID };

#define DL__MAX_PARTS 256 /* "::" parts of a source that repeat= can weigh */
#define DL__MAX_PATHS 1000000 /* the shards one pattern may name: braces expanded, or a listing's matches */

typedef struct dl__options {
  int batch_size;
  int workers;  /* 0: auto (dl_open chooses: choose_workers in open.c) */
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
  int host_ranks, host_rank; /* torchrun's LOCAL_WORLD_SIZE and LOCAL_RANK (1 and 0 without): the ranks
                              * of this job that share the host's CPUs and memory, and this one's place */
  int ndevices; /* 0: host batches */
  int device_ids[DL__MAX_DEVICES];
  int dtype;
  float mean[3], std[3]; /* on the 0..1 scale of pixels */
  bool mean_std_255;      /* ... given on the 0..255 scale, and divided by 255 */
  bool mean_std_given;    /* either given (they apply to float batches only) */
  int device_slots;
  int worker_nice; /* the workers' nice increment over the process's */
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
  int keep_gpu_decoders; /* nvJPEG's decoders outlive dl_close, for the process's next loader */
} dl__options;

enum { DL__S3_AUTO, DL__S3_PATH, DL__S3_VIRTUAL };

int dl__options_parse(dl__options *o, const char *text);
/* Bytes of one image value of DTYPE (DL__DTYPE_*). */
static inline int dl__dtype_bytes(int dtype) { return dtype == DL__DTYPE_UINT8 ? 1 : dtype == DL__DTYPE_FLOAT32 ? 4 : 2; }
/* Every option with its values and default: a line each, or a Markdown table (docs/options.md). */
void dl__options_doc(FILE *out, bool markdown);

#endif /* RINGFEED_OPTIONS_H */
