/*
 * The GPU stage. Host batch slots are pinned (cudaHostAlloc), so workers decode straight into
 * memory the copy engine reads. Per device, a copy thread takes complete host batches in order,
 * queues their copy (and the uint8 -> float conversion kernel) on a non-blocking stream into a
 * device slot, records an event and hands the device batch to the consumer at once; the host slot
 * returns to the workers when its copy has finished. A device slot is written again only after
 * the stream waits on the event the consumer's release recorded, so the host never blocks on the
 * GPU and the GPU never overwrites a batch still in use.
 *
 * Lock order: l->mu only (CUDA calls are made without it, except event records on release).
 */
#include "gpu/decode.h"
#include "gpu/nvjpeg.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

typedef struct gpu_slot {
  void *image;         /* device image buffer (the configured dtype and layout) */
  int64_t *label;      /* device labels */
  cudaEvent_t copied;  /* recorded after the batch's copy (and conversion) */
  cudaEvent_t released;
  bool release_pending; /* released was recorded and the copy stream must wait on it */
  /* Recorded on the consumer's stream by its first dl_batch_wait: from there to `copied` its GPU
   * waited for the batch. */
  cudaEvent_t reached;
  atomic_bool reach_pending;
} gpu_slot;

/* A host batch whose copy is queued: its slot returns to the workers once DONE has passed. The
 * events belong to the host slot, which is not queued again before then. */
typedef struct in_flight {
  cudaEvent_t done;
  cudaEvent_t t0, t1;  /* around the copies of its CPU samples and fields */
  cudaEvent_t d0, d1;  /* around the decode of its GPU samples */
  size_t bytes;        /* copied */
  int gpu_samples;     /* decoded on the device; -1: no decode queued */
} in_flight;

typedef struct gpu {
  dl_loader *l;
  int index, id;
  cudaStream_t copy;
  pthread_t thread;
  bool started;
  gpu_slot *slots;
  uint8_t *staging;  /* uint8 landing buffer when the output is float */
  dl__gpu_decoder *dec; /* JPEG decoding on this device, or NULL */
  gpu_slot *last_released; /* the slot the consumer released last (under l->mu) */
  in_flight *inf;    /* per host slot */
  int *q;            /* the host slots queued, oldest first: q[qhead], ... (a ring of prefetch) */
  int qhead, qlen;
  double copy_ms;    /* GPU time of the host-to-device copies */
  int64_t copy_bytes;
  double decode_ms;  /* GPU time of the JPEG decodes (engine, kernels) */
  double decode_host_ms; /* the copy thread's time queueing them (nvJPEG parses on the host, and waits) */
  double decode_cpu_ms;  /* ... of it on a CPU, and the times it was taken off one meanwhile */
  long decode_preempted;
  int64_t decode_batches;
  int64_t batches; /* taken from the workers (its waits for them and for the consumer are l->st's) */
  bool first_past; /* past its first batch, or ended without one (under l->mu) */
  char error[256];
} gpu;

typedef struct cuda_state {
  int n;
  gpu g[DL__MAX_DEVICES];
  size_t out_sample_bytes; /* one sample on the device */
  size_t device_bytes;     /* taken at open, and by decoders started later (under l->mu) */
  /* The starter: pins the host slots while the workers already fill them, then starts nvJPEG
   * when decode=auto left it to start in the background. */
  pthread_t starter;
  bool starter_started;
  int pinned;       /* host slots the starter has pinned (or tried to), in pin_order (under l->mu) */
  bool *registered; /* per host slot (s * prefetch + i): cudaHostRegister took it */
  double pin_ms, decoders_ms; /* the time in cudaHostRegister, and decode=auto's nvJPEG start */
  /* The first batch, from dl_open (under l->mu): its slot pinned, and its copy queued (the copy
   * thread's calls into CUDA, beside nvJPEG's start for decode=auto) */
  double first_pinned_ms, first_queued_ms;
  int first_copy_pinned; /* host slots pinned when the first batch's copy was queued (under l->mu) */
} cuda_state;

/* Slots are pinned in the order the copy threads take them: the first slot of every device, then
 * the second ... */
static int pin_order(const dl_loader *l, int stream, int slot) { return slot * l->nstreams + stream; }


static int cuda_fail(cudaError_t e, const char *what) {
  return dl__fail(DL_ECUDA, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Why CUDA found no device, in the user's terms: the runtime says "driver version is insufficient"
 * also where no driver is installed at all. */
static const char *no_device_reason(cudaError_t e, char *buf, size_t cap) {
  if (e == cudaSuccess)
    return "none found";
  if (e == cudaErrorInsufficientDriver) {
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!driver)
      return "no NVIDIA driver is installed: libcuda.so.1 is not found";
    dlclose(driver);
    int have = 0, need = 0;
    cudaDriverGetVersion(&have);
    cudaRuntimeGetVersion(&need);
    snprintf(buf, cap, "the NVIDIA driver supports CUDA %d.%d, and this ringfeed was built for CUDA %d.%d: a newer "
             "driver is needed", have / 1000, have % 1000 / 10, need / 1000, need % 1000 / 10);
    return buf;
  }
  const char *visible = getenv("CUDA_VISIBLE_DEVICES");
  if (e == cudaErrorNoDevice && visible) {
    snprintf(buf, cap, "%s, with CUDA_VISIBLE_DEVICES=%.64s", cudaGetErrorString(e), visible);
    return buf;
  }
  return cudaGetErrorString(e);
}

/*
 * CUDA feeds a device through a few hardware work queues, 8 unless CUDA_DEVICE_MAX_CONNECTIONS
 * says otherwise when CUDA starts, and streams share them in turn: work queued on one waits for
 * everything queued before it on the others sharing its queue. With 8, the copy stream shared a
 * queue with the consumer's, so each batch's crop kernel waited for the whole step the model had
 * queued (an H200, hybrid beside a consumer stepping at about 1.2x the batch time: GPU idle
 * 0.016-0.021 with 8, 0.004-0.008 with 32; its GPU decode took 8.4-9.0 ms a q90 batch beside the
 * steps with 8, 5.9 with 32). So, loaded before CUDA starts and with the variable unset, ringfeed
 * asks for 32, the most CUDA gives. A value the user set is kept: it is also how to ask for CUDA's
 * own default.
 */
enum { QUEUES_USER, QUEUES_OURS, QUEUES_LATE };
static int queues_how = QUEUES_USER;

__attribute__((constructor)) static void queues_ask(void) {
  if (getenv("CUDA_DEVICE_MAX_CONNECTIONS"))
    return;
  /* libcuda already in the process: CUDA may have started with its default (a PyTorch that made a
   * tensor on the GPU before ringfeed was loaded). The variable set now may come too late. */
  void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (driver)
    dlclose(driver);
  queues_how = driver ? QUEUES_LATE : QUEUES_OURS;
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
}

/* The hardware queues per device, and why, for the log and the stats. */
static int queues_describe(char *why, size_t cap) {
  const char *v = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  char *end = NULL;
  long set = v ? strtol(v, &end, 10) : 0;
  bool whole = v && end != v && *end == '\0' && set >= 1 && set <= 32;
  int n = whole ? (int)set : 8;
  /* The user's text is not echoed: the reason goes into the stats' JSON as it is. */
  if (queues_how == QUEUES_USER && !whole)
    snprintf(why, cap, "CUDA_DEVICE_MAX_CONNECTIONS is set, but not to a whole number from 1 to 32: probably "
             "CUDA's default of 8");
  else if (queues_how == QUEUES_USER)
    snprintf(why, cap, "CUDA_DEVICE_MAX_CONNECTIONS=%d, as set before ringfeed was loaded", n);
  else if (queues_how == QUEUES_OURS)
    snprintf(why, cap, "CUDA_DEVICE_MAX_CONNECTIONS unset: ringfeed asked for 32 when it was loaded, before CUDA "
             "started");
  else
    n = 8, snprintf(why, cap, "CUDA was loaded in this process before ringfeed, with CUDA_DEVICE_MAX_CONNECTIONS "
                    "unset: probably CUDA's default of 8, which the loader's GPU work shares with the model's (load "
                    "ringfeed before CUDA starts, or set CUDA_DEVICE_MAX_CONNECTIONS=32)");
  return n;
}

int dl__cuda_open(dl_loader *l) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  char why[200];
  if (e != cudaSuccess || count == 0)
    return dl__fail(DL_ENODEVICE, "option device=cuda: no CUDA device is usable here (%s)",
                    no_device_reason(e, why, sizeof why));
  for (int i = 0; i < l->o.ndevices; i++)
    if (l->o.device_ids[i] >= count)
      return dl__fail(DL_ENODEVICE, "option device=cuda:%d: this machine has %d CUDA device%s",
                      l->o.device_ids[i], count, count == 1 ? "" : "s");
  cuda_state *c = calloc(1, sizeof *c);
  if (!c)
    return dl__fail(-ENOMEM, "out of memory");
  c->n = l->o.ndevices;
  c->out_sample_bytes =
      l->has_image ? (size_t)l->o.height * l->o.width * l->o.channels * dl__dtype_bytes(l->o.dtype) : 0;
  for (int i = 0; i < c->n; i++) {
    c->g[i].l = l;
    c->g[i].index = i;
    c->g[i].id = l->o.device_ids[i];
  }
  l->cuda = c;
  /* Starts each device's context here (a no-op where the process already has it), so that the
   * stats' split of dl_open's time puts CUDA's start-up under the devices. */
  for (int i = 0; i < c->n; i++)
    if ((e = cudaSetDevice(c->g[i].id)) != cudaSuccess || (e = cudaFree(NULL)) != cudaSuccess)
      return dl__fail(DL_ENODEVICE, "option device=cuda:%d: CUDA could not start on it (%s)", c->g[i].id,
                      cudaGetErrorString(e));
  /* Too few queues cost JPEG decoding on the GPU most (see queues_ask): a warning there. */
  char queues_why[400], no_decoder[200];
  int queues = queues_describe(queues_why, sizeof queues_why);
  bool gpu_decode = dl__decode_may_use_gpu(l) && dl__gpu_decoders_available(no_decoder, sizeof no_decoder);
  dl__log(queues_how == QUEUES_LATE && gpu_decode ? DL__LOG_WARN : DL__LOG_INFO, "CUDA work queues per device: %d (%s)",
          queues, queues_why);
  return 0;
}

/* Plain pages; with a device, the starter pins them a slot at a time while the workers already
 * decode into them: pinning 255 MB took 90-125 ms on an H200 host, longer than decoding a first
 * batch. */
void *dl__host_alloc(dl_loader *l, size_t bytes) {
  cuda_state *c = l->cuda;
  if (c && !(c->registered = calloc((size_t)l->o.prefetch * (size_t)c->n, sizeof *c->registered)))
    return NULL;
  return dl__slots_map(bytes); /* huge pages are also fewer to pin */
}

void dl__host_free(dl_loader *l, void *p, size_t bytes) {
  cuda_state *c = l->cuda;
  for (int s = 0; c && s < c->n; s++)
    for (int i = 0; i < l->o.prefetch; i++)
      if (c->registered && c->registered[s * l->o.prefetch + i])
        cudaHostUnregister(l->host_mem + l->slot_stride * ((size_t)s * (size_t)l->o.prefetch + (size_t)i));
  dl__slots_unmap(p, bytes);
}

/* Whether host slot SLOT of STREAM may be copied from: pinned, or the starter gave up on it. */
static bool pinned_locked(const dl_loader *l, int stream, int slot) {
  return ((cuda_state *)l->cuda)->pinned > pin_order(l, stream, slot);
}

bool dl__gpu_decoders_available(char *why, size_t cap) { return dl__nvjpeg_load(why, cap) != NULL; }

/* One device's decoder, made on a thread of its own: nvJPEG takes over half a second to start on each. */
typedef struct decoder_start {
  dl_loader *l;
  int device;
  dl__gpu_decoder *dec;
  size_t bytes;
  int r;
  bool kept; /* taken from those an earlier loader left */
  char why[200];
} decoder_start;

static void *decoder_start_run(void *arg) {
  decoder_start *d = arg;
  d->kept = (d->dec = dl__gpu_decoder_take(d->l, d->device, &d->bytes)) != NULL;
  d->r = d->kept ? 0 : dl__gpu_decoder_create(d->l, d->device, &d->dec, &d->bytes, d->why, sizeof d->why);
  return NULL;
}

/* A decoder on every device, the devices in parallel. All or none: a failure frees the others. */
static int decoders_create(dl_loader *l, decoder_start *d, char *why, size_t cap) {
  cuda_state *c = l->cuda;
  pthread_t t[DL__MAX_DEVICES];
  bool started[DL__MAX_DEVICES] = {false};
  for (int i = 0; i < c->n; i++)
    d[i] = (decoder_start){.l = l, .device = c->g[i].id};
  for (int i = 1; i < c->n; i++)
    started[i] = pthread_create(&t[i], NULL, decoder_start_run, &d[i]) == 0;
  decoder_start_run(&d[0]);
  for (int i = 1; i < c->n; i++) {
    if (started[i])
      pthread_join(t[i], NULL);
    else
      d[i].r = -1, snprintf(d[i].why, sizeof d[i].why, "could not start a thread");
  }
  int failed = -1;
  for (int i = 0; i < c->n && failed < 0; i++)
    if (d[i].r)
      failed = i;
  if (failed < 0)
    return 0;
  snprintf(why, cap, "%s", d[failed].why);
  for (int i = 0; i < c->n; i++) /* decoding stays on the CPU: kept for a later loader, or freed */
    dl__gpu_decoder_put(d[i].dec, l->o.keep_gpu_decoders);
  return -1;
}

/* Hands the decoders to the copy stage; WHY says which nvJPEG runs them. */
static void decoders_commit(dl_loader *l, decoder_start *d, char *why, size_t cap) {
  cuda_state *c = l->cuda;
  char what[400] = "";
  bool engines = true;
  for (int i = 0; i < c->n; i++) {
    c->g[i].dec = d[i].dec;
    c->device_bytes += d[i].bytes;
    engines &= dl__gpu_decoder_has_engine(d[i].dec);
  }
  l->gpu_hw = engines;
  l->gpu_walk = true; /* every decoder reads scans (walk.cu) */
  l->gpu_pool = (size_t)l->o.gpu_decode_mb << 20;
  /* First: a long nvJPEG path may not leave room after it. */
  snprintf(why, cap, "%s%s", d[0].kept ? "kept from a loader closed earlier in this process: " : "",
           dl__gpu_decoder_describe(c->g[0].dec, what, sizeof what));
}

int dl__gpu_decoders_open(dl_loader *l, char *why, size_t cap) {
  decoder_start d[DL__MAX_DEVICES];
  if (decoders_create(l, d, why, cap))
    return -1;
  decoders_commit(l, d, why, cap);
  return 0;
}

int dl__gpu_decoders_take_kept(dl_loader *l, char *why, size_t cap) {
  cuda_state *c = l->cuda;
  decoder_start d[DL__MAX_DEVICES];
  int taken = 0;
  for (; taken < c->n; taken++) {
    d[taken] = (decoder_start){.l = l, .device = c->g[taken].id};
    if (!(d[taken].dec = dl__gpu_decoder_take(l, d[taken].device, &d[taken].bytes)))
      break;
    d[taken].kept = true;
  }
  if (taken < c->n) { /* all or none: another loader took one meanwhile, or none fits a device */
    while (taken--)
      dl__gpu_decoder_put(d[taken].dec, true);
    return -1;
  }
  decoders_commit(l, d, why, cap);
  return 0;
}

/* decode=auto's decoders, made beside the starter's pinning, which takes a tenth to a fifth as long
 * (an H200: 51-68 ms against 449-458), and handed to the copy stage as soon as they are ready. */
static void *decoders_run(void *arg) {
  decoder_start *d = arg;
  pthread_setname_np(pthread_self(), "rf-nvjpeg-start");
  dl_loader *l = d[0].l;
  cuda_state *c = l->cuda;
  double t0 = dl__now();
  char why[400] = "";
  bool ok = decoders_create(l, d, why, sizeof why) == 0;
  pthread_mutex_lock(&l->mu);
  if (ok && l->stop) { /* closed meanwhile: nothing will decode with them */
    for (int i = 0; i < c->n; i++)
      dl__gpu_decoder_put(d[i].dec, l->o.keep_gpu_decoders);
    ok = false;
    snprintf(why, sizeof why, "the loader was closed");
  }
  if (ok)
    decoders_commit(l, d, why, sizeof why);
  c->decoders_ms = (dl__now() - t0) * 1e3;
  dl__decode_started_locked(l, ok, why);
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* Whether every copy thread is past its first batch; false: the loader stops. Registering memory
 * holds CUDA's calls in the process's other threads: pinning every slot at once held the first
 * batch's copy on an H100 host until the last was pinned, 8-41 ms after the workers had filled it
 * in 10 of 24 runs. decode=auto's first batch on the q96 4:4:4 set came in 91-109 ms then, 64-72
 * once the others waited. */
static bool first_copies_wait(dl_loader *l) {
  cuda_state *c = l->cuda;
  pthread_mutex_lock(&l->mu);
  for (int s = 0; s < c->n && !l->stop; s++)
    while (!l->stop && !c->g[s].first_past)
      pthread_cond_wait(&l->ready_cv, &l->mu);
  bool go = !l->stop;
  pthread_mutex_unlock(&l->mu);
  return go;
}

/* Pins the host slots in the order they are copied, each copy thread starting as soon as its
 * slot is pinned: the first slot of each, then the others once the first batches are on their
 * way. For decode=auto, starts nvJPEG meanwhile on a thread of its own, while the workers decode
 * every JPEG. */
static void *starter(void *arg) {
  dl_loader *l = arg;
  pthread_setname_np(pthread_self(), "rf-gpu-start");
  cuda_state *c = l->cuda;
  cudaSetDevice(c->g[0].id);
  double pin_ms = 0;
  decoder_start d[DL__MAX_DEVICES];
  pthread_mutex_lock(&l->mu);
  bool start_decoders = l->decode_starting && !l->stop;
  pthread_mutex_unlock(&l->mu);
  pthread_t decoders;
  if (start_decoders) {
    d[0] = (decoder_start){.l = l};
    if (pthread_create(&decoders, NULL, decoders_run, d)) { /* no GPU decoding, and the stats say why */
      start_decoders = false;
      pthread_mutex_lock(&l->mu);
      dl__decode_started_locked(l, false, "could not start a thread");
      pthread_mutex_unlock(&l->mu);
    }
  }
  int nslots = l->o.prefetch * c->n;
  bool warned = false;
  for (int k = 0; k < nslots; k++) {
    int s = k % c->n, i = k / c->n, at = s * l->o.prefetch + i;
    if (k == c->n && !first_copies_wait(l))
      break;
    double t = dl__now();
    cudaError_t e = cudaHostRegister(l->host_mem + l->slot_stride * (size_t)at, l->slot_stride,
                                     cudaHostRegisterPortable);
    pin_ms += (dl__now() - t) * 1e3;
    c->registered[at] = e == cudaSuccess;
    if (e != cudaSuccess && !warned) {
      cudaGetLastError();
      dl__log(DL__LOG_WARN, "pinning %zu bytes of batch memory failed (%s): copies to the GPU read pageable "
              "memory, slower", l->slot_stride, cudaGetErrorString(e));
      warned = true;
    }
    pthread_mutex_lock(&l->mu);
    c->pinned = k + 1;
    if (!k)
      c->first_pinned_ms = (dl__now() - l->open_time) * 1e3;
    pthread_cond_broadcast(&l->ready_cv);
    bool stop = l->stop;
    pthread_mutex_unlock(&l->mu);
    if (stop)
      break;
  }
  pthread_mutex_lock(&l->mu);
  c->pin_ms = pin_ms; /* the stats read it under the lock */
  pthread_mutex_unlock(&l->mu);
  if (start_decoders)
    pthread_join(decoders, NULL);
  return NULL;
}

/* Returns host slots of finished transfers to the workers; with WAIT, waits for the oldest. */
static int reap(gpu *g, bool wait) {
  dl_loader *l = g->l;
  dl__stream *s = &l->streams[g->index];
  while (g->qlen) {
    int slot = g->q[g->qhead];
    dl_batch *host = &s->slots[slot];
    in_flight *f = &g->inf[slot];
    cudaError_t e = wait ? cudaEventSynchronize(f->done) : cudaEventQuery(f->done);
    if (e == cudaErrorNotReady)
      return 0;
    if (e != cudaSuccess) {
      snprintf(g->error, sizeof g->error, "copy to cuda:%d failed: %s", g->id, cudaGetErrorString(e));
      return -1;
    }
    float ms = 0;
    if (cudaEventElapsedTime(&ms, f->t0, f->t1) == cudaSuccess)
      g->copy_ms += ms;
    g->copy_bytes += (int64_t)f->bytes;
    float dms = 0;
    if (f->gpu_samples >= 0 && cudaEventElapsedTime(&dms, f->d0, f->d1) == cudaSuccess) {
      g->decode_ms += dms;
      g->decode_batches++;
    }
    dl__gpu_share_update(l, f->gpu_samples > 0 ? f->gpu_samples : 0, dms);
    pthread_mutex_lock(&l->mu);
    dl__slot_free_locked(host);
    pthread_mutex_unlock(&l->mu);
    g->qhead = (g->qhead + 1) % l->o.prefetch;
    g->qlen--;
    wait = false;
  }
  return 0;
}

/* The next run of neighbouring samples decoded on the CPU, from *I on: [*i, *j). */
static bool cpu_run(const dl_batch *host, int *i, int *j) {
  while (*i < host->len && host->jobs && host->jobs[*i].len)
    (*i)++;
  *j = *i;
  while (*j < host->len && !(host->jobs && host->jobs[*j].len))
    (*j)++;
  return *j > *i;
}

static bool has_gpu_jobs(const dl_batch *host) {
  for (int i = 0; host->jobs && i < host->len; i++)
    if (host->jobs[i].len)
      return true;
  return false;
}

/* How long the consumer's stream waited at dl_batch_wait for the slot's last batch, read before
 * `copied` is recorded again. Its stream not there yet while the batch is complete: no wait. */
static void count_stream_wait(dl_loader *l, gpu_slot *gs) {
  /* Pairs with dl__cuda_wait's exchange and store (sequentially consistent, as both threads take
   * the flag and then look at `reached`). */
  if (!atomic_exchange_explicit(&gs->reach_pending, false, memory_order_seq_cst))
    return;
  float ms = 0;
  if (cudaEventQuery(gs->copied) != cudaSuccess || cudaEventQuery(gs->reached) != cudaSuccess ||
      cudaEventElapsedTime(&ms, gs->reached, gs->copied) != cudaSuccess || ms <= 0)
    return;
  pthread_mutex_lock(&l->mu);
  l->st.consumer_stream_wait_s += ms * 1e-3;
  pthread_mutex_unlock(&l->mu);
}

static int enqueue(gpu *g, dl_batch *host, int slot, dl_batch *dev) {
  dl_loader *l = g->l;
  cuda_state *c = l->cuda;
  gpu_slot *gs = dev->gpu;
  in_flight *f = &g->inf[slot];
  bool convert = l->o.dtype != DL__DTYPE_UINT8;
  cudaError_t e = cudaSuccess;
  /* The consumer's work on the slot's last batch must end before this one lands in it. nvJPEG's
   * hardware decode is not given a stream that waits on another stream: it stalled there on an
   * H200 (test_cuda's slow consumer, decode=gpu), so the copy thread waits for the release itself
   * (it would block in nvJPEG for as long anyway). */
  if (gs->release_pending && has_gpu_jobs(host) && g->dec) {
    double t = dl__now();
    e = cudaEventSynchronize(gs->released);
    atomic_fetch_add_explicit(&l->st.release_wait_ns, (int64_t)((dl__now() - t) * 1e9), memory_order_relaxed);
  } else if (gs->release_pending) {
    e = cudaStreamWaitEvent(g->copy, gs->released, 0);
  }
  gs->release_pending = false;
  count_stream_wait(l, gs);
  /* The GPU's JPEGs first, so the engines start while the CPU samples are copied. A JPEG nvJPEG
   * refuses becomes a CPU sample here, before the copies below. */
  f->gpu_samples = -1;
  if (!e && has_gpu_jobs(host) && g->dec) { /* jobs come only after the decoders (under l->mu) */
    e = cudaEventRecord(f->d0, g->copy);
    /* nvJPEG's call holds the copy thread about as long as the GPU decodes: its time on a CPU
     * and its preemptions say whether a run whose GPU part is slow waited for the engines or for
     * a CPU the workers had. */
    struct rusage u0, u1;
    getrusage(RUSAGE_THREAD, &u0);
    double t0 = dl__now();
    if (!e && (f->gpu_samples = dl__gpu_decode(g->dec, l, host, slot, gs->image, g->copy, g->error,
                                               sizeof g->error)) < 0)
      return -1;
    g->decode_host_ms += (dl__now() - t0) * 1e3;
    getrusage(RUSAGE_THREAD, &u1);
    g->decode_cpu_ms += dl__rusage_cpu_ms(&u1) - dl__rusage_cpu_ms(&u0);
    g->decode_preempted += u1.ru_nivcsw - u0.ru_nivcsw;
    if (!e)
      e = cudaEventRecord(f->d1, g->copy);
  }
  if (!e)
    e = cudaMemcpyAsync(gs->label, host->label, (size_t)host->len * sizeof(int64_t), cudaMemcpyHostToDevice,
                        g->copy);
  /* The timing events bracket the batch's data (images and tensor fields, not the labels): the
   * rate comparable with a plain copy. */
  if (!e)
    e = cudaEventRecord(f->t0, g->copy);
  size_t in_bytes = 0;
  for (int i = 0, j; !e && cpu_run(host, &i, &j); i = j) {
    size_t at = (size_t)i * l->sample_bytes, n = (size_t)(j - i) * l->sample_bytes;
    e = cudaMemcpyAsync((convert ? g->staging : (uint8_t *)gs->image) + at, host->image + at, n,
                        cudaMemcpyHostToDevice, g->copy);
    in_bytes += n;
  }
  if (!e && l->field_block)
    e = cudaMemcpyAsync(dev->fields, host->fields, l->field_block, cudaMemcpyHostToDevice, g->copy);
  if (!e)
    e = cudaEventRecord(f->t1, g->copy);
  for (int i = 0, j; !e && convert && l->sample_bytes && cpu_run(host, &i, &j); i = j)
    e = (cudaError_t)dl__convert_launch(g->staging + (size_t)i * l->sample_bytes,
                                        (uint8_t *)gs->image + (size_t)i * c->out_sample_bytes, j - i, l->o.height,
                                        l->o.width, l->o.channels, l->o.layout == DL__LAYOUT_NCHW, l->o.dtype,
                                        l->o.mean, l->o.std, g->copy);
  if (!e)
    e = cudaEventRecord(gs->copied, g->copy);
  if (!e)
    e = cudaEventRecord(f->done, g->copy);
  if (e) {
    snprintf(g->error, sizeof g->error, "queueing the copy to cuda:%d failed: %s", g->id,
             cudaGetErrorString(e));
    return -1;
  }
  memcpy(dev->key, host->key, sizeof(*dev->key) * (size_t)host->len);
  memcpy(dev->sample_err, host->sample_err, sizeof(int) * (size_t)host->len);
  dl__slot_bytes_hand_over(host, dev); /* bytes fields stay on the host, with the batch */
  f->bytes = in_bytes + l->field_block;
  g->q[(g->qhead + g->qlen++) % l->o.prefetch] = slot;
  return 0;
}

/* The starter pins the other slots once every copy thread is past its first batch. */
static void first_copy_past_locked(gpu *g) {
  if (g->first_past)
    return;
  g->first_past = true;
  pthread_cond_broadcast(&g->l->ready_cv);
}

static void *copy_thread(void *arg) {
  gpu *g = arg;
  dl_loader *l = g->l;
  char name[16];
  snprintf(name, sizeof name, "rf-copy-%d", g->id); /* the CUDA device it feeds */
  pthread_setname_np(pthread_self(), name);
  dl__stream *s = &l->streams[g->index];
  cudaSetDevice(g->id);
  const dl_batch *last_dev = NULL;
  for (int64_t k = 0;; k++) {
    if (s->sm.total >= 0 && k >= s->sm.total)
      break;
    int slot = -1;
    dl_batch *host = NULL, *dev = NULL;
    bool stop = false;
    for (;;) {
      if (reap(g, false))
        goto failed;
      pthread_mutex_lock(&l->mu);
      host = dl__slot_of(s->slots, l->o.prefetch, k);
      slot = host ? (int)(host - s->slots) : -1;
      bool host_ok = host && host->state == DL__SLOT_COMPLETE && pinned_locked(l, g->index, slot);
      dev = dl__slot_free_after(s->dslots, l->o.device_slots, last_dev);
      bool dev_ok = dev != NULL;
      stop = l->stop;
      if (host_ok && dev_ok) {
        dev->state = DL__SLOT_FILLING;
        last_dev = dev;
        pthread_mutex_unlock(&l->mu);
        break;
      }
      if (stop) {
        pthread_mutex_unlock(&l->mu);
        break;
      }
      double t0 = dl__now();
      if (g->qlen) {
        /* Copies in flight: look again soon, to give their host slots back, without blocking on
         * the GPU (the next host batch may be ready first, and the engines should not wait). */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 500000;
        if (t.tv_nsec >= 1000000000)
          t.tv_sec++, t.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&l->ready_cv, &l->mu, &t);
      } else {
        pthread_cond_wait(&l->ready_cv, &l->mu);
      }
      pthread_mutex_unlock(&l->mu);
      /* With the host batch ready, every device slot is the consumer's: handed out, or waiting to
       * be. The split counts this as the loader running ahead, as it counts a wait for the
       * consumer's GPU: behind a consumer its host thread holds back, the copy thread waits here
       * and nowhere else, and uncounted, the split stayed at its first share behind a ViT bound by
       * its host threads in most runs (H100 hosts). Held at that share in one process on a quiet
       * host, the ViT trained at 0.956 of held, against 0.989-0.991 with the split gone to 0. */
      double waited = dl__now() - t0;
      atomic_fetch_add_explicit(host_ok ? &l->st.release_wait_ns : &l->st.copy_wait_workers_ns,
                                (int64_t)(waited * 1e9), memory_order_relaxed);
    }
    if (stop)
      break;
    g->batches++;
    /* A batch that failed on the workers (on_error=fail) is not copied; one that fails in the
     * GPU decode is copied and then reported: its host slot returns through reap. */
    if (host->err && has_gpu_jobs(host) && g->dec)
      dl__gpu_decode_failed_batch(g->dec, l, host);
    bool queued = !host->err;
    if (queued && enqueue(g, host, slot, dev))
      goto failed;
    pthread_mutex_lock(&l->mu);
    if (!k && !g->index) {
      cuda_state *c = l->cuda;
      c->first_queued_ms = (dl__now() - l->open_time) * 1e3;
      c->first_copy_pinned = c->pinned;
    }
    first_copy_past_locked(g);
    dev->k = k;
    dev->epoch = host->epoch;
    dev->index = host->index;
    dev->len = host->len;
    dev->err = host->err;
    memcpy(dev->errmsg, host->errmsg, sizeof dev->errmsg);
    dev->ready = true;
    dev->state = DL__SLOT_COMPLETE;
    if (!queued)
      dl__slot_free_locked(host);
    pthread_cond_broadcast(&l->ready_cv);
    pthread_mutex_unlock(&l->mu);
  }
  while (g->qlen)
    if (reap(g, true))
      break;
  pthread_mutex_lock(&l->mu);
  first_copy_past_locked(g);
  pthread_mutex_unlock(&l->mu);
  return NULL;
failed:
  dl__log(DL__LOG_ERROR, "%s", g->error);
  pthread_mutex_lock(&l->mu);
  first_copy_past_locked(g);
  /* Hand the consumer an error batch so dl_next_batch reports it instead of waiting forever. */
  for (int i = 0; i < l->o.device_slots; i++) {
    dl_batch *d = &s->dslots[i];
    if (d->state != DL__SLOT_HELD) {
      d->k = s->next_out;
      d->err = DL_ECUDA;
      snprintf(d->errmsg, sizeof d->errmsg, "%s", g->error);
      d->ready = true;
      d->state = DL__SLOT_COMPLETE;
    }
  }
  pthread_cond_broadcast(&l->ready_cv);
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

int dl__cuda_start(dl_loader *l) {
  cuda_state *c = l->cuda;
  int D = l->o.device_slots, B = l->o.batch_size;
  for (int i = 0; i < c->n; i++) {
    gpu *g = &c->g[i];
    dl__stream *s = &l->streams[i];
    cudaError_t e = cudaSetDevice(g->id);
    /* The highest priority: the loader's short kernels go ahead of the model's queued work. */
    int least = 0, greatest = 0;
    if (!e)
      e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (!e)
      e = cudaStreamCreateWithPriority(&g->copy, cudaStreamNonBlocking, greatest);
    if (e)
      return cuda_fail(e, "creating the copy stream");
    s->dslots = calloc((size_t)D, sizeof *s->dslots);
    g->slots = calloc((size_t)D, sizeof *g->slots);
    g->inf = calloc((size_t)l->o.prefetch, sizeof *g->inf);
    g->q = calloc((size_t)l->o.prefetch, sizeof *g->q);
    if (!s->dslots || !g->slots || !g->inf || !g->q)
      return dl__fail(-ENOMEM, "out of memory");
    if (l->has_image && l->o.dtype != DL__DTYPE_UINT8 && (e = cudaMalloc((void **)&g->staging, l->image_bytes)))
      return cuda_fail(e, "allocating device memory");
    c->device_bytes += g->staging ? l->image_bytes : 0;
    for (int j = 0; j < l->o.prefetch; j++) {
      in_flight *f = &g->inf[j];
      /* The copy thread sleeps on 'done' rather than spinning a core the workers need. */
      if ((e = cudaEventCreateWithFlags(&f->done, cudaEventDisableTiming | cudaEventBlockingSync)) ||
          (e = cudaEventCreate(&f->t0)) || (e = cudaEventCreate(&f->t1)) || (e = cudaEventCreate(&f->d0)) ||
          (e = cudaEventCreate(&f->d1)))
        return cuda_fail(e, "creating events");
    }
    for (int j = 0; j < D; j++) {
      dl_batch *b = &s->dslots[j];
      gpu_slot *gs = &g->slots[j];
      b->l = l;
      b->stream = i;
      b->k = -1;
      b->is_device = true;
      b->gpu = gs;
      b->key = calloc((size_t)B, sizeof *b->key);
      b->sample_err = calloc((size_t)B, sizeof *b->sample_err);
      if (!b->key || !b->sample_err || dl__slot_bytes_alloc(l, b))
        return dl__fail(-ENOMEM, "out of memory");
      if ((e = cudaMalloc(&gs->image, c->out_sample_bytes * (size_t)B + 1)) ||
          (e = cudaMalloc((void **)&gs->label, sizeof(int64_t) * (size_t)B)))
        return cuda_fail(e, "allocating device batch memory");
      b->image = gs->image;
      b->label = gs->label;
      c->device_bytes += c->out_sample_bytes * (size_t)B + 1 + sizeof(int64_t) * (size_t)B + l->field_block;
      if (l->field_block && (e = cudaMalloc((void **)&b->fields, l->field_block)))
        return cuda_fail(e, "allocating device field memory");
      /* The copy thread waits on `released` from the host before nvJPEG writes the slot: a
       * blocking wait, not CUDA's default spin, which held a core for the whole of a slow
       * consumer's step. */
      if ((e = cudaEventCreate(&gs->copied)) || (e = cudaEventCreate(&gs->reached)) ||
          (e = cudaEventCreateWithFlags(&gs->released, cudaEventDisableTiming | cudaEventBlockingSync)))
        return cuda_fail(e, "creating events");
    }
  }
  int r = pthread_create(&c->starter, NULL, starter, l);
  if (r)
    return dl__fail(-r, "could not start the GPU stage's starter: %s", strerror(r));
  c->starter_started = true;
  for (int i = 0; i < c->n; i++) {
    r = pthread_create(&c->g[i].thread, NULL, copy_thread, &c->g[i]);
    if (r)
      return dl__fail(-r, "could not start the copy thread: %s", strerror(r));
    c->g[i].started = true;
  }
  return 0;
}

void dl__cuda_stop(dl_loader *l) {
  cuda_state *c = l->cuda;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_broadcast(&l->ready_cv);
  pthread_mutex_unlock(&l->mu);
  for (int i = 0; c && i < c->n; i++)
    if (c->g[i].started) {
      pthread_join(c->g[i].thread, NULL);
      c->g[i].started = false;
    }
  if (c && c->starter_started) {
    pthread_join(c->starter, NULL);
    c->starter_started = false;
  }
}

void dl__cuda_close(dl_loader *l) {
  cuda_state *c = l->cuda;
  if (!c)
    return;
  dl__cuda_stop(l);
  for (int i = 0; i < c->n; i++) {
    gpu *g = &c->g[i];
    dl__stream *s = &l->streams[i];
    cudaSetDevice(g->id);
    if (g->copy)
      cudaStreamSynchronize(g->copy);
    for (int j = 0; g->slots && j < l->o.device_slots; j++) {
      gpu_slot *gs = &g->slots[j];
      cudaFree(gs->image);
      cudaFree(gs->label);
      if (gs->copied)
        cudaEventDestroy(gs->copied);
      if (gs->released)
        cudaEventDestroy(gs->released);
      if (gs->reached)
        cudaEventDestroy(gs->reached);
      if (s->dslots) {
        cudaFree(s->dslots[j].fields);
        free(s->dslots[j].key);
        dl__buf_free(&s->dslots[j].key_text);
        free(s->dslots[j].sample_err);
        dl__slot_bytes_free(l, &s->dslots[j]);
      }
    }
    for (int j = 0; g->inf && j < l->o.prefetch; j++) {
      cudaEvent_t *ev[] = {&g->inf[j].done, &g->inf[j].t0, &g->inf[j].t1, &g->inf[j].d0, &g->inf[j].d1};
      for (size_t k = 0; k < DL__ARRAY_LEN(ev); k++)
        if (*ev[k])
          cudaEventDestroy(*ev[k]);
    }
    dl__gpu_decoder_put(g->dec, l->o.keep_gpu_decoders);
    cudaFree(g->staging);
    if (g->copy)
      cudaStreamDestroy(g->copy);
    free(g->inf);
    free(g->q);
    free(g->slots);
    free(s->dslots);
    s->dslots = NULL;
  }
  l->cuda = NULL;
  free(c->registered);
  free(c);
}

int dl__cuda_field(const dl_batch *b, const char *name, DLTensor *t) {
  cuda_state *c = b->l->cuda;
  return dl__batch_describe(b, name, (DLDevice){kDLCUDA, c->g[b->stream].id}, t);
}

int dl__cuda_wait(dl_batch *b, void *stream) {
  gpu_slot *gs = b->gpu;
  /* (A stream of another device cannot record the slot's event: that wait goes unmeasured.) */
  /* The event is claimed by the exchange and given back when its record fails; partner:
   * count_stream_wait's exchange. Sequentially consistent, the three of them. */
  if (!atomic_load_explicit(&gs->reach_pending, memory_order_seq_cst) &&
      !atomic_exchange_explicit(&gs->reach_pending, true, memory_order_seq_cst) &&
      cudaEventRecord(gs->reached, (cudaStream_t)stream) != cudaSuccess) {
    cudaGetLastError();
    atomic_store_explicit(&gs->reach_pending, false, memory_order_seq_cst);
  }
  cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, gs->copied, 0);
  return e ? cuda_fail(e, "waiting for the batch's copy") : 0;
}

int dl__cuda_copy(dl_batch *b, void *dst, const void *src, size_t bytes, void *stream) {
  /* After the batch's copy on STREAM, as dl__cuda_wait orders it: a copy asked without that wait
   * still reads the batch whole. */
  gpu_slot *gs = b->gpu;
  cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, gs->copied, 0);
  if (!e)
    e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
  return e ? cuda_fail(e, "copying a field of the batch out of its slot") : 0;
}

void dl__cuda_release_locked(dl_batch *b) {
  gpu_slot *gs = b->gpu;
  cuda_state *c = b->l->cuda;
  int prev = -1;
  cudaGetDevice(&prev);
  int id = c->g[b->stream].id;
  if (prev != id)
    cudaSetDevice(id);
  /* Work the consumer queued on its stream before this point may still read the batch. */
  gs->release_pending = cudaEventRecord(gs->released, (cudaStream_t)b->release_stream) == cudaSuccess;
  c->g[b->stream].last_released = gs->release_pending ? gs : NULL;
  if (prev != id && prev >= 0)
    cudaSetDevice(prev);
}

bool dl__cuda_consumer_busy_locked(dl_loader *l, int stream) {
  cuda_state *c = l->cuda;
  gpu_slot *gs = c->g[stream].last_released;
  return gs && cudaEventQuery(gs->released) == cudaErrorNotReady;
}

int dl__cuda_stats(dl_loader *l, char *buf, size_t cap) {
  cuda_state *c = l->cuda;
  double ms = 0, decode_ms = 0, decode_host_ms = 0, decode_cpu_ms = 0, pool_wait_ms = 0, walk_wait_ms = 0;
  long preempted = 0;
  double wait_workers_ms = (double)atomic_load_explicit(&l->st.copy_wait_workers_ns, memory_order_relaxed) * 1e-6;
  double wait_consumer_ms = (double)atomic_load_explicit(&l->st.release_wait_ns, memory_order_relaxed) * 1e-6;
  int64_t bytes = 0, decode_batches = 0, batches = 0, walks = 0, walks_damaged = 0;
  for (int i = 0; i < c->n; i++) {
    ms += c->g[i].copy_ms;
    bytes += c->g[i].copy_bytes;
    decode_ms += c->g[i].decode_ms;
    decode_host_ms += c->g[i].decode_host_ms;
    decode_cpu_ms += c->g[i].decode_cpu_ms;
    preempted += c->g[i].decode_preempted;
    decode_batches += c->g[i].decode_batches;
    pool_wait_ms += c->g[i].dec ? dl__gpu_decoder_pool_wait_ms(c->g[i].dec) : 0;
    walk_wait_ms += c->g[i].dec ? dl__gpu_decoder_walks(c->g[i].dec, &walks, &walks_damaged) : 0;
    batches += c->g[i].batches;
  }
  size_t pinned = l->host_mem_bytes;
  pthread_mutex_lock(&l->mu);
  size_t device_bytes = c->device_bytes;
  double pin_ms = c->pin_ms, decoders_ms = c->decoders_ms, first_pinned_ms = c->first_pinned_ms;
  double first_queued_ms = c->first_queued_ms;
  int first_copy_pinned = c->first_copy_pinned;
  double first_filled_ms = l->st.first_filled_ms;
  pthread_mutex_unlock(&l->mu);
  /* The GPU stage's stream busy (its copies and JPEG decoding) over the loader's life, per
   * device: near 1, it is what the consumer waits for. */
  double life_ms = (dl__now() - l->open_time) * 1e3 * c->n;
  double busy = life_ms > 0 ? (ms + decode_ms) / life_ms : 0;
  char queues_why[400];
  int queues = queues_describe(queues_why, sizeof queues_why);
  return snprintf(buf, cap,
                  ",\"cuda_queues\":%d,\"cuda_queues_reason\":\"%s\",\"gpu_stage_busy_frac\":%.4f,\"pin_ms\":%.3f,\"first_pinned_ms\":%.3f,\"first_filled_ms\":%.3f,\"first_queued_ms\":%.3f,\"first_copy_pinned_slots\":%d,\"gpu_decoders_start_ms\":%.3f,\"h2d_bytes\":%lld,\"h2d_gpu_ms\":%.3f,\"h2d_gb_s\":%.3f,\"device_slots\":%d"
                  ",\"gpu_decode_ms\":%.3f,\"gpu_decode_host_ms\":%.3f,\"gpu_decode_host_cpu_ms\":%.3f,\"gpu_decode_preempted\":%.2f"
                  ",\"gpu_decode_pool_wait_ms\":%.3f,\"gpu_decode_batches\":%lld"
                  ",\"gpu_walks\":%lld,\"gpu_walks_damaged\":%lld,\"gpu_walk_wait_ms\":%.3f"
                  ",\"gpu_stage_wait_workers_ms\":%.3f,\"gpu_stage_wait_consumer_ms\":%.3f,\"pinned_mb\":%.1f,\"device_mb\":%.1f",
                  queues, queues_why, busy, pin_ms, first_pinned_ms, first_filled_ms, first_queued_ms, first_copy_pinned, decoders_ms, (long long)bytes, ms, ms > 0 ? bytes / ms / 1e6 : 0.0, l->o.device_slots,
                  decode_batches ? decode_ms / (double)decode_batches : 0.0,
                  decode_batches ? decode_host_ms / (double)decode_batches : 0.0,
                  decode_batches ? decode_cpu_ms / (double)decode_batches : 0.0,
                  decode_batches ? (double)preempted / (double)decode_batches : 0.0,
                  decode_batches ? pool_wait_ms / (double)decode_batches : 0.0, (long long)decode_batches,
                  (long long)walks, (long long)walks_damaged, decode_batches ? walk_wait_ms / (double)decode_batches : 0.0,
                  batches ? wait_workers_ms / (double)batches : 0.0, batches ? wait_consumer_ms / (double)batches : 0.0,
                  (double)pinned / 1048576.0, (double)device_bytes / 1048576.0);
}
