/*
 * Pixels as the model takes them, on the CPU: an image's uint8 values (channels interleaved, as
 * the resampler leaves them) to float32, float16 or bfloat16 normalised as (x / 255 - mean) / std,
 * in the batch's layout. The GPU's conversion (gpu/pixel.cuh) folds the same into one multiply-add
 * per value with the same constants, so both give the same float32 values to within float32
 * rounding, and the same float16 and bfloat16 ones (rounded to nearest, ties to even).
 *
 * Built with -O3: the loops are written so that the compiler vectorises them (24 values at a
 * time, three whole pixels of each channel pattern, in NHWC; a plane at a time in NCHW).
 */
#include "decode/decode.h"

#include <stdlib.h>
#include <string.h>

dl__affine dl__affine_of(const float mean[3], const float std[3]) {
  dl__affine a;
  for (int i = 0; i < 3; i++) {
    a.scale[i] = 1.0f / (255.0f * std[i]);
    a.shift[i] = -mean[i] / std[i];
  }
  return a;
}

/* IEEE binary16 of F, rounded to nearest, ties to even (F is finite: a normalised pixel). */
static inline uint16_t half_of(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, abs = x & 0x7FFFFFFFu;
  if (abs >= 0x477FF000u) /* rounds to 65520 or more: infinity */
    return (uint16_t)(sign | 0x7C00u);
  if (abs < 0x38800000u) { /* below 2^-14: a subnormal half, or zero */
    if (abs < 0x33000000u)
      return (uint16_t)sign;
    uint32_t m = (abs & 0x7FFFFFu) | 0x800000u;
    int shift = 126 - (int)(abs >> 23) + 13; /* to the subnormal's 2^-24 units */
    uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    q += rest > half || (rest == half && (q & 1u));
    return (uint16_t)(sign | q);
  }
  uint32_t r = abs - 0x38000000u; /* the exponent rebiased from 127 to 15 */
  r += 0xFFFu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

/* bfloat16 of F: its upper half, rounded to nearest, ties to even. */
static inline uint16_t bf16_of(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

#define PATTERN 24 /* values: 8 pixels of 3 channels, or 24 of 1 */

/* One layout and dtype's loop, so that each is a loop the compiler vectorises (no branch inside):
 * NHWC in whole patterns of 24 values, NCHW a plane at a time (every C-th value read). */
#define NORMALIZE(T, CAST)                                                                                 \
  static void normalize_##T(const uint8_t *in, size_t plane, int c, bool planar, const float *scale,      \
                            const float *shift, T *out) {                                                  \
    size_t n = plane * (size_t)c;                                                                          \
    if (planar) {                                                                                          \
      for (int ch = 0; ch < c; ch++) {                                                                     \
        T *o = out + (size_t)ch * plane;                                                                   \
        const uint8_t *p = in + ch;                                                                        \
        for (size_t i = 0; i < plane; i++)                                                                 \
          o[i] = CAST((float)p[i * (size_t)c] * scale[ch] + shift[ch]);                                    \
      }                                                                                                    \
      return;                                                                                              \
    }                                                                                                      \
    size_t at = 0;                                                                                         \
    for (; at + PATTERN <= n; at += PATTERN)                                                               \
      for (int k = 0; k < PATTERN; k++)                                                                    \
        out[at + (size_t)k] = CAST((float)in[at + (size_t)k] * scale[k] + shift[k]);                       \
    for (int k = 0; at + (size_t)k < n; k++)                                                               \
      out[at + (size_t)k] = CAST((float)in[at + (size_t)k] * scale[k] + shift[k]);                         \
  }

#define AS_FLOAT(v) (v)
typedef float f32;
typedef uint16_t u16h;
typedef uint16_t u16b;
NORMALIZE(f32, AS_FLOAT)
NORMALIZE(u16h, half_of)
NORMALIZE(u16b, bf16_of)

static void patterns(const dl__affine *a, int c, float *scale, float *shift) {
  for (int k = 0; k < PATTERN; k++)
    scale[k] = a->scale[k % c], shift[k] = a->shift[k % c];
}

void dl__normalize(const uint8_t *in, int h, int w, int c, bool planar, int dtype, const dl__affine *a, void *out) {
  float scale[PATTERN], shift[PATTERN];
  patterns(a, c, scale, shift);
  size_t plane = (size_t)h * (size_t)w;
  if (dtype == DL__DTYPE_FLOAT32)
    normalize_f32(in, plane, c, planar, scale, shift, out);
  else if (dtype == DL__DTYPE_FLOAT16)
    normalize_u16h(in, plane, c, planar, scale, shift, out);
  else
    normalize_u16b(in, plane, c, planar, scale, shift, out);
}

void dl__normalize_zeros(int h, int w, int c, bool planar, int dtype, const dl__affine *a, void *out) {
  size_t n = (size_t)h * (size_t)w * (size_t)c;
  uint8_t zeros[4096] = {0};
  /* A row of zeros at a time would need a stride; an image's worth of them is a few pages. */
  uint8_t *z = n <= sizeof zeros ? zeros : calloc(n, 1);
  if (!z) { /* no memory for zeros: the slot's bytes are zeros instead */
    memset(out, 0, n * (size_t)dl__dtype_bytes(dtype));
    return;
  }
  dl__normalize(z, h, w, c, planar, dtype, a, out);
  if (z != zeros)
    free(z);
}
