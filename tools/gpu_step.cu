// The GPU side of dlbench --step-ms: each batch gets a kernel that reads all of it and then spins
// until T ms have passed on the GPU's clock. Events around each step give the idle gaps: the time
// from one step's end to the next one's start is time the GPU had nothing to do.
#include "gpu_step.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RING 128

struct gpu_step {
  int device;
  double step_ms, kernel_ms;
  int blocks; /* two per SM: the step holds every SM, whatever the card */
  cudaStream_t stream;
  cudaEvent_t start[RING], end[RING];
  long steps;
  double busy_ms, idle_ms;
  gpu_step_idle gaps;
  unsigned long long *sink;
};

static char err_msg[256];

static int fail(cudaError_t e, const char *what) {
  snprintf(err_msg, sizeof err_msg, "%s: %s", what, cudaGetErrorString(e));
  return -1;
}

extern "C" const char *gpu_step_error(void) { return err_msg; }

__device__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void step(const uint8_t *data, size_t bytes, unsigned long long ns, unsigned long long *sink) {
  unsigned long long t0 = globaltimer();
  unsigned long long acc = 0;
  size_t words = bytes / 16;
  const uint4 *v = (const uint4 *)data;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x) {
    uint4 x = v[i];
    acc += x.x ^ x.y ^ x.z ^ x.w;
  }
  while (globaltimer() - t0 < ns)
    acc += 1;
  if (acc == 42)
    *sink = acc; // keeps the reads alive
}

extern "C" double gpu_used_mb(const char *device) {
  const char *colon = strchr(device, ':');
  size_t free_b = 0, total = 0;
  if (cudaSetDevice(colon ? atoi(colon + 1) : 0) != cudaSuccess || cudaMemGetInfo(&free_b, &total) != cudaSuccess)
    return -1;
  return (double)(total - free_b) / 1048576.0;
}

extern "C" int gpu_step_open(gpu_step **out, const char *device, double step_ms, double kernel_ms) {
  gpu_step *g = (gpu_step *)calloc(1, sizeof *g);
  g->device = 0;
  const char *colon = strchr(device, ':');
  if (colon)
    g->device = atoi(colon + 1);
  g->step_ms = step_ms;
  g->kernel_ms = kernel_ms > 0 ? kernel_ms : 1;
  int sms = 0;
  cudaError_t e = cudaSetDevice(g->device);
  if (!e)
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g->device);
  g->blocks = 2 * (sms > 0 ? sms : 1);
  if (!e)
    e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
  for (int i = 0; !e && i < RING; i++) {
    e = cudaEventCreate(&g->start[i]);
    if (!e)
      e = cudaEventCreate(&g->end[i]);
  }
  if (!e)
    e = cudaMalloc(&g->sink, sizeof *g->sink);
  if (e) {
    free(g);
    return fail(e, "setting up the GPU consumer");
  }
  *out = g;
  return 0;
}

// Keeps GAP (before step I) among the largest, and counts it if over a millisecond.
static void note_gap(gpu_step_idle *s, long i, double gap) {
  if (gap > 1) {
    s->gaps_over_1ms++;
    s->over_1ms_ms += gap;
  }
  int at = s->nlargest;
  while (at > 0 && s->largest[at - 1].ms < gap)
    at--;
  if (at == GPU_STEP_LARGEST || gap <= 0)
    return;
  int last = s->nlargest < GPU_STEP_LARGEST ? s->nlargest++ : GPU_STEP_LARGEST - 1;
  memmove(&s->largest[at + 1], &s->largest[at], (size_t)(last - at) * sizeof s->largest[0]);
  s->largest[at].step = i;
  s->largest[at].ms = gap;
}

// Folds step I's timing into the totals (its events have completed).
static void account(gpu_step *g, long i) {
  float busy = 0, gap = 0;
  cudaEventSynchronize(g->end[i % RING]);
  cudaEventElapsedTime(&busy, g->start[i % RING], g->end[i % RING]);
  g->busy_ms += busy;
  if (i > 0) {
    cudaEventElapsedTime(&gap, g->end[(i - 1) % RING], g->start[i % RING]);
    g->idle_ms += gap > 0 ? gap : 0;
    note_gap(&g->gaps, i, gap);
  }
}

extern "C" int gpu_step_consume(gpu_step *g, dl_batch *b, const DLTensor *image) {
  long i = g->steps;
  if (i >= RING - 1)
    account(g, i - (RING - 1)); // before its start event is reused two slots later
  int r = dl_batch_wait(b, g->stream);
  if (r)
    return r;
  size_t bytes = (size_t)(image->dtype.bits / 8);
  for (int d = 0; d < image->ndim; d++)
    bytes *= (size_t)image->shape[d];
  cudaEventRecord(g->start[i % RING], g->stream);
  /* A model's step is many kernels, not one: kernels of about 1 ms (--step-kernel-ms), the first
   * reading the batch, so that other streams' work is scheduled between them as in training. */
  int pieces = g->step_ms > g->kernel_ms ? (int)(g->step_ms / g->kernel_ms + 0.5) : 1;
  unsigned long long ns = (unsigned long long)(g->step_ms * 1e6 / pieces);
  for (int p = 0; p < pieces; p++)
    step<<<g->blocks, 256, 0, g->stream>>>(p ? NULL : (const uint8_t *)image->data, p ? 0 : bytes, ns, g->sink);
  cudaEventRecord(g->end[i % RING], g->stream);
  cudaError_t e = cudaGetLastError();
  if (e)
    return fail(e, "launching the step kernel");
  g->steps++;
  dl_batch_release(b, g->stream);
  return 0;
}

extern "C" int gpu_step_fetch(gpu_step *g, dl_batch *b, const DLTensor *t, void *host) {
  size_t bytes = (size_t)(t->dtype.bits / 8);
  for (int d = 0; d < t->ndim; d++)
    bytes *= (size_t)t->shape[d];
  dl_batch_wait(b, g->stream);
  cudaMemcpyAsync(host, t->data, bytes, cudaMemcpyDeviceToHost, g->stream);
  cudaError_t e = cudaStreamSynchronize(g->stream);
  return e ? fail(e, "copying the batch back") : 0;
}

extern "C" void gpu_step_close(gpu_step *g, gpu_step_idle *idle) {
  cudaStreamSynchronize(g->stream);
  long first = g->steps > RING - 1 ? g->steps - (RING - 1) : 0;
  for (long i = first; i < g->steps; i++)
    account(g, i);
  double span = g->busy_ms + g->idle_ms;
  *idle = g->gaps;
  idle->frac = g->steps > 1 && span > 0 ? g->idle_ms / span : (g->steps ? 0 : -1);
  for (int i = 0; i < RING; i++) {
    cudaEventDestroy(g->start[i]);
    cudaEventDestroy(g->end[i]);
  }
  cudaFree(g->sink);
  cudaStreamDestroy(g->stream);
  free(g);
}
