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
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

int dl__convert_launch(const uint8_t *in, void *out, int n, int h, int w, int c, int nchw, int dtype,
                       const float *mean, const float *std, cudaStream_t s);

#define PENDING_MAX 64

typedef struct gpu_slot {
  void *image;         /* device image buffer (the configured dtype and layout) */
  int64_t *label;      /* device labels */
  cudaEvent_t copied;  /* recorded after the batch's copy (and conversion) */
  cudaEvent_t released;
  bool release_pending; /* released was recorded and the copy stream must wait on it */
  cudaEvent_t t0, t1;  /* timing of the copy */
} gpu_slot;

typedef struct pending {
  dl_batch *host;
  gpu_slot *gs;
  size_t bytes;
} pending;

typedef struct gpu {
  dl_loader *l;
  int index, id;
  cudaStream_t copy;
  pthread_t thread;
  bool started;
  gpu_slot *slots;
  uint8_t *staging;  /* uint8 landing buffer when the output is float */
  pending q[PENDING_MAX];
  int qhead, qlen;
  double copy_ms;    /* GPU time of the host-to-device copies */
  int64_t copy_bytes;
  char error[256];
} gpu;

typedef struct cuda_state {
  int n;
  gpu g[DL__MAX_DEVICES];
  size_t out_sample_bytes; /* one sample on the device */
} cuda_state;

static int dtype_size(int dtype) { return dtype == DL__DTYPE_UINT8 ? 1 : dtype == DL__DTYPE_FLOAT32 ? 4 : 2; }

static int cuda_fail(cudaError_t e, const char *what) {
  return dl__fail(DL_ECUDA, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int dl__cuda_open(dl_loader *l) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return dl__fail(DL_ENODEVICE, "option device=cuda: no CUDA device is usable here (%s)",
                    e != cudaSuccess ? cudaGetErrorString(e) : "none found");
  for (int i = 0; i < l->o.ndevices; i++)
    if (l->o.device_ids[i] >= count)
      return dl__fail(DL_ENODEVICE, "option device=cuda:%d: this machine has %d CUDA device%s",
                      l->o.device_ids[i], count, count == 1 ? "" : "s");
  cuda_state *c = calloc(1, sizeof *c);
  if (!c)
    return dl__fail(-ENOMEM, "out of memory");
  c->n = l->o.ndevices;
  c->out_sample_bytes =
      l->has_image ? (size_t)l->o.height * l->o.width * l->o.channels * dtype_size(l->o.dtype) : 0;
  for (int i = 0; i < c->n; i++) {
    c->g[i].l = l;
    c->g[i].index = i;
    c->g[i].id = l->o.device_ids[i];
  }
  l->cuda = c;
  return 0;
}

void *dl__host_alloc(dl_loader *l, size_t bytes) {
  if (!l->cuda)
    return aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  void *p = NULL;
  cudaSetDevice(((cuda_state *)l->cuda)->g[0].id);
  return cudaHostAlloc(&p, bytes, cudaHostAllocPortable) == cudaSuccess ? p : NULL;
}

void dl__host_free(dl_loader *l, void *p) {
  if (l->cuda)
    cudaFreeHost(p);
  else
    free(p);
}

/* Frees host slot copies of finished transfers; with WAIT, waits for the oldest one first. */
static int reap(gpu *g, bool wait) {
  dl_loader *l = g->l;
  while (g->qlen) {
    pending *p = &g->q[g->qhead];
    cudaError_t e = wait ? cudaEventSynchronize(p->gs->copied) : cudaEventQuery(p->gs->copied);
    if (e == cudaErrorNotReady)
      return 0;
    if (e != cudaSuccess) {
      snprintf(g->error, sizeof g->error, "copy to cuda:%d failed: %s", g->id, cudaGetErrorString(e));
      return -1;
    }
    float ms = 0;
    if (cudaEventElapsedTime(&ms, p->gs->t0, p->gs->t1) == cudaSuccess)
      g->copy_ms += ms;
    g->copy_bytes += (int64_t)p->bytes;
    pthread_mutex_lock(&l->mu);
    dl__slot_free_locked(p->host);
    pthread_mutex_unlock(&l->mu);
    g->qhead = (g->qhead + 1) % PENDING_MAX;
    g->qlen--;
    wait = false;
  }
  return 0;
}

static int enqueue(gpu *g, dl_batch *host, dl_batch *dev) {
  dl_loader *l = g->l;
  cuda_state *c = l->cuda;
  gpu_slot *gs = dev->gpu;
  size_t in_bytes = (size_t)host->len * l->sample_bytes;
  cudaError_t e = cudaSuccess;
  if (gs->release_pending)
    e = cudaStreamWaitEvent(g->copy, gs->released, 0);
  gs->release_pending = false;
  bool convert = l->o.dtype != DL__DTYPE_UINT8;
  if (!e)
    e = cudaMemcpyAsync(gs->label, host->label, (size_t)host->len * sizeof(int64_t),
                        cudaMemcpyHostToDevice, g->copy);
  /* The timing events bracket the batch's data (image and tensor fields, not the labels): the
   * rate comparable with a plain copy. */
  if (!e)
    e = cudaEventRecord(gs->t0, g->copy);
  if (!e && in_bytes)
    e = cudaMemcpyAsync(convert ? g->staging : gs->image, host->image, in_bytes, cudaMemcpyHostToDevice,
                        g->copy);
  if (!e && l->field_block)
    e = cudaMemcpyAsync(dev->fields, host->fields, l->field_block, cudaMemcpyHostToDevice, g->copy);
  if (!e)
    e = cudaEventRecord(gs->t1, g->copy);
  if (!e && convert && in_bytes)
    e = (cudaError_t)dl__convert_launch(g->staging, gs->image, host->len, l->o.height, l->o.width,
                                        l->o.channels, l->o.layout == DL__LAYOUT_NCHW, l->o.dtype,
                                        l->o.mean, l->o.std, g->copy);
  if (!e)
    e = cudaEventRecord(gs->copied, g->copy);
  if (e) {
    snprintf(g->error, sizeof g->error, "queueing the copy to cuda:%d failed: %s", g->id,
             cudaGetErrorString(e));
    return -1;
  }
  (void)c;
  memcpy(dev->key, host->key, sizeof(*dev->key) * (size_t)host->len);
  memcpy(dev->sample_err, host->sample_err, sizeof(int) * (size_t)host->len);
  g->q[(g->qhead + g->qlen) % PENDING_MAX] = (pending){host, gs, in_bytes + l->field_block};
  g->qlen++;
  return 0;
}

static void *copy_thread(void *arg) {
  gpu *g = arg;
  dl_loader *l = g->l;
  dl__stream *s = &l->streams[g->index];
  cudaSetDevice(g->id);
  for (int64_t k = 0;; k++) {
    if (s->sm.total >= 0 && k >= s->sm.total)
      break;
    dl_batch *host = &s->slots[k % l->o.prefetch];
    dl_batch *dev = &s->dslots[k % l->o.device_slots];
    bool stop = false;
    for (;;) {
      if (reap(g, false))
        goto failed;
      pthread_mutex_lock(&l->mu);
      bool host_ok = host->k == k && host->state == DL__SLOT_COMPLETE;
      bool dev_ok = dev->state == DL__SLOT_FREE;
      stop = l->stop;
      if (host_ok && dev_ok) {
        dev->state = DL__SLOT_FILLING;
        pthread_mutex_unlock(&l->mu);
        break;
      }
      if (stop) {
        pthread_mutex_unlock(&l->mu);
        break;
      }
      if (g->qlen) {
        pthread_mutex_unlock(&l->mu);
        if (reap(g, true))
          goto failed;
        continue;
      }
      pthread_cond_wait(&l->ready_cv, &l->mu);
      pthread_mutex_unlock(&l->mu);
    }
    if (stop)
      break;
    /* The host batch's own error (on_error=fail) travels with the device batch. */
    if (!host->err && enqueue(g, host, dev))
      goto failed;
    pthread_mutex_lock(&l->mu);
    dev->k = k;
    dev->epoch = host->epoch;
    dev->index = host->index;
    dev->len = host->len;
    dev->err = host->err;
    memcpy(dev->errmsg, host->errmsg, sizeof dev->errmsg);
    dev->ready = true;
    dev->state = DL__SLOT_COMPLETE;
    if (host->err)
      dl__slot_free_locked(host);
    pthread_cond_broadcast(&l->ready_cv);
    pthread_mutex_unlock(&l->mu);
  }
  reap(g, true);
  while (g->qlen)
    reap(g, true);
  return NULL;
failed:
  dl__log(DL__LOG_ERROR, "%s", g->error);
  pthread_mutex_lock(&l->mu);
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
    if (!e)
      e = cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking);
    if (e)
      return cuda_fail(e, "creating the copy stream");
    s->dslots = calloc((size_t)D, sizeof *s->dslots);
    g->slots = calloc((size_t)D, sizeof *g->slots);
    if (!s->dslots || !g->slots)
      return dl__fail(-ENOMEM, "out of memory");
    if (l->has_image && l->o.dtype != DL__DTYPE_UINT8 && (e = cudaMalloc((void **)&g->staging, l->image_bytes)))
      return cuda_fail(e, "allocating device memory");
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
      if (!b->key || !b->sample_err)
        return dl__fail(-ENOMEM, "out of memory");
      if ((e = cudaMalloc(&gs->image, c->out_sample_bytes * (size_t)B + 1)) ||
          (e = cudaMalloc((void **)&gs->label, sizeof(int64_t) * (size_t)B)))
        return cuda_fail(e, "allocating device batch memory");
      b->image = gs->image;
      b->label = gs->label;
      if (l->field_block && (e = cudaMalloc((void **)&b->fields, l->field_block)))
        return cuda_fail(e, "allocating device field memory");
      /* The copy thread sleeps on 'copied' rather than spinning a core the workers need. */
      if ((e = cudaEventCreateWithFlags(&gs->copied, cudaEventDisableTiming | cudaEventBlockingSync)) ||
          (e = cudaEventCreateWithFlags(&gs->released, cudaEventDisableTiming)) ||
          (e = cudaEventCreate(&gs->t0)) || (e = cudaEventCreate(&gs->t1)))
        return cuda_fail(e, "creating events");
    }
  }
  for (int i = 0; i < c->n; i++) {
    int r = pthread_create(&c->g[i].thread, NULL, copy_thread, &c->g[i]);
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
      if (gs->t0)
        cudaEventDestroy(gs->t0);
      if (gs->t1)
        cudaEventDestroy(gs->t1);
      if (s->dslots) {
        cudaFree(s->dslots[j].fields);
        free(s->dslots[j].key);
        free(s->dslots[j].sample_err);
      }
    }
    cudaFree(g->staging);
    if (g->copy)
      cudaStreamDestroy(g->copy);
    free(g->slots);
    free(s->dslots);
    s->dslots = NULL;
  }
  l->cuda = NULL;
  free(c);
}

int dl__cuda_field(const dl_batch *b, const char *name, DLTensor *t) {
  cuda_state *c = b->l->cuda;
  return dl__batch_describe(b, name, (DLDevice){kDLCUDA, c->g[b->stream].id}, t);
}

int dl__cuda_wait(dl_batch *b, void *stream) {
  gpu_slot *gs = b->gpu;
  cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, gs->copied, 0);
  return e ? cuda_fail(e, "waiting for the batch's copy") : 0;
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
  if (prev != id && prev >= 0)
    cudaSetDevice(prev);
}

int dl__cuda_stats(dl_loader *l, char *buf, size_t cap) {
  cuda_state *c = l->cuda;
  double ms = 0;
  int64_t bytes = 0;
  for (int i = 0; i < c->n; i++) {
    ms += c->g[i].copy_ms;
    bytes += c->g[i].copy_bytes;
  }
  return snprintf(buf, cap, ",\"h2d_bytes\":%lld,\"h2d_gpu_ms\":%.3f,\"h2d_gb_s\":%.3f,\"device_slots\":%d",
                  (long long)bytes, ms, ms > 0 ? bytes / ms / 1e6 : 0.0, l->o.device_slots);
}
