/*
 * The core (the .c files of lib/ itself): the loader and its batches, the ring of slots, the workers, the sampler and
 * the tensor fields, the options and the stats. It drives the earlier stages (source/, io/,
 * decode/) and hands batches to the GPU stage (gpu/) through the entry points declared at the end
 * of this header, which gpu/ implements (gpu/none.c where CUDA is not built).
 *
 * Lock order: l->mu is the loader's one lock; the shard cache's own (io/shard_cache.c) is taken
 * before it, never after. Counters in dl__stats are relaxed atomics (read once, for the stats);
 * l->cancel is relaxed too: a flag decodes poll, whose setter joins the threads after.
 */
#ifndef RINGFEED_CORE_H
#define RINGFEED_CORE_H

#include "decode/jpeg.h"
#include "internal.h"
#include "io/io.h"
#include "options.h"
#include "sampler.h"
#include "source/source.h"

enum { DL__SLOT_FREE, DL__SLOT_FILLING, DL__SLOT_COMPLETE, DL__SLOT_HELD };

enum { DL__GPU_ENGINE_HW = 1, DL__GPU_ENGINE_CUDA = 2 };

/* A sample of a host slot that the GPU decodes (planned by a worker: gpu/plan.c). */
typedef struct dl__gpu_job {
  uint32_t at, len;      /* the JPEG's bytes in the slot's arena; len 0: decoded on the CPU */
  int32_t width, height; /* the image */
  int32_t roi[4];        /* x, y, w, h: what nvJPEG decodes (the crop and its filter's reach) */
  float rect[4];         /* the crop, in image pixels */
  uint8_t scale;         /* 1, 2, 4 or 8: the CPU path's DCT scaling for this crop, which the GPU path
                          * reproduces by averaging blocks of pixels before resampling */
  uint64_t key;          /* of its draws, for a decode on the CPU when nvJPEG refuses it */
  int64_t index;         /* in the dataset, to name it */
  uint8_t flip;
  uint8_t engine;        /* DL__GPU_ENGINE_* */
  uint8_t walk;          /* 1: gpu_check's read of its scan is left to the device (gpu/walk.cu) */
} dl__gpu_job;

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
  int64_t image_shape[4], image_strides[4], label_shape[1];
  int err;           /* the failure of the first failing sample, with on_error=fail */
  int err_i;         /* ... and that sample's place, so the report does not depend on timing */
  char errmsg[DL__MSG_MAX];
  uint8_t *image;    /* host image bytes for this slot */
  int64_t *label;
  const char **key;
  dl__buf key_text;  /* the keys joined, by dl_batch_keys_text */
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
  _Atomic int64_t cpu_decode_ns, gpu_plan_ns; /* the workers' time on those decodes; on the GPU's (gpu_check) */
  _Atomic int64_t gpu_decoded, gpu_fallbacks; /* by nvJPEG; refused by it and decoded on the CPU */
  dl__io_counts io;                           /* the io stage's: requests, retries, the shard cache's */
  _Atomic int64_t placed;       /* samples whose tensors were read straight into the slot */
  _Atomic int64_t placed_again; /* and those read again whole instead (a .npy header not as assumed) */
  int64_t check_kept, check_shards; /* GPU check verdicts an earlier run left; the shards' writer gave */
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
  _Atomic int64_t release_wait_ns; /* copy threads waiting for the consumer (thread or GPU) to free a slot */
  _Atomic int64_t copy_wait_workers_ns; /* copy threads waiting for the workers' next host batch */
  double first_batch_ms, first_filled_ms; /* the first batch handed out, and filled by the workers (under mu) */
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

/* A sample of a batch as hybrid's split ranks it (gpu/policy.c). */
typedef struct dl__split_rank {
  float cost;     /* a worker's decode of it, in whole decodes (dl__split_cost) */
  uint8_t spread; /* 0: one of an even spread of the workers' share over the batch (the tie-break) */
  int i;
} dl__split_rank;

/* Hybrid's measurements (gpu/policy.c, under l->mu). */
typedef struct dl__split {
  double gpu_ms, cpu_ms, walk_ms; /* smoothed ms an image: the GPU's; a worker's, and its plan of a GPU one */
  double balanced;        /* the share at which both sides would finish together */
  int votes;              /* batches since the last step: + the GPU should take more, - less */
  int64_t cpu_decoded, cpu_ns, planned, plan_ns, starved, release_wait_ns; /* the counters at the last update */
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
  double t, wait, slot, last, gap; /* the window's start: time, the consumer's and the workers' waits; the last batch, the longest gap */
  int64_t batches, starved; /* and the batches handed out, and those the consumer waited for */
  int waiting; double since; /* workers waiting for a free slot now, and the sum of their waits' starts */
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
  size_t image_bytes; /* one batch's image bytes in a host slot */
  size_t sample_bytes;
  /* Host batches in a float dtype (device=cpu): the workers normalise each image themselves. */
  bool host_float;
  dl__affine affine;
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
  dl__io_env io_env;         /* what its readers see of it */
  dl__image_spec image_spec; /* what its images become */
  char workers_reason[256], prefetch_reason[200]; /* how workers= and prefetch= were chosen */
  bool remote; /* every file is a URL: read through dl__io_http_ops */
  /* Reads that failed in a row for the storage's sake: local reads with an I/O error (worker.c),
   * requests that failed after every retry (5xx, 429, timeouts, resets; not 404s nor a changed
   * object: io/http.c). At DL__STORAGE_DOWN the storage or server is down, and a sample it
   * fails is the run's error whatever on_error says (ring.c). Relaxed: a count, read alone. */
  _Atomic int read_failures;
  struct dl__shard_cache *cache; /* cache_dir=: whole remote shards on local disk (io/shard_cache.c) */
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
  /* JPEG decoding on the GPU, chosen at open (gpu/policy.c). */
  int decode;          /* DL__DECODE_CPU, _GPU or _HYBRID: what runs */
  char decode_reason[256];
  bool gpu_hw, gpu_walk; /* engines decode (else nvJPEG's CUDA decoder); the GPU reads unread scans */
  size_t gpu_pool;     /* device bytes for one batch's decoded JPEGs: a larger image goes to the CPU */
  size_t arena_bytes;  /* per host slot, for the compressed JPEGs */
  bool decode_starting; /* decode=auto: nvJPEG starts while the workers decode every JPEG (under mu) */
  double share;        /* hybrid: the GPU's share of the next batch opened (under mu) */
  dl__split split;
  dl__pace pace;
};

/* Frees L (open.c), once closed and its last batch given back. */
void dl__loader_free(dl_loader *l);
/* DL_EFORKED, with the message, in a child of fork() of the process that opened L; else 0. */
int dl__forked(const dl_loader *l);
/* Pinned host memory held by all loaders of the process (the stats'; a soak test samples it). */
extern _Atomic size_t dl__pinned_in_process;

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
/* What the shard cache fetches ahead by: the claims' position, and the files of the samples the
 * next batches hold, in order (each callback takes l->mu). */
dl__upcoming dl__ring_upcoming(dl_loader *l);
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

/* ---- the GPU stage's entry points (gpu/; gpu/none.c without CUDA) ---- */

/* Checks the devices and sets up l->cuda (before the host slots are allocated). */
int dl__cuda_open(dl_loader *l);
/* Allocates device slots and starts a copy thread per device (after the host slots exist). */
int dl__cuda_start(dl_loader *l);
/* Stops the copy threads (workers are already stopped). */
void dl__cuda_stop(dl_loader *l);
/* Frees device memory, streams, events and decoders. NULL l->cuda is a no-op. */
void dl__cuda_close(dl_loader *l);
/* Host memory for the slots: pinned (after dl__cuda_start, in the background) when a device is in use. */
void *dl__host_alloc(dl_loader *l, size_t bytes);
void dl__host_free(dl_loader *l, void *p, size_t bytes);
int dl__cuda_field(const dl_batch *b, const char *name, DLTensor *out);
int dl__cuda_wait(dl_batch *b, void *stream);
int dl__cuda_copy(dl_batch *b, void *dst, const void *src, size_t bytes, void *stream);
/* Under l->mu, when a device batch's last reference goes: records the consumer's event. */
void dl__cuda_release_locked(dl_batch *b);
/* Under l->mu: whether the consumer's GPU is still running work it queued before its last
 * release on device STREAM (so a consumer waiting now for a batch does not leave it idle). */
bool dl__cuda_consumer_busy_locked(dl_loader *l, int stream);
int dl__cuda_stats(dl_loader *l, char *buf, size_t cap);

/* The decode option's policy (gpu/policy.c). Whether the options let a device decode JPEGs
 * (before anything is started: what to set aside for it). */
bool dl__decode_may_use_gpu(const dl_loader *l);
/* At open: where JPEGs are decoded (l->decode, with the reason in l->decode_reason, logged
 * once). decode=gpu|hybrid that cannot run fails with DL_ENODEVICE; decode=auto falls back to
 * the CPU. Then sizes the arenas (l->arena_bytes) from the dataset's JPEG sizes. */
int dl__decode_choose(dl_loader *l);
/* Whether a thread feeds a GPU's JPEG decoder, now or once nvJPEG starts (workers=auto leaves it a CPU). */
bool dl__decode_feeds_gpu(const dl_loader *l);
/* How many of a batch of LEN samples opened now the workers decode (under l->mu). */
int dl__split_cpu_n(const dl_loader *l, int len);
/* Hybrid: which side of a batch split at GPU share X holds it back, by the measured time per image
 * (GPU_MS on a device's decoders, CPU_MS on one worker, WALK_MS of a worker's for each image the
 * GPU takes) with WORKERS at work for the device: each side's part of a batch of B in ms, and
 * "gpu", "cpu", or "neither" within a tenth of each other (the split at its balance: the batch
 * comes at both sides' rates together). NULL before both rates are measured. */
const char *dl__split_limit(double x, int b, double gpu_ms, double cpu_ms, double walk_ms, double workers,
                            double *gpu_part, double *cpu_part);
/* The bytes of a host slot's arena for the dataset's JPEGs (0 without JPEGs the GPU may take). */
size_t dl__gpu_arena_size(const dl_loader *l);
/* Hybrid, when batch B opens (under l->mu): which b->cpu_n of its samples the workers decode
 * (b->on_cpu). A function of the samples' draws and the split only. */
void dl__gpu_split_batch(dl_loader *l, const dl__sampler *sm, dl_batch *b);
/* At a claim (under l->mu): room in B's arena for sample I's bytes when the GPU may decode it,
 * else NULL. Deterministic: claims of a batch are made in sample order. */
uint8_t *dl__gpu_arena_take(dl_loader *l, dl_batch *b, int i, const dl__sample *s);
/* On a worker, for a JPEG whose bytes are in slot B's arena (or copied there from IMAGE):
 * whether the GPU takes it. If so, fills b->jobs[i] and returns true; a JPEG that nvJPEG should
 * not see (progressive on the engine, CMYK, 12-bit, truncated, too large ...) stays on the CPU. */
bool dl__gpu_plan(const dl_loader *l, dl_batch *b, int i, int64_t index, uint8_t *arena_at, const uint8_t *image,
                  size_t len, uint64_t key);
/* The GPU check's verdicts on JPEG scans kept across runs (gpu/check_verdicts.c): read at open into
 * l->jpeg_rows, written at close when the run read any scan. */
void dl__check_verdicts_load(dl_loader *l);
void dl__check_verdicts_save(dl_loader *l);

#endif /* RINGFEED_CORE_H */
