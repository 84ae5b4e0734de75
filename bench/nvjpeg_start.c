/*
 * Where nvJPEG's start goes (0.65-0.9 s on H100 and H200 hosts: what decode=auto spends on the CPU
 * alone and decode=gpu|hybrid wait for in dl_open), in a fresh process: CUDA's own start, then the
 * hardware backend's handle and its JPEG state, as the loader makes them, with the memory nvJPEG
 * asks for through allocators that count it (none, at start). Variants, one a process:
 *   --beside cuda|hw        a second thread starts nvJPEG's CUDA decoder (or another engine
 *                           handle) meanwhile: whether the two starts share a cost or overlap
 *   --twice                 the same start again after the first is destroyed: what is paid once a
 *                           process, not once a handle
 *   --info before|after|beside   the engines counted (nvjpegGetHardwareDecoderInfo) between the
 *                           handle and the state, after the state (the loader's order), or on a
 *                           second thread while the state is made
 *   --plain                 nvJPEG's own allocators, not the counting ones
 *   --busy                  beside kernels that keep every SM busy (bench/busy_gpu.cu), as when the
 *                           workers' batches are copied and resized while nvJPEG starts
 *   --spin N                beside N threads that keep a CPU busy each, as the workers do
 *   --copies                beside a thread copying 16 MB from pinned memory to the device over and
 *                           over, as decode=auto's copy thread does while nvJPEG starts
 *   --register              beside a thread pinning and unpinning 16 MB over and over, as the GPU
 *                           stage's starter pins the slots
 *   --queries               beside a thread asking CUDA whether a stream is idle over and over
 *   --blocking              beside a thread waiting for a small copy over and over on an event made
 *                           with cudaEventBlockingSync, as the copy thread waits for its batches
 *   --delay MS              MS milliseconds between CUDA's start and nvJPEG's, as in a training
 *                           script that built its model before opening the loader
 * Prints one JSON object of milliseconds.
 */
#include "gpu/nvjpeg.h"
#include "core.h"
#include "busy_gpu.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const dl__nvjpeg *nv;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static double dev_ms, pinned_ms;
static size_t dev_bytes, pinned_bytes;
static int dev_calls, pinned_calls;

static int dev_malloc(void **p, size_t n) {
  double t = dl__now();
  cudaError_t e = cudaMalloc(p, n);
  pthread_mutex_lock(&mu);
  dev_ms += (dl__now() - t) * 1e3, dev_bytes += n, dev_calls++;
  pthread_mutex_unlock(&mu);
  return e;
}

static int dev_free(void *p) {
  return cudaFree(p);
}

static int pinned_malloc(void **p, size_t n, unsigned flags) {
  double t = dl__now();
  cudaError_t e = cudaHostAlloc(p, n, flags);
  pthread_mutex_lock(&mu);
  pinned_ms += (dl__now() - t) * 1e3, pinned_bytes += n, pinned_calls++;
  pthread_mutex_unlock(&mu);
  return e;
}

static int pinned_free(void *p) {
  return cudaFreeHost(p);
}

static int spinning; /* the threads beside the start run while it is set */

static void *spin_run(void *arg) {
  (void)arg;
  while (__atomic_load_n(&spinning, __ATOMIC_RELAXED))
    ;
  return NULL;
}

/* A thread beside the start that keeps CUDA's driver at work without the SMs. */
typedef enum { CHORE_NONE, CHORE_COPIES, CHORE_REGISTER, CHORE_QUERIES, CHORE_BLOCKING } chore_kind;

static void *chore_run(void *arg) {
  chore_kind k = (chore_kind)(intptr_t)arg;
  cudaSetDevice(0);
  bool copies = k == CHORE_COPIES || k == CHORE_BLOCKING;
  size_t n = k == CHORE_BLOCKING ? 64 << 10 : 16 << 20;
  void *host = NULL, *dev = NULL;
  cudaStream_t s;
  cudaEvent_t done;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&done, cudaEventDisableTiming | cudaEventBlockingSync);
  if (copies && (cudaHostAlloc(&host, n, cudaHostAllocPortable) || cudaMalloc(&dev, n)))
    return NULL;
  if (k == CHORE_REGISTER && !(host = malloc(n)))
    return NULL;
  while (__atomic_load_n(&spinning, __ATOMIC_RELAXED)) {
    if (copies)
      cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s);
    if (k == CHORE_COPIES) {
      cudaStreamSynchronize(s);
    } else if (k == CHORE_BLOCKING) {
      cudaEventRecord(done, s);
      cudaEventSynchronize(done);
    } else if (k == CHORE_REGISTER) {
      cudaHostRegister(host, n, cudaHostRegisterPortable);
      cudaHostUnregister(host);
    } else {
      cudaStreamQuery(s);
    }
  }
  if (copies)
    cudaFreeHost(host), cudaFree(dev);
  else
    free(host);
  cudaEventDestroy(done);
  cudaStreamDestroy(s);
  return NULL;
}

static nvjpegDevAllocator_t dev_alloc = {dev_malloc, dev_free};
static nvjpegPinnedAllocator_t pinned_alloc = {pinned_malloc, pinned_free};

typedef enum { INFO_NONE, INFO_BEFORE, INFO_AFTER, INFO_BESIDE } info_when;

typedef struct start {
  nvjpegBackend_t backend;
  bool counted; /* through the counting allocators */
  info_when info;
  unsigned engines, cores;
  double handle_ms, state_ms, info_ms;
  nvjpegHandle_t h;
  nvjpegJpegState_t st;
  int status;
} start;

static void *info_run(void *arg) {
  start *s = arg;
  cudaSetDevice(0);
  double t = dl__now();
  nv->GetHardwareDecoderInfo(s->h, &s->engines, &s->cores);
  s->info_ms = (dl__now() - t) * 1e3;
  return NULL;
}

static void *start_run(void *arg) {
  start *s = arg;
  cudaSetDevice(0);
  double t = dl__now();
  s->status =
      nv->CreateEx(s->backend, s->counted ? &dev_alloc : NULL, s->counted ? &pinned_alloc : NULL,
                   NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE | NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, &s->h);
  s->handle_ms = (dl__now() - t) * 1e3;
  if (s->status)
    return NULL;
  if (s->info == INFO_BEFORE)
    info_run(s);
  pthread_t beside;
  bool two = s->info == INFO_BESIDE && pthread_create(&beside, NULL, info_run, s) == 0;
  t = dl__now();
  s->status = nv->JpegStateCreate(s->h, &s->st);
  s->state_ms = (dl__now() - t) * 1e3;
  if (two)
    pthread_join(beside, NULL);
  if (s->info == INFO_AFTER)
    info_run(s);
  return NULL;
}

static void stop(start *s) {
  if (s->st)
    nv->JpegStateDestroy(s->st);
  if (s->h)
    nv->Destroy(s->h);
  s->st = NULL, s->h = NULL;
}

int main(int argc, char **argv) {
  const char *beside = NULL;
  bool twice = false, counted = true, busy = false;
  int spin = 0;
  chore_kind chore = CHORE_NONE;
  int delay_ms = 0;
  info_when info = INFO_NONE;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--beside") && i + 1 < argc)
      beside = argv[++i];
    else if (!strcmp(argv[i], "--twice"))
      twice = true;
    else if (!strcmp(argv[i], "--plain"))
      counted = false;
    else if (!strcmp(argv[i], "--busy"))
      busy = true;
    else if (!strcmp(argv[i], "--spin") && i + 1 < argc)
      spin = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--delay") && i + 1 < argc)
      delay_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--copies"))
      chore = CHORE_COPIES;
    else if (!strcmp(argv[i], "--register"))
      chore = CHORE_REGISTER;
    else if (!strcmp(argv[i], "--queries"))
      chore = CHORE_QUERIES;
    else if (!strcmp(argv[i], "--blocking"))
      chore = CHORE_BLOCKING;
    else if (!strcmp(argv[i], "--info") && i + 1 < argc && !strcmp(argv[i + 1], "before"))
      info = INFO_BEFORE, i++;
    else if (!strcmp(argv[i], "--info") && i + 1 < argc && !strcmp(argv[i + 1], "after"))
      info = INFO_AFTER, i++;
    else if (!strcmp(argv[i], "--info") && i + 1 < argc && !strcmp(argv[i + 1], "beside"))
      info = INFO_BESIDE, i++;
    else {
      fprintf(stderr,
              "usage: nvjpeg_start [--beside cuda|hw] [--twice] [--plain] [--info before|after|beside] "
              "[--busy] [--spin N] [--copies|--register|--queries|--blocking] [--delay MS]\n");
      return 2;
    }
  }
  double t0 = dl__now();
  char why[400];
  if (!(nv = dl__nvjpeg_load(why, sizeof why))) {
    fprintf(stderr, "nvjpeg_start: %s\n", why);
    return 77;
  }
  double load_ms = (dl__now() - t0) * 1e3, t = dl__now();
  if (cudaFree(0) != cudaSuccess) {
    fprintf(stderr, "nvjpeg_start: no CUDA device\n");
    return 77;
  }
  double cuda_ms = (dl__now() - t) * 1e3;
  if (delay_ms > 0)
    nanosleep(&(struct timespec){delay_ms / 1000, (long)(delay_ms % 1000) * 1000000}, NULL);
  if (busy && busy_gpu_start()) {
    fprintf(stderr, "nvjpeg_start: no GPU to keep busy\n");
    return 77;
  }
  pthread_t spinners[64];
  __atomic_store_n(&spinning, 1, __ATOMIC_RELAXED);
  if (spin > 64)
    spin = 64;
  for (int i = 0; i < spin; i++)
    if (pthread_create(&spinners[i], NULL, spin_run, NULL))
      spin = i;
  pthread_t chorer;
  bool chores = chore != CHORE_NONE && pthread_create(&chorer, NULL, chore_run, (void *)(intptr_t)chore) == 0;
  start a = {.backend = NVJPEG_BACKEND_HARDWARE, .counted = counted, .info = info};
  start b = {.backend = beside && !strcmp(beside, "hw") ? NVJPEG_BACKEND_HARDWARE : NVJPEG_BACKEND_GPU_HYBRID,
             .counted = counted};
  pthread_t other;
  t = dl__now();
  bool two = beside && pthread_create(&other, NULL, start_run, &b) == 0;
  start_run(&a);
  double a_ms = (dl__now() - t) * 1e3;
  if (two)
    pthread_join(other, NULL);
  double both_ms = (dl__now() - t) * 1e3;
  __atomic_store_n(&spinning, 0, __ATOMIC_RELAXED);
  for (int i = 0; i < spin; i++)
    pthread_join(spinners[i], NULL);
  if (chores)
    pthread_join(chorer, NULL);
  const char *busy_why = busy ? busy_gpu_stop() : NULL;
  if (busy_why)
    fprintf(stderr, "nvjpeg_start: %s\n", busy_why);
  printf("{\"delay_ms\":%d,\"chore\":%d,\"busy\":%d,\"spin\":%d,\"nvjpeg\":\"%s\",\"load_ms\":%.1f,\"cuda_"
         "ms\":%.1f,\"hw_handle_ms\":%.1f,\"hw_state_ms\":%.1f,"
         "\"hw_info_ms\":%.1f,\"engines\":%u,\"hw_ms\":%.1f,\"status\":%d",
         delay_ms, (int)chore, busy, spin, nv->version, load_ms, cuda_ms, a.handle_ms, a.state_ms, a.info_ms,
         a.engines, a_ms, a.status);
  if (two)
    printf(",\"beside\":\"%s\",\"beside_handle_ms\":%.1f,\"beside_state_ms\":%.1f,\"both_ms\":%.1f,"
           "\"beside_status\":%d",
           beside, b.handle_ms, b.state_ms, both_ms, b.status);
  printf(",\"dev_calls\":%d,\"dev_mb\":%.1f,\"dev_ms\":%.1f,\"pinned_calls\":%d,\"pinned_mb\":%.1f,\"pinned_"
         "ms\":%.1f",
         dev_calls, dev_bytes / 1e6, dev_ms, pinned_calls, pinned_bytes / 1e6, pinned_ms);
  if (twice) {
    stop(&a);
    start c = {.backend = NVJPEG_BACKEND_HARDWARE, .counted = counted, .info = info};
    t = dl__now();
    start_run(&c);
    printf(",\"again_handle_ms\":%.1f,\"again_state_ms\":%.1f", c.handle_ms, c.state_ms);
    stop(&c);
  }
  printf("}\n");
  stop(&a);
  stop(&b);
  return a.status ? 1 : 0;
}
