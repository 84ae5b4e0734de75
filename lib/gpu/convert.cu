// uint8 NHWC batches to normalized float32/float16/bfloat16 in NHWC or NCHW, on the copy stream,
// so that only uint8 crosses PCIe. One thread per output element: reads are 1 byte, writes are
// coalesced; the whole pass is memory-bound and tiny next to the copy.
#include "gpu/kernels.h"
#include "gpu/pixel.cuh"

#include <cuda_runtime.h>

namespace {

template <typename T>
__global__ void convert(const uint8_t *__restrict__ in, T *__restrict__ out, int64_t total, int h, int w,
                        int c, int nchw, dl::affine n) {
  int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t plane = (int64_t)h * w;
  for (; o < total; o += stride) {
    int ch;
    int64_t src;
    if (nchw) {
      int64_t b = o / (plane * c), rem = o - b * plane * c;
      ch = (int)(rem / plane);
      src = (b * plane + (rem - (int64_t)ch * plane)) * c + ch;
    } else {
      ch = (int)(o % c);
      src = o;
    }
    out[o] = dl::pixel<T>(in[src], ch, n);
  }
}

} // namespace

// dtype: 1 float32, 2 float16, 3 bfloat16 (the library's enum). Returns a cudaError_t.
extern "C" int dl__convert_launch(const uint8_t *in, void *out, int n, int h, int w, int c, int nchw,
                                  int dtype, const float *mean, const float *std, cudaStream_t s) {
  dl::affine nm = dl::make_affine(mean, std);
  int64_t total = (int64_t)n * h * w * c;
  int threads = 256;
  int64_t blocks64 = (total + threads - 1) / threads;
  int blocks = (int)(blocks64 < 65535 * 8 ? blocks64 : 65535 * 8);
  if (blocks < 1)
    return 0;
  if (dtype == 1)
    convert<float><<<blocks, threads, 0, s>>>(in, (float *)out, total, h, w, c, nchw, nm);
  else if (dtype == 2)
    convert<__half><<<blocks, threads, 0, s>>>(in, (__half *)out, total, h, w, c, nchw, nm);
  else
    convert<__nv_bfloat16><<<blocks, threads, 0, s>>>(in, (__nv_bfloat16 *)out, total, h, w, c, nchw, nm);
  return (int)cudaGetLastError();
}
