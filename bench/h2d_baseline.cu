// The card's own copy rate for one batch of B x 224 x 224 x 3 uint8: plain cudaMemcpyAsync from
// pinned and from pageable memory, timed with events over many copies. The yardstick for the
// loader's copy stage in the same run. Usage: h2d_baseline [BATCH] [DEVICE]; prints one JSON object.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                                     \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static double rate(void *src, void *dst, size_t bytes, cudaStream_t s, int reps) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; i++)
    CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < reps; i++)
    CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  CHECK(cudaEventRecord(b, s));
  CHECK(cudaEventSynchronize(b));
  float ms;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  return (double)bytes * reps / (ms * 1e6);
}

int main(int argc, char **argv) {
  int batch = argc > 1 ? atoi(argv[1]) : 256;
  int dev = argc > 2 ? atoi(argv[2]) : 0;
  size_t bytes = (size_t)batch * 224 * 224 * 3;
  CHECK(cudaSetDevice(dev));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *pinned, *pageable = malloc(bytes), *d;
  CHECK(cudaHostAlloc(&pinned, bytes, cudaHostAllocPortable));
  CHECK(cudaMalloc(&d, bytes));
  memset(pinned, 7, bytes);
  memset(pageable, 7, bytes);
  double p = rate(pinned, d, bytes, s, 50);
  double q = rate(pageable, d, bytes, s, 10);
  printf("{\"batch_bytes\":%zu,\"pinned_gb_s\":%.3f,\"pageable_gb_s\":%.3f}\n", bytes, p, q);
  return 0;
}
