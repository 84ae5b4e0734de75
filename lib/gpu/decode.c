/*
 * nvJPEG on one device. The copy thread hands it each host batch's GPU samples: the hardware
 * engine decodes the region around each crop (batched, with ROI), nvJPEG's CUDA decoder whole
 * images the engine does not take (progressive, 4:1:1 ...), into a pool of device memory fixed at
 * open; then one kernel per pool's worth crops, resizes, flips and converts them into the device
 * batch. A JPEG nvJPEG refuses is decoded on the CPU into the host slot instead, and fails there
 * exactly as it would have on a worker; so is one whose scan the device read (walk.cu, gpu_check
 * in a first run) and found damaged. Nothing is allocated per batch.
 *
 * Lock order: l->mu only, briefly, to record a failed sample.
 */
#include "gpu/decode.h"
#include "gpu/nvjpeg.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* One nvJPEG batched decoder: a handle, its state, and the batch size the state is set up for. */
typedef struct engine {
  nvjpegHandle_t h;
  nvjpegJpegState_t state;
  int ready_for; /* 0: initialise before the next call */
} engine;

struct dl__gpu_decoder {
  const dl__nvjpeg *nv;
  int device;
  engine hw, cuda; /* hw.h is NULL without JPEG engines */
  bool cuda_tried;  /* with engines, the CUDA decoder starts when a JPEG first needs it */
  unsigned engines, cores;
  int room_w, room_h; /* the largest image the engines' buffers were last sized for */
  int64_t room_most;  /* in pixels: larger images are left to nvJPEG's own growth */
  bool interpolates; /* chroma upsampling by interpolation (the flag nvJPEG took) */
  nvjpegOutputFormat_t format;
  int channels, batch;
  /* Decoded regions, in two halves taken in turn by the chunks of successive calls, so that the
   * engines decode one batch while the kernels still read the one before (a chunk too large for
   * a half takes the whole pool). */
  uint8_t *pool;
  size_t pool_cap, half_cap;
  int half; /* the one the next chunk takes */
  /* Recorded after the kernels that read each half. nvJPEG's hardware decode writes its output
   * when it is called, not in the stream's order, so the host waits for this before each one. */
  cudaEvent_t pool_read[2];
  bool pool_pending[2];
  double pool_wait_ms; /* the copy thread's time waiting for them */
  dl__resize_job *jobs_dev;  /* one chunk's jobs, for the kernel */
  dl__resize_job *jobs_host; /* pinned, a batch's worth per host slot: its copy may still be queued */
  /* The arrays of one nvJPEG call, and which jobs go to which decoder. */
  const unsigned char **data;
  size_t *lens;
  nvjpegImage_t *images;
  nvjpegDecodeParams_t *params;
  int nparams;
  int *hw_list, *cuda_list;
  /* gpu_check's reads of the scans no worker read (walk.cu), on a stream of their own so that
   * nvJPEG's work on the copy stream does not queue behind them: the host slot's arena copied
   * (walk_bytes, sized at the first walk for the loader's arenas), a batch's jobs, the spans'
   * findings and the clean scans' row starts. */
  cudaStream_t walk_stream;
  cudaEvent_t walked;
  uint8_t *walk_bytes;
  size_t walk_cap;
  dl__walk_job *walk_dev, *walk_host;
  void *walk_room, *walk_rows, *walk_rows_host;
  double walk_wait_ms; /* the copy thread's time waiting for them after its decodes */
  int64_t walks, walks_damaged;
  dl__image_decoder cpu; /* the JPEGs nvJPEG refuses */
  int prefetch;          /* the host slots jobs_host was sized for */
  size_t device_bytes;   /* the device memory it took */
};

bool dl__gpu_decoder_has_engine(const dl__gpu_decoder *d) { return d->hw.h != NULL; }

double dl__gpu_decoder_pool_wait_ms(const dl__gpu_decoder *d) { return d->pool_wait_ms; }

double dl__gpu_decoder_walks(const dl__gpu_decoder *d, int64_t *walks, int64_t *damaged) {
  *walks += d->walks;
  *damaged += d->walks_damaged;
  return d->walk_wait_ms;
}

const char *dl__gpu_decoder_describe(const dl__gpu_decoder *d, char *buf, size_t cap) {
  const char *chroma = d->interpolates ? "chroma interpolated" : "chroma replicated (no interpolation flag)";
  if (d->hw.h)
    snprintf(buf, cap, "nvJPEG %s (%s): hardware engine (%u engines x %u cores), CUDA decoder for what it "
             "does not take, %s", d->nv->version, d->nv->path, d->engines, d->cores, chroma);
  else
    snprintf(buf, cap, "nvJPEG %s (%s): CUDA decoder (no JPEG engine on this device), %s", d->nv->version,
             d->nv->path, chroma);
  return buf;
}

void dl__gpu_decoder_destroy(dl__gpu_decoder *d) {
  if (!d)
    return;
  cudaSetDevice(d->device);
  for (int i = 0; i < d->nparams; i++)
    d->nv->DecodeParamsDestroy(d->params[i]);
  engine *engines[] = {&d->hw, &d->cuda};
  for (int i = 0; i < 2; i++) {
    if (engines[i]->state)
      d->nv->JpegStateDestroy(engines[i]->state);
    if (engines[i]->h)
      d->nv->Destroy(engines[i]->h);
  }
  for (int h = 0; h < 2; h++)
    if (d->pool_read[h])
      cudaEventDestroy(d->pool_read[h]);
  if (d->walked)
    cudaEventDestroy(d->walked);
  if (d->walk_stream)
    cudaStreamDestroy(d->walk_stream);
  cudaFree(d->walk_bytes);
  cudaFree(d->walk_dev);
  cudaFree(d->walk_room);
  cudaFree(d->walk_rows);
  cudaFreeHost(d->walk_host);
  cudaFreeHost(d->walk_rows_host);
  cudaFree(d->pool);
  cudaFree(d->jobs_dev);
  cudaFreeHost(d->jobs_host);
  free(d->data);
  free(d->lens);
  free(d->images);
  free(d->params);
  free(d->hw_list);
  free(d->cuda_list);
  dl__image_decoder_free(&d->cpu);
  free(d);
}

/*
 * Decoders a closed loader left to the next one in the process (keep_gpu_decoders=1). nvJPEG takes
 * over half a second to start on a device, which a loader opened again (Python's set_epoch and
 * load_state_dict reopen it, a validation loader is often opened each epoch) would otherwise pay
 * every time, decoding on the CPU alone meanwhile. A kept decoder is idle: its loader synchronised
 * the copy stream before closing.
 */
static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static dl__gpu_decoder *kept[DL__MAX_DEVICES]; /* one a device at most: the device memory it holds */

/* Whether D was made for what L asks of a decoder on DEVICE (its pool, batch and job lists). */
static bool fits(const dl__gpu_decoder *d, const dl_loader *l, int device) {
  return d->device == device && d->batch == l->o.batch_size && d->channels == l->o.channels &&
         d->prefetch == l->o.prefetch && d->pool_cap == ((size_t)l->o.gpu_decode_mb << 20) + 256;
}

dl__gpu_decoder *dl__gpu_decoder_take(const dl_loader *l, int device, size_t *device_bytes) {
  dl__gpu_decoder *d = NULL;
  pthread_mutex_lock(&kept_mu);
  for (int i = 0; i < DL__MAX_DEVICES && !d; i++)
    if (kept[i] && fits(kept[i], l, device))
      d = kept[i], kept[i] = NULL;
  pthread_mutex_unlock(&kept_mu);
  if (d) {
    d->pool_wait_ms = d->walk_wait_ms = 0; /* the stats are the new loader's */
    d->walks = d->walks_damaged = 0;
    *device_bytes += d->device_bytes;
  }
  return d;
}

void dl__gpu_decoder_put(dl__gpu_decoder *d, bool keep) {
  dl__gpu_decoder *old = NULL;
  pthread_mutex_lock(&kept_mu);
  int at = -1; /* the device's entry, else a free one */
  for (int i = 0; keep && d && i < DL__MAX_DEVICES; i++)
    if ((kept[i] && kept[i]->device == d->device) || (!kept[i] && at < 0))
      at = i;
  if (at >= 0)
    old = kept[at], kept[at] = d, d = NULL;
  pthread_mutex_unlock(&kept_mu);
  dl__gpu_decoder_destroy(old); /* the one it replaces: the latest loader's shape is likelier next */
  dl__gpu_decoder_destroy(d);   /* not kept */
}

/* Chroma upsampling by interpolation (libjpeg's "fancy" upsampling); older versions may lack it.
 * Not NVJPEG_FLAGS_BITSTREAM_STRICT: what it refuses, the probe before (dl__gpu_plan) already keeps
 * on the CPU (the same error for all 337 damaged and hostile samples of test_gpu_decode either
 * way), and it cost nvJPEG's host calls a third of their rate (an H200, hybrid: 25,400-26,100 q90
 * images/s strict, 32,800-33,700 without; q96 16,200-16,700 and 22,900-23,200).
 * The engine's pipeline (images buffered from one call into the next) off: with it, each call
 * waited for work other streams had queued on the GPU, so a model's step held the decode back by
 * about its own length (an H200, q90, decode=gpu beside a consumer of 9.2 ms steps: 18.2 ms per
 * batch, GPU idle 0.49; without it 10.7 ms and 0.13; on an idle GPU 9.8 and 10.6 ms). The other
 * backends ignore the flag. */
static nvjpegStatus_t create(const dl__nvjpeg *nv, nvjpegBackend_t backend, nvjpegHandle_t *h, bool *interpolates) {
  const unsigned base = NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE;
  nvjpegStatus_t st = nv->CreateEx(backend, NULL, NULL, base | NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, h);
  *interpolates = st == NVJPEG_STATUS_SUCCESS;
  if (st != NVJPEG_STATUS_SUCCESS)
    st = nv->CreateEx(backend, NULL, NULL, base, h);
  if (st != NVJPEG_STATUS_SUCCESS)
    *h = NULL;
  return st;
}

/* nvJPEG's CUDA decoder and its state (the hybrid backend where there is one). */
static nvjpegStatus_t cuda_decoder_start(dl__gpu_decoder *d, bool *interpolates) {
  d->cuda_tried = true;
  nvjpegStatus_t st = create(d->nv, NVJPEG_BACKEND_GPU_HYBRID, &d->cuda.h, interpolates);
  if (st != NVJPEG_STATUS_SUCCESS)
    st = create(d->nv, NVJPEG_BACKEND_DEFAULT, &d->cuda.h, interpolates);
  if (st == NVJPEG_STATUS_SUCCESS && (st = d->nv->JpegStateCreate(d->cuda.h, &d->cuda.state)) != NVJPEG_STATUS_SUCCESS) {
    d->nv->Destroy(d->cuda.h);
    d->cuda.h = NULL;
  }
  return st;
}

/* The JPEG engines' handle and state, or neither where the card has no engines. The engines are
 * counted once the state is made: counted before it, the count took 259 ms of nvJPEG's 890 ms
 * start on an H100, after it 7 ms (bench/nvjpeg_start --info before|after). */
static bool engines_start(dl__gpu_decoder *d, bool *interpolates) {
  const dl__nvjpeg *nv = d->nv;
  if (create(nv, NVJPEG_BACKEND_HARDWARE, &d->hw.h, interpolates) != NVJPEG_STATUS_SUCCESS)
    return false;
  if (nv->JpegStateCreate(d->hw.h, &d->hw.state) == NVJPEG_STATUS_SUCCESS &&
      nv->GetHardwareDecoderInfo(d->hw.h, &d->engines, &d->cores) == NVJPEG_STATUS_SUCCESS && d->engines > 0)
    return true;
  if (d->hw.state) /* a handle without engines to drive */
    nv->JpegStateDestroy(d->hw.state);
  nv->Destroy(d->hw.h);
  d->hw.state = NULL;
  d->hw.h = NULL;
  return false;
}

int dl__gpu_decoder_create(dl_loader *l, int device, dl__gpu_decoder **out, size_t *device_bytes, char *why,
                           size_t cap) {
  *out = NULL;
  const dl__nvjpeg *nv = dl__nvjpeg_load(why, cap);
  if (!nv)
    return -1;
  dl__gpu_decoder *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(why, cap, "out of memory");
    return -1;
  }
  d->nv = nv;
  d->device = device;
  d->channels = l->o.channels;
  d->batch = l->o.batch_size;
  d->format = l->o.channels == 1 ? NVJPEG_OUTPUT_Y : NVJPEG_OUTPUT_RGBI;
  /* Where nvJPEG's start-up goes (0.65 s on an H100 when nothing runs beside it), for the debug log. */
  double t[5];
  t[0] = dl__now();
  struct rusage u0, u1; /* the thread's own: whether the engines' start computes, sleeps or faults */
  getrusage(RUSAGE_THREAD, &u0);
  cudaError_t ce = cudaSetDevice(device);
  nvjpegStatus_t st = NVJPEG_STATUS_SUCCESS;
  bool hw_interp = false, cuda_interp = false;
  bool engines = ce == cudaSuccess && engines_start(d, &hw_interp);
  t[1] = dl__now();
  getrusage(RUSAGE_THREAD, &u1);
  /* The CUDA decoder takes 0.7 s to start on an H200; with engines it only decodes what they
   * refuse (progressive, 4:1:1 ...), so it starts when the first such JPEG comes. */
  if (ce == cudaSuccess && !engines)
    st = cuda_decoder_start(d, &cuda_interp);
  d->interpolates = engines ? hw_interp : cuda_interp;
  if (ce != cudaSuccess || st != NVJPEG_STATUS_SUCCESS) {
    snprintf(why, cap, "nvJPEG %s (%s) cannot start on cuda:%d: %s", nv->version, nv->path, device,
             ce != cudaSuccess ? cudaGetErrorString(ce) : dl__nvjpeg_status_name(st));
    dl__gpu_decoder_destroy(d);
    return -1;
  }
  t[2] = dl__now();
  size_t B = (size_t)d->batch;
  d->pool_cap = (size_t)l->o.gpu_decode_mb << 20;
  d->pool_cap += 256; /* each region starts 256-aligned; a region of the pool's size still fits */
  d->half_cap = d->pool_cap / 2 / 256 * 256;
  bool ok = (d->data = calloc(B, sizeof *d->data)) && (d->lens = calloc(B, sizeof *d->lens)) &&
            (d->images = calloc(B, sizeof *d->images)) && (d->params = calloc(B, sizeof *d->params)) &&
            (d->hw_list = calloc(B, sizeof *d->hw_list)) && (d->cuda_list = calloc(B, sizeof *d->cuda_list)) &&
            dl__image_decoder_init(&d->cpu) == 0;
  for (; ok && d->hw.h && d->nparams < d->batch; d->nparams++)
    ok = nv->DecodeParamsCreate(d->hw.h, &d->params[d->nparams]) == NVJPEG_STATUS_SUCCESS;
  if (ok && ((ce = cudaMalloc((void **)&d->pool, d->pool_cap)) ||
             (ce = cudaMalloc((void **)&d->jobs_dev, B * sizeof *d->jobs_dev)) ||
             (ce = cudaEventCreateWithFlags(&d->pool_read[0], cudaEventDisableTiming | cudaEventBlockingSync)) ||
             (ce = cudaEventCreateWithFlags(&d->pool_read[1], cudaEventDisableTiming | cudaEventBlockingSync)) ||
             (ce = cudaHostAlloc((void **)&d->jobs_host, (size_t)l->o.prefetch * B * sizeof *d->jobs_host,
                                 cudaHostAllocPortable)) ||
             (ce = cudaStreamCreateWithFlags(&d->walk_stream, cudaStreamNonBlocking)) ||
             (ce = cudaEventCreateWithFlags(&d->walked, cudaEventDisableTiming | cudaEventBlockingSync)) ||
             (ce = cudaMalloc((void **)&d->walk_dev, B * sizeof *d->walk_dev)) ||
             (ce = cudaMalloc(&d->walk_room, B * dl__walk_room_bytes())) ||
             (ce = cudaMalloc(&d->walk_rows, B * dl__walk_rows_bytes())) ||
             (ce = cudaHostAlloc((void **)&d->walk_host, B * sizeof *d->walk_host, cudaHostAllocPortable)) ||
             (ce = cudaHostAlloc(&d->walk_rows_host, B * dl__walk_rows_bytes(), cudaHostAllocPortable))))
    ok = false;
  if (!ok) {
    snprintf(why, cap, "no memory for JPEG decoding on cuda:%d (gpu_decode_mb=%d): %s", device, l->o.gpu_decode_mb,
             ce != cudaSuccess ? cudaGetErrorString(ce) : "host memory");
    dl__gpu_decoder_destroy(d);
    return -1;
  }
  d->prefetch = l->o.prefetch;
  d->device_bytes =
      d->pool_cap + B * (sizeof *d->jobs_dev + sizeof *d->walk_dev + dl__walk_room_bytes() + dl__walk_rows_bytes());
  *device_bytes += d->device_bytes;
  t[3] = dl__now();
  /* The engine's own buffers, sized once for a batch of images as large as the pool allows. */
  if (d->hw.h) {
    double side = sqrt((double)d->pool_cap / (double)B / d->channels);
    int hint = side > 4096 ? 4096 : side < 64 ? 64 : (int)side;
    nv->DecodeBatchedPreAllocate(d->hw.h, d->hw.state, d->batch, hint, hint, NVJPEG_CSS_444, d->format);
    d->room_w = d->room_h = hint;
    d->room_most = 4 * (int64_t)hint * hint;
  }
  t[4] = dl__now();
  dl__log(DL__LOG_DEBUG, "nvJPEG on cuda:%d started in %.0f ms: the engines' handle and state %.0f (on the CPU "
          "%.0f, %ld waits, %ld page faults), CUDA backend (without engines) %.0f, parameters and buffers %.0f, "
          "the engine's batch buffers %.0f", device, (t[4] - t[0]) * 1e3, (t[1] - t[0]) * 1e3,
          dl__rusage_cpu_ms(&u1) - dl__rusage_cpu_ms(&u0), u1.ru_nvcsw - u0.ru_nvcsw, u1.ru_minflt - u0.ru_minflt,
          (t[2] - t[1]) * 1e3, (t[3] - t[2]) * 1e3, (t[4] - t[3]) * 1e3);
  *out = d;
  return 0;
}

/* Decodes [0, n) of the call arrays as one batch, at index AT of them with n == 1. */
static nvjpegStatus_t run(dl__gpu_decoder *d, engine *e, bool roi, int at, int n, cudaStream_t s) {
  nvjpegStatus_t st = NVJPEG_STATUS_SUCCESS;
  if (e->ready_for != n) {
    st = d->nv->DecodeBatchedInitialize(e->h, e->state, n, 1, d->format);
    e->ready_for = st == NVJPEG_STATUS_SUCCESS ? n : 0;
  }
  if (st == NVJPEG_STATUS_SUCCESS)
    st = roi ? d->nv->DecodeBatchedEx(e->h, e->state, d->data + at, d->lens + at, d->images + at, d->params + at, s)
             : d->nv->DecodeBatched(e->h, e->state, d->data + at, d->lens + at, d->images + at, s);
  if (st != NVJPEG_STATUS_SUCCESS)
    e->ready_for = 0; /* nvJPEG wants a fresh initialisation after a failed batch */
  return st;
}

/* Sample I of HOST, refused by nvJPEG: decoded on the CPU into the host slot, or failed as a
 * worker would have failed it. */
static void decode_on_cpu(dl__gpu_decoder *d, dl_loader *l, dl_batch *host, int i, nvjpegStatus_t why) {
  dl__gpu_job *g = &host->jobs[i];
  const dl__sample *s = &l->ds.samples[g->index];
  if (why != NVJPEG_STATUS_SUCCESS)
    dl__log(DL__LOG_DEBUG, "shard %s member %s: nvJPEG says %s; decoding it on the CPU", l->ds.files[s->file],
            dl__sample_name(&l->ds, s), dl__nvjpeg_status_name(why));
  dl__err e = {0};
  uint8_t *dst = host->image + (size_t)i * l->sample_bytes;
  if (dl__image_decode(&d->cpu, &l->image_spec, host->arena + g->at, g->len, DL__CODEC_JPEG, g->key,
                       dl__sample_flip(l, g->key), (uint32_t)g->index, dst, &e)) {
    dl__sample_zero(l, host, i);
    dl__sample_failed(l, s, &e);
    host->sample_err[i] = e.code;
    pthread_mutex_lock(&l->mu);
    if (l->o.on_error == DL__ON_ERROR_FAIL && i < host->err_i) {
      host->err = e.code;
      host->err_i = i;
      memcpy(host->errmsg, e.msg, sizeof host->errmsg);
    }
    pthread_mutex_unlock(&l->mu);
  }
  g->len = 0;
  atomic_fetch_add_explicit(&l->st.cpu_decoded, 1, memory_order_relaxed);
  if (why != NVJPEG_STATUS_SUCCESS)
    atomic_fetch_add_explicit(&l->st.gpu_fallbacks, 1, memory_order_relaxed);
}

static int round_up(int v, int to) { return (v + to - 1) / to * to; }

/*
 * The engines' buffers sized again, all at once and before the call, where an image of the call
 * is wider or taller than any they were sized for. Left to nvJPEG, each engine grew its own when
 * such an image first came to it, and each growth freed device memory, which waits for all the
 * device's work: a model's step, in the first batches (an H200, hybrid beside a consumer: eight
 * growths in the first 30 ms, the GPU idle 7.6-10.3 ms before the second step; sized here once,
 * in the first batch, before any step: 0-4.5 ms). A quarter more than asked, so that the next
 * larger images do not each cost one; never above four times the pool's share of an image at
 * open (room_most), so that one huge image does not size the buffers of a whole batch for it.
 */
static void make_room(dl__gpu_decoder *d, const dl_batch *host, const dl__resize_job *kj, const int *list,
                      int n) {
  int w = 0, h = 0;
  for (int j = 0; j < n; j++) {
    const dl__gpu_job *g = &host->jobs[kj[list[j]].out];
    if ((int64_t)g->width * g->height > d->room_most)
      continue;
    w = g->width > w ? g->width : w;
    h = g->height > h ? g->height : h;
  }
  if (w <= d->room_w && h <= d->room_h)
    return;
  int rw = d->room_w, rh = d->room_h;
  if (w > rw)
    rw = round_up(w > rw + rw / 4 ? w : rw + rw / 4, 64);
  if (h > rh)
    rh = round_up(h > rh + rh / 4 ? h : rh + rh / 4, 64);
  if ((int64_t)rw * rh > d->room_most)
    return;
  double t0 = dl__now();
  nvjpegStatus_t st =
      d->nv->DecodeBatchedPreAllocate(d->hw.h, d->hw.state, d->batch, rw, rh, NVJPEG_CSS_444, d->format);
  d->hw.ready_for = 0;
  if (st == NVJPEG_STATUS_SUCCESS)
    d->room_w = rw, d->room_h = rh;
  else
    d->room_most = 0; /* (out of device memory): nvJPEG grows its own from now on */
  dl__log(DL__LOG_DEBUG, "nvJPEG on cuda:%d: the engines' buffers sized for %dx%d images in %.1f ms (%s)",
          d->device, rw, rh, (dl__now() - t0) * 1e3, dl__nvjpeg_status_name(st));
}

/* Decodes the jobs KJ[LIST[0..n)] with engine E; those it refuses go to the CPU (out = -1). */
static void decode_list(dl__gpu_decoder *d, dl_loader *l, dl_batch *host, engine *e, bool roi, dl__resize_job *kj,
                        const int *list, int n, cudaStream_t s) {
  if (!n)
    return;
  if (e == &d->cuda && !d->cuda.h) {
    nvjpegStatus_t st = NVJPEG_STATUS_NOT_INITIALIZED;
    if (!d->cuda_tried) { /* the first JPEG the engines refuse: start the CUDA decoder, once */
      double t0 = dl__now();
      bool interpolates;
      cudaSetDevice(d->device);
      st = cuda_decoder_start(d, &interpolates);
      dl__log(DL__LOG_DEBUG, "nvJPEG's CUDA decoder on cuda:%d started in %.0f ms: %s", d->device,
              (dl__now() - t0) * 1e3, dl__nvjpeg_status_name(st));
    }
    if (!d->cuda.h) { /* it could not: the CPU decodes them */
      for (int j = 0; j < n; j++) {
        decode_on_cpu(d, l, host, kj[list[j]].out, st);
        kj[list[j]].out = -1;
      }
      return;
    }
  }
  if (e == &d->hw)
    make_room(d, host, kj, list, n);
  for (int j = 0; j < n; j++) {
    dl__resize_job *k = &kj[list[j]];
    dl__gpu_job *g = &host->jobs[k->out];
    d->data[j] = host->arena + g->at;
    d->lens[j] = g->len;
    memset(&d->images[j], 0, sizeof d->images[j]);
    d->images[j].channel[0] = (unsigned char *)k->full;
    d->images[j].pitch[0] = (size_t)k->full_pitch;
    bool whole = g->roi[2] == g->width && g->roi[3] == g->height;
    if (roi) /* a whole image is decoded as such, not as a region that happens to cover it */
      d->nv->DecodeParamsSetROI(d->params[j], whole ? 0 : g->roi[0], whole ? 0 : g->roi[1], whole ? -1 : g->roi[2],
                                whole ? -1 : g->roi[3]);
  }
  nvjpegStatus_t st = run(d, e, roi, 0, n, s);
  if (st == NVJPEG_STATUS_SUCCESS)
    return;
  /* Which one? Each on its own; the ones still refused are the CPU's. */
  dl__log(DL__LOG_DEBUG, "nvJPEG refused a batch of %d (%s); decoding them one by one", n,
          dl__nvjpeg_status_name(st));
  for (int j = 0; j < n; j++) {
    nvjpegStatus_t one = run(d, e, roi, j, 1, s);
    if (one != NVJPEG_STATUS_SUCCESS) {
      decode_on_cpu(d, l, host, kj[list[j]].out, one);
      kj[list[j]].out = -1;
    }
  }
}

void dl__gpu_decode_failed_batch(dl__gpu_decoder *d, dl_loader *l, dl_batch *host) {
  for (int i = 0; i < host->len && i < host->err_i; i++)
    if (host->jobs[i].len)
      decode_on_cpu(d, l, host, i, NVJPEG_STATUS_SUCCESS);
}

/* The kernels' job for G, whose region nvJPEG decodes at AT in the pool (its scaled copy after it):
 * the crop mapped into what is resampled exactly as libjpeg maps it into a scaled decode. */
static dl__resize_job job_for(const dl__gpu_decoder *d, const dl__gpu_job *g, uint8_t *at, int i) {
  int s = g->scale, C = d->channels;
  size_t full = (size_t)g->roi[2] * (size_t)g->roi[3] * (size_t)C;
  dl__resize_job k = {.full = at, .full_pitch = g->roi[2] * C, .full_w = g->roi[2], .full_h = g->roi[3],
                      .scale = s, .out = i, .flip = g->flip};
  k.w = (g->roi[2] + s - 1) / s;
  k.h = (g->roi[3] + s - 1) / s;
  k.src = s > 1 ? at + (full + 255) / 256 * 256 : at;
  k.pitch = k.w * C;
  /* libjpeg's scaled image is ceil(size / s) pixels and the crop is mapped by that ratio. */
  double sx = (double)((g->width + s - 1) / s) / g->width, sy = (double)((g->height + s - 1) / s) / g->height;
  k.x = (float)(g->rect[0] * sx - g->roi[0] / s);
  k.y = (float)(g->rect[1] * sy - g->roi[1] / s);
  k.cw = (float)(g->rect[2] * sx);
  k.ch = (float)(g->rect[3] * sy);
  return k;
}

typedef struct chunk {
  int first, end; /* its jobs: kj[first, end) */
  int nhw, ncuda;
  int halves;     /* of the pool it takes: 1, 2, or 3 for the whole */
  uint8_t *base;  /* where it starts */
  size_t cap, used;
} chunk;

/* An empty chunk after FIRST in the next half of the pool, or in the whole pool for a region too
 * large for a half. */
static chunk chunk_at(dl__gpu_decoder *d, int first, size_t largest) {
  if (largest > d->half_cap)
    return (chunk){.first = first, .end = first, .halves = 3, .base = d->pool, .cap = d->pool_cap};
  int h = d->half;
  d->half ^= 1;
  return (chunk){.first = first, .end = first, .halves = 1 << h, .base = d->pool + (h ? d->half_cap : 0),
                 .cap = d->half_cap};
}

/* Decodes a chunk and queues the kernel that turns it into batch samples. */
static int flush(dl__gpu_decoder *d, dl_loader *l, dl_batch *host, dl__resize_job *kj, chunk *c, bool scaled,
                 void *out, cudaStream_t s, char *why, size_t cap) {
  cudaError_t e = cudaSuccess;
  for (int h = 0; h < 2 && c->nhw; h++)
    if ((c->halves >> h & 1) && d->pool_pending[h]) {
      double t0 = dl__now();
      e = cudaEventSynchronize(d->pool_read[h]);
      d->pool_wait_ms += (dl__now() - t0) * 1e3;
      if (e != cudaSuccess) {
        snprintf(why, cap, "JPEG decoding on cuda:%d failed: %s", d->device, cudaGetErrorString(e));
        return -1;
      }
    }
  decode_list(d, l, host, &d->hw, true, kj, d->hw_list, c->nhw, s);
  decode_list(d, l, host, &d->cuda, false, kj, d->cuda_list, c->ncuda, s);
  int m = c->first;
  for (int k = c->first; k < c->end; k++)
    if (kj[k].out >= 0)
      kj[m++] = kj[k];
  int n = m - c->first;
  if (n) {
    e = cudaMemcpyAsync(d->jobs_dev, kj + c->first, (size_t)n * sizeof *kj, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess && scaled)
      e = (cudaError_t)dl__box_launch(d->jobs_dev, n, l->o.channels, s);
    if (e == cudaSuccess)
      e = (cudaError_t)dl__resize_launch(d->jobs_dev, n, out, l->o.height, l->o.width, l->o.channels,
                                         l->o.layout == DL__LAYOUT_NCHW, l->o.dtype, l->o.mean, l->o.std, s);
    for (int h = 0; h < 2 && e == cudaSuccess; h++)
      if (c->halves >> h & 1) {
        e = cudaEventRecord(d->pool_read[h], s);
        d->pool_pending[h] = e == cudaSuccess;
      }
  }
  if (e != cudaSuccess) {
    snprintf(why, cap, "JPEG decoding on cuda:%d failed: %s", d->device, cudaGetErrorString(e));
    return -1;
  }
  *c = (chunk){.first = c->end, .end = c->end};
  return n;
}

/* Queues the device's reads of HOST's scans that no worker read (gpu_check, jobs marked walk), to
 * run beside the decodes; how many, each verdict -1 (read on the CPU after) where there is no
 * device memory for them. -1 with WHY when CUDA itself fails. */
static int walks_start(dl__gpu_decoder *d, dl_loader *l, dl_batch *host, char *why, size_t cap) {
  int n = 0;
  for (int i = 0; i < host->len; i++)
    if (host->jobs[i].len && host->jobs[i].walk)
      d->walk_host[n++] = (dl__walk_job){.at = host->jobs[i].at, .len = host->jobs[i].len, .out = i, .verdict = -1};
  if (!n)
    return 0;
  if (d->walk_cap < l->arena_bytes) { /* a decoder's first walk, or a kept one's for larger arenas */
    cudaFree(d->walk_bytes);
    d->walk_bytes = NULL;
    d->walk_cap = cudaMalloc((void **)&d->walk_bytes, l->arena_bytes) == cudaSuccess ? l->arena_bytes : 0;
    if (!d->walk_cap) {
      cudaGetLastError();
      dl__log(DL__LOG_DEBUG, "no device memory on cuda:%d to read scans (%zu bytes): the CPU reads them", d->device,
              l->arena_bytes);
      return n;
    }
  }
  cudaError_t e = cudaMemcpyAsync(d->walk_bytes, host->arena, host->arena_used, cudaMemcpyHostToDevice,
                                  d->walk_stream);
  if (!e)
    e = cudaMemcpyAsync(d->walk_dev, d->walk_host, (size_t)n * sizeof *d->walk_dev, cudaMemcpyHostToDevice,
                        d->walk_stream);
  if (!e)
    e = (cudaError_t)dl__walk_launch(d->walk_bytes, d->walk_dev, n, d->walk_room, d->walk_rows, d->walk_stream);
  if (!e)
    e = cudaMemcpyAsync(d->walk_host, d->walk_dev, (size_t)n * sizeof *d->walk_dev, cudaMemcpyDeviceToHost,
                        d->walk_stream);
  if (!e)
    e = cudaMemcpyAsync(d->walk_rows_host, d->walk_rows, (size_t)n * dl__walk_rows_bytes(), cudaMemcpyDeviceToHost,
                        d->walk_stream);
  if (!e)
    e = cudaEventRecord(d->walked, d->walk_stream);
  if (e) {
    snprintf(why, cap, "reading JPEG scans on cuda:%d failed: %s", d->device, cudaGetErrorString(e));
    return -1;
  }
  return n;
}

/* The verdicts of HOST's N walks, kept for the next epochs with the clean ones' row starts (the
 * later epochs' CPU decodes of them skip the rows above their crops, as after a worker's walk); an
 * image that does not read clean is decoded again on the CPU (its GPU decode is overwritten by the
 * CPU samples' copy that follows). How many went to the CPU, or -1 with WHY. */
static int walks_end(dl__gpu_decoder *d, dl_loader *l, dl_batch *host, int n, char *why, size_t cap) {
  if (d->walk_cap) {
    double t0 = dl__now();
    cudaError_t e = cudaEventSynchronize(d->walked);
    d->walk_wait_ms += (dl__now() - t0) * 1e3;
    if (e) {
      snprintf(why, cap, "reading JPEG scans on cuda:%d failed: %s", d->device, cudaGetErrorString(e));
      return -1;
    }
  }
  int moved = 0;
  for (int k = 0; k < n; k++) {
    const dl__walk_job *w = &d->walk_host[k];
    dl__gpu_job *g = &host->jobs[w->out];
    int v = w->verdict;
    if (v < 0) /* not read on the device: read here, and kept */
      v = dl__jpeg_rows_clean(l->jpeg_rows, (uint32_t)g->index, host->arena + g->at, w->len, l->o.max_pixels);
    else
      dl__jpeg_rows_note(l->jpeg_rows, (uint32_t)g->index, v == 1);
    if (v == 1 && w->rows)
      dl__jpeg_rows_learn(l->jpeg_rows, (uint32_t)g->index, host->arena + g->at, w->len, w->entropy_at,
                          (const uint8_t *)d->walk_rows_host + (size_t)k * dl__walk_rows_bytes(), w->rows);
    d->walks++;
    if (v)
      continue;
    d->walks_damaged++;
    if (!g->len)
      continue; /* nvJPEG refused it: the CPU decoded it already */
    const dl__sample *s = &l->ds.samples[g->index];
    dl__log(DL__LOG_DEBUG, "shard %s member %s: its scan does not read through; decoding it on the CPU",
            l->ds.files[s->file], dl__sample_name(&l->ds, s));
    decode_on_cpu(d, l, host, w->out, NVJPEG_STATUS_SUCCESS);
    moved++;
  }
  return moved;
}

int dl__gpu_decode(dl__gpu_decoder *d, dl_loader *l, dl_batch *host, int slot, void *out, cudaStream_t s, char *why,
                   size_t cap) {
  dl__resize_job *kj = d->jobs_host + (size_t)slot * (size_t)d->batch;
  chunk c = {0};
  int decoded = 0, walks = walks_start(d, l, host, why, cap);
  if (walks < 0)
    return -1;
  bool any_scaled = false;
  for (int i = 0; i < host->len; i++) {
    const dl__gpu_job *g = &host->jobs[i];
    if (!g->len)
      continue;
    size_t bytes = dl__gpu_job_bytes(g->roi, g->scale, d->channels);
    if (c.end > c.first && c.used + bytes > c.cap) { /* its part of the pool is full: decode what it holds */
      int n = flush(d, l, host, kj, &c, any_scaled, out, s, why, cap);
      if (n < 0)
        return -1;
      decoded += n;
      any_scaled = false;
    }
    if (c.end == c.first)
      c = chunk_at(d, c.first, bytes);
    kj[c.end] = job_for(d, g, c.base + c.used, i);
    any_scaled |= g->scale > 1;
    c.used += bytes;
    if (g->engine == DL__GPU_ENGINE_HW)
      d->hw_list[c.nhw++] = c.end;
    else
      d->cuda_list[c.ncuda++] = c.end;
    c.end++;
  }
  int n = flush(d, l, host, kj, &c, any_scaled, out, s, why, cap);
  if (n < 0)
    return -1;
  int moved = walks ? walks_end(d, l, host, walks, why, cap) : 0;
  if (moved < 0)
    return -1;
  decoded += n - moved;
  atomic_fetch_add_explicit(&l->st.gpu_decoded, decoded, memory_order_relaxed);
  return decoded;
}
