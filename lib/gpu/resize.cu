// Decoded JPEG regions to the device batch in one pass: each thread computes one output pixel of
// one sample, all channels: the crop's antialiased resize (a triangle filter widened by the
// downscale factor, taps outside the decoded region dropped and the rest renormalised, exactly
// the CPU resampler's rule), rounding to uint8 as the CPU does, the flip, the layout, and the
// dtype with mean/std. Reads of neighbouring threads overlap and stay in L1.
#include "gpu/kernels.h"
#include "gpu/pixel.cuh"

#include <cuda_runtime.h>

namespace {

// The taps of one output coordinate along one axis: [lo, hi) with the triangle centred at c.
struct taps {
  int lo, hi;
  float c, support, norm; // norm: 1 / (sum of the weights); nearest: a single tap of weight 1
  bool nearest;
};

__device__ inline taps axis(float start, float len, int limit, int out_len, int o) {
  taps t;
  float scale = len / out_len;
  t.support = fmaxf(scale, 1.f);
  t.c = start + (o + 0.5f) * scale;
  t.lo = max((int)floorf(t.c - t.support), 0);
  t.hi = min((int)ceilf(t.c + t.support), limit);
  float sum = 0;
  for (int i = t.lo; i < t.hi; i++)
    sum += fmaxf(0.f, 1.f - fabsf((i + 0.5f - t.c) / t.support));
  t.nearest = !(sum > 0);
  if (t.nearest) { // the crop lies outside the data: the nearest pixel, as on the CPU
    int n = (int)t.c;
    t.lo = n < 0 ? 0 : n >= limit ? limit - 1 : n;
    t.hi = t.lo + 1;
    t.norm = 1;
  } else {
    t.norm = 1.f / sum;
  }
  return t;
}

__device__ inline float weight(const taps &t, int i) {
  return t.nearest ? 1.f : fmaxf(0.f, 1.f - fabsf((i + 0.5f - t.c) / t.support)) * t.norm;
}

template <typename T, int C>
__global__ void crop_resize(const dl__resize_job *__restrict__ jobs, T *__restrict__ out, int oh, int ow,
                            int nchw, dl::affine n) {
  const dl__resize_job j = jobs[blockIdx.z];
  int ox = blockIdx.x * blockDim.x + threadIdx.x, oy = blockIdx.y * blockDim.y + threadIdx.y;
  if (ox >= ow || oy >= oh)
    return;
  taps ty = axis(j.y, j.ch, j.h, oh, oy), tx = axis(j.x, j.cw, j.w, ow, ox);
  float acc[C];
  for (int c = 0; c < C; c++)
    acc[c] = 0;
  for (int y = ty.lo; y < ty.hi; y++) {
    float wy = weight(ty, y);
    if (wy == 0)
      continue;
    const uint8_t *row = j.src + (size_t)y * j.pitch;
    float r[C];
    for (int c = 0; c < C; c++)
      r[c] = 0;
    for (int x = tx.lo; x < tx.hi; x++) {
      float wx = weight(tx, x);
      for (int c = 0; c < C; c++)
        r[c] += wx * row[x * C + c];
    }
    for (int c = 0; c < C; c++)
      acc[c] += wy * r[c];
  }
  int dx = j.flip ? ow - 1 - ox : ox;
  size_t plane = (size_t)oh * ow;
  for (int c = 0; c < C; c++) {
    float v = acc[c] + 0.5f;
    uint8_t u = v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)v;
    size_t at = nchw ? ((size_t)j.out * C + c) * plane + (size_t)oy * ow + dx
                     : (((size_t)j.out * oh + oy) * ow + dx) * C + c;
    out[at] = dl::pixel<T>(u, c, n);
  }
}

template <int C> __global__ void box(const dl__resize_job *__restrict__ jobs) {
  const dl__resize_job j = jobs[blockIdx.z];
  if (j.scale <= 1)
    return;
  for (int y = blockIdx.y * blockDim.y + threadIdx.y; y < j.h; y += gridDim.y * blockDim.y)
    for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < j.w; x += gridDim.x * blockDim.x) {
      int sum[C] = {0}, count = 0;
      for (int yy = y * j.scale; yy < (y + 1) * j.scale && yy < j.full_h; yy++)
        for (int xx = x * j.scale; xx < (x + 1) * j.scale && xx < j.full_w; xx++, count++)
          for (int c = 0; c < C; c++)
            sum[c] += j.full[(size_t)yy * j.full_pitch + xx * C + c];
      for (int c = 0; c < C; c++)
        j.src[(size_t)y * j.pitch + x * C + c] = (uint8_t)((sum[c] + count / 2) / count);
    }
}

template <typename T>
cudaError_t launch(const dl__resize_job *jobs, int count, void *out, int oh, int ow, int c, int nchw,
                   const dl::affine &nm, cudaStream_t s) {
  dim3 block(32, 8);
  for (int first = 0; first < count; first += 65535) { // gridDim.z's limit
    int n = count - first < 65535 ? count - first : 65535;
    dim3 grid((ow + 31) / 32, (oh + 7) / 8, n);
    if (c == 3)
      crop_resize<T, 3><<<grid, block, 0, s>>>(jobs + first, (T *)out, oh, ow, nchw, nm);
    else
      crop_resize<T, 1><<<grid, block, 0, s>>>(jobs + first, (T *)out, oh, ow, nchw, nm);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
      return e;
  }
  return cudaSuccess;
}

} // namespace

extern "C" int dl__box_launch(const dl__resize_job *jobs, int n, int c, cudaStream_t s) {
  for (int first = 0; first < n; first += 65535) {
    int count = n - first < 65535 ? n - first : 65535;
    dim3 grid(8, 16, count), block(32, 8);
    if (c == 3)
      box<3><<<grid, block, 0, s>>>(jobs + first);
    else
      box<1><<<grid, block, 0, s>>>(jobs + first);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
      return (int)e;
  }
  return 0;
}

// dtype: 0 uint8, 1 float32, 2 float16, 3 bfloat16 (the library's enum). Returns a cudaError_t.
extern "C" int dl__resize_launch(const dl__resize_job *jobs, int n, void *out, int oh, int ow, int c, int nchw,
                                 int dtype, const float *mean, const float *std, cudaStream_t s) {
  if (n < 1)
    return 0;
  dl::affine nm = dl::make_affine(mean, std);
  switch (dtype) {
  case 0:
    return (int)launch<uint8_t>(jobs, n, out, oh, ow, c, nchw, nm, s);
  case 1:
    return (int)launch<float>(jobs, n, out, oh, ow, c, nchw, nm, s);
  case 2:
    return (int)launch<__half>(jobs, n, out, oh, ow, c, nchw, nm, s);
  default:
    return (int)launch<__nv_bfloat16>(jobs, n, out, oh, ow, c, nchw, nm, s);
  }
}
