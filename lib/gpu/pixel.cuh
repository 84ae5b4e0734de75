// What the kernels share: a pixel's uint8 value into the batch's dtype, normalised as
// (x / 255 - mean) / std, folded into a multiply and an add per channel. Each is rounded on its
// own (no fused multiply-add), as the CPU workers compute it: device=cpu and device=cuda batches
// hold the same floats.
#ifndef RINGFEED_GPU_PIXEL_CUH
#define RINGFEED_GPU_PIXEL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace dl {

struct affine {
  float scale[3], shift[3];
};

inline affine make_affine(const float *mean, const float *std) {
  affine a;
  for (int i = 0; i < 3; i++) {
    a.scale[i] = 1.0f / (255.0f * std[i]);
    a.shift[i] = -mean[i] / std[i];
  }
  return a;
}

template <typename T> __device__ inline T cast(float v);
template <> __device__ inline float cast<float>(float v) { return v; }
template <> __device__ inline __half cast<__half>(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 cast<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T> __device__ inline T pixel(uint8_t v, int ch, const affine &n) {
  return cast<T>(__fadd_rn(__fmul_rn((float)v, n.scale[ch]), n.shift[ch]));
}
template <> __device__ inline uint8_t pixel<uint8_t>(uint8_t v, int, const affine &) { return v; }

} // namespace dl

#endif
