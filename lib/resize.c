/*
 * Separable resampling with a triangle (bilinear) filter widened by the downscale factor, so a
 * reduction averages every source pixel under it (antialiasing, as PIL and torchvision's
 * antialias=True do). Taps outside the decoded area are dropped and the rest renormalised.
 */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

int dl__buf_reserve(dl__buf *b, size_t n) {
  if (n <= b->cap)
    return 0;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < n)
    cap *= 2;
  void *p = realloc(b->p, cap);
  if (!p)
    return -ENOMEM;
  b->p = p;
  b->cap = cap;
  return 0;
}

int dl__buf_reserve_aligned(dl__buf *b, size_t n, size_t align) {
  if (n <= b->cap && ((uintptr_t)b->p % align) == 0)
    return 0;
  size_t cap = (n + align - 1) / align * align;
  void *p = aligned_alloc(align, cap);
  if (!p)
    return -ENOMEM;
  free(b->p);
  b->p = p;
  b->cap = cap;
  return 0;
}

void dl__buf_free(dl__buf *b) {
  free(b->p);
  b->p = NULL;
  b->cap = 0;
}

typedef struct axis {
  int *first;   /* first source index per output index */
  int *count;   /* taps per output index */
  float *w;     /* taps weights, TAPS per output index */
  int taps;
} axis;

static int taps_for(double in_len, int out_len) {
  double scale = in_len / out_len;
  double support = scale > 1 ? scale : 1;
  return (int)ceil(support) * 2 + 2;
}

static void coefficients(double start, double len, int limit, int out_len, axis *a) {
  double scale = len / out_len;
  double support = scale > 1 ? scale : 1;
  for (int o = 0; o < out_len; o++) {
    double center = start + (o + 0.5) * scale;
    int lo = (int)floor(center - support), hi = (int)ceil(center + support);
    if (lo < 0)
      lo = 0;
    if (hi > limit)
      hi = limit;
    if (hi - lo > a->taps)
      hi = lo + a->taps;
    float *w = a->w + (size_t)o * a->taps;
    double sum = 0;
    int n = 0;
    for (int i = lo; i < hi; i++, n++) {
      double d = fabs((i + 0.5 - center) / support);
      w[n] = d < 1 ? (float)(1 - d) : 0.f;
      sum += w[n];
    }
    if (sum <= 0) { /* the rectangle lies outside the data: take the nearest pixel */
      int nearest = (int)center;
      lo = nearest < 0 ? 0 : nearest >= limit ? limit - 1 : nearest;
      n = 1;
      w[0] = 1;
      sum = 1;
    }
    for (int i = 0; i < n; i++)
      w[i] = (float)(w[i] / sum);
    /* Zero weights up to the table's width: every output pixel then runs the same number of taps,
     * which lets the compiler unroll the loop. Reads past the last real tap stay inside the
     * padded rows (first + taps <= limit is kept by moving first back when needed). */
    for (int i = n; i < a->taps; i++)
      w[i] = 0;
    a->first[o] = lo;
    a->count[o] = n;
  }
}

static uint8_t clamp_u8(float v) {
  v += 0.5f;
  return v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)v;
}

typedef float v4f __attribute__((vector_size(16)));
typedef int v4i __attribute__((vector_size(16)));
/* Rounds and clamps N floats to bytes, sixteen at a time: a row at once costs far less than a
 * pixel's three bytes one by one (a third of the resampler's time). The saturating packs clamp
 * exactly as clamp_u8 does. */
static inline void row_to_u8(const float *f, uint8_t *out, size_t n) {
  size_t j = 0;
#ifdef __SSE2__
  const __m128 half = _mm_set1_ps(0.5f);
  for (; j + 16 <= n; j += 16) {
    __m128i a = _mm_cvttps_epi32(_mm_add_ps(_mm_loadu_ps(f + j), half));
    __m128i b = _mm_cvttps_epi32(_mm_add_ps(_mm_loadu_ps(f + j + 4), half));
    __m128i c = _mm_cvttps_epi32(_mm_add_ps(_mm_loadu_ps(f + j + 8), half));
    __m128i d = _mm_cvttps_epi32(_mm_add_ps(_mm_loadu_ps(f + j + 12), half));
    _mm_storeu_si128((__m128i *)(out + j), _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d)));
  }
#endif
  for (; j < n; j++)
    out[j] = clamp_u8(f[j]);
}

/* Built twice, for AVX2 and for any x86-64 (or plain on other machines); the loader picks one at
 * start-up, so one binary is fast everywhere. Not under sanitizers: their runtimes are not ready
 * when the dynamic loader runs the selection (an ifunc resolver), and it crashes. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx2", "default")))
#endif
int dl__resize(const uint8_t *src, int w, int h, size_t stride, int ch, dl__rect rect, uint8_t *out,
               int ow, int oh, int planar, int flip, dl__resize_scratch *s) {
  size_t plane = (size_t)ow * oh;
  bool identity = rect.x == 0 && rect.y == 0 && rect.w == ow && rect.h == oh && ow <= w && oh <= h;
  if (identity) {
    for (int y = 0; y < oh; y++) {
      const uint8_t *row = src + (size_t)y * stride;
      for (int x = 0; x < ow; x++) {
        int dx = flip ? ow - 1 - x : x;
        for (int c = 0; c < ch; c++) {
          uint8_t v = row[(size_t)x * ch + c];
          if (planar)
            out[c * plane + (size_t)y * ow + dx] = v;
          else
            out[((size_t)y * ow + dx) * ch + c] = v;
        }
      }
    }
    return 0;
  }
  axis ax = {.taps = taps_for(rect.w, ow)}, ay = {.taps = taps_for(rect.h, oh)};
  size_t coef_bytes = ((size_t)ow * ax.taps + (size_t)oh * ay.taps) * sizeof(float) +
                      ((size_t)ow + oh) * 2 * sizeof(int);
  if (dl__buf_reserve(&s->coef, coef_bytes))
    return -ENOMEM;
  ax.w = (float *)s->coef.p;
  ay.w = ax.w + (size_t)ow * ax.taps;
  ax.first = (int *)(ay.w + (size_t)oh * ay.taps);
  ax.count = ax.first + ow;
  ay.first = ax.count + ow;
  ay.count = ay.first + oh;
  coefficients(rect.x, rect.w, w, ow, &ax);
  coefficients(rect.y, rect.h, h, oh, &ay);
  /* Only the source columns some output pixel reads. */
  int x_lo = ax.first[0], x_hi = 0;
  for (int o = 0; o < ow; o++) {
    if (ax.first[o] < x_lo)
      x_lo = ax.first[o];
    if (ax.first[o] + ax.count[o] > x_hi)
      x_hi = ax.first[o] + ax.count[o];
  }
  size_t span = (size_t)(x_hi - x_lo) * ch;
  /* One float row of the source, padded so that 4-wide loads of the last pixel stay inside it;
   * then one of the output (with room for the last pixel's 4-wide store). */
  if (dl__buf_reserve(&s->tmp, (span + 4 + (size_t)ow * 3 + 4) * sizeof(float)))
    return -ENOMEM;
  float *acc = (float *)s->tmp.p, *line = acc + span + 4;
  memset(acc + span, 0, 4 * sizeof(float));
  for (int y = 0; y < oh; y++) {
    /* Vertical first, over contiguous bytes: the compiler vectorises this loop. */
    const float *wy = ay.w + (size_t)y * ay.taps;
    const uint8_t *base = src + (size_t)ay.first[y] * stride + (size_t)x_lo * ch;
    int n = ay.count[y];
    for (size_t j = 0; j < span; j++)
      acc[j] = wy[0] * base[j];
    for (int i = 1; i < n; i++) {
      const uint8_t *row = base + (size_t)i * stride;
      float wi = wy[i];
      for (size_t j = 0; j < span; j++)
        acc[j] += wi * row[j];
    }
    /* Then horizontal: a pixel's channels as one 4-wide vector per tap, into a float row (left
     * to right in the output, so each pixel's 4-wide store spills only onto the next one's place),
     * rounded to bytes a row at a time. */
    if (ch == 3) {
      for (int dx = 0; dx < ow; dx++) {
        int x = flip ? ow - 1 - dx : dx;
        const float *wx = ax.w + (size_t)x * ax.taps;
        const float *px = acc + (size_t)(ax.first[x] - x_lo) * ch;
        int taps = ax.count[x];
        v4f sum = {0, 0, 0, 0};
        int i = 0;
        for (; i + 2 <= taps; i += 2) {
          v4f p0, p1;
          memcpy(&p0, px + 3 * i, sizeof p0);
          memcpy(&p1, px + 3 * i + 3, sizeof p1);
          sum += wx[i] * p0 + wx[i + 1] * p1;
        }
        if (i < taps) {
          v4f p0;
          memcpy(&p0, px + 3 * i, sizeof p0);
          sum += wx[i] * p0;
        }
        if (planar) {
          line[dx] = sum[0];
          line[ow + dx] = sum[1];
          line[2 * ow + dx] = sum[2];
        } else {
          memcpy(line + 3 * dx, &sum, sizeof sum);
        }
      }
      if (planar)
        for (int c = 0; c < 3; c++)
          row_to_u8(line + (size_t)c * ow, out + c * plane + (size_t)y * ow, (size_t)ow);
      else
        row_to_u8(line, out + (size_t)y * ow * 3, (size_t)ow * 3);
      continue;
    }
    for (int x = 0; x < ow; x++) {
      const float *wx = ax.w + (size_t)x * ax.taps;
      const float *px = acc + (size_t)(ax.first[x] - x_lo) * ch;
      int taps = ax.count[x];
      int dx = flip ? ow - 1 - x : x;
      for (int c = 0; c < ch; c++) {
        float v = 0;
        for (int i = 0; i < taps; i++)
          v += wx[i] * px[ch * i + c];
        if (planar)
          out[c * plane + (size_t)y * ow + dx] = clamp_u8(v);
        else
          out[((size_t)y * ow + dx) * ch + c] = clamp_u8(v);
      }
    }
  }
  return 0;
}
