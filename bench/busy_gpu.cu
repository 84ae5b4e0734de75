// A GPU kept busy the way training keeps it: one thread launching back to back ~1 ms kernels that
// occupy every SM (two blocks of 256 threads each, spinning on the GPU's clock), on a stream of
// the lowest priority, until stopped. nvjpeg_ceiling --busy measures nvJPEG beside it.
#include "busy_gpu.h"

#include <cuda_runtime.h>
#include <pthread.h>

static pthread_t thread;
static int stop;
static int device_sms;
static cudaError_t failed; /* the launcher's first error: a GPU not kept busy spoils the figure */

__global__ void spin(unsigned long long ns, unsigned long long *sink) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  unsigned long long acc = 0;
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    acc++;
  } while (t - t0 < ns);
  if (acc == 42)
    *sink = acc;
}

static void *launcher(void *arg) {
  (void)arg;
  int least, greatest;
  cudaStream_t s;
  unsigned long long *sink;
  if ((failed = cudaDeviceGetStreamPriorityRange(&least, &greatest)) ||
      (failed = cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, least)))
    return NULL;
  if ((failed = cudaMalloc(&sink, sizeof *sink))) {
    cudaStreamDestroy(s);
    return NULL;
  }
  while (!failed && !__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
    for (int i = 0; i < 8; i++)
      spin<<<2 * device_sms, 256, 0, s>>>(1000000, sink);
    failed = cudaGetLastError();
    if (!failed)
      failed = cudaStreamSynchronize(s); /* at most 8 ms queued: stopping is prompt */
  }
  cudaFree(sink);
  cudaStreamDestroy(s);
  return NULL;
}

extern "C" int busy_gpu_start(void) {
  int dev = 0;
  if (cudaGetDevice(&dev) || cudaDeviceGetAttribute(&device_sms, cudaDevAttrMultiProcessorCount, dev))
    return -1;
  return pthread_create(&thread, NULL, launcher, NULL) ? -1 : 0;
}

extern "C" const char *busy_gpu_stop(void) {
  __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
  pthread_join(thread, NULL);
  return failed ? cudaGetErrorString(failed) : NULL;
}
