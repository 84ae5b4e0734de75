/*
 * Separable resampling with a triangle (bilinear) filter widened by the downscale factor, so a
 * reduction averages every source pixel under it (antialiasing, as PIL and torchvision's
 * antialias=True do). Taps outside the decoded area are dropped and the rest renormalised.
 *
 * Fixed point, so that every path gives the same bytes: weights are integers summing to
 * 1 << PREC. The vertical pass rounds each tap's product to MID fraction bits and sums them in
 * 16 bits (each rounding is at most 1/128 of a level); the horizontal pass sums exactly in 32 bits
 * and rounds once to bytes. With AVX2 (chosen at run time) a tap costs one rounding multiply per
 * sixteen bytes, and two taps of one RGB pixel one multiply-add; the portable loops do the same
 * integer arithmetic, which no order of addition can change.
 */
#include "decode/decode.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DL_RESIZE_AVX2 1
#endif

enum {
  PREC = 14,                 /* weights: 1.0 is 1 << PREC, which fits int16 */
  MID = 6,                   /* fraction bits between the passes */
  SHIFT = 7,                 /* source bytes enter the vertical pass as v << SHIFT (fits int16) */
  ROUNDED_TAPS = 256,        /* beyond, the vertical pass sums exactly in 32 bits (16 could overflow) */
  WIDE_GROUPS = 16,          /* beyond, the horizontal pass runs portable: its widened weights would
                              * take 32 bytes per tap and output pixel (a 1 GB table for one hostile
                              * image of 64 megapixels in a row) */
  GROUP = 4,                 /* horizontal taps per AVX2 multiply-add round (two per lane) */
  PAD = 16,                  /* zeroed int16 after the middle row, for whole-group loads */
};

/* -1: not chosen yet; 0: portable; 1: AVX2. Atomic: every worker may be the first to ask. */
static int simd = -1;

void dl__resize_force_portable(bool portable) { __atomic_store_n(&simd, portable ? 0 : -1, __ATOMIC_RELAXED); }

#ifdef DL_RESIZE_AVX2
static bool use_avx2(void) {
  int v = __atomic_load_n(&simd, __ATOMIC_RELAXED);
  if (v < 0) {
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx2") ? 1 : 0;
    __atomic_store_n(&simd, v, __ATOMIC_RELAXED);
  }
  return v == 1;
}
#endif

typedef struct axis {
  int *first;  /* first source index per output index */
  int *count;  /* taps per output index */
  int16_t *w;  /* weights, TAPS per output index, zero past COUNT */
  int taps;
  int most;    /* the largest COUNT */
} axis;

static int taps_for(double in_len, int out_len) {
  double scale = in_len / out_len;
  double support = scale > 1 ? scale : 1;
  return (int)ceil(support) * 2 + 2;
}

/* ROW: room for TAPS doubles. */
static void coefficients(double start, double len, int limit, int out_len, axis *a, double *row) {
  double scale = len / out_len;
  double support = scale > 1 ? scale : 1, inv = 1 / support;
  a->most = 1;
  for (int o = 0; o < out_len; o++) {
    double center = start + (o + 0.5) * scale;
    int lo = (int)floor(center - support), hi = (int)ceil(center + support);
    if (lo < 0)
      lo = 0;
    if (hi > limit)
      hi = limit;
    if (hi - lo > a->taps)
      hi = lo + a->taps;
    double sum = 0;
    for (int i = lo; i < hi; i++) {
      double d = fabs((i + 0.5 - center) * inv);
      row[i - lo] = d < 1 ? 1 - d : 0;
      sum += row[i - lo];
    }
    /* Taps of zero weight at either end are dropped: they would only cost time. */
    int b = 0, e = hi - lo;
    while (b < e && row[b] == 0)
      b++;
    while (e > b && row[e - 1] == 0)
      e--;
    int16_t *w = a->w + (size_t)o * a->taps;
    memset(w, 0, (size_t)a->taps * sizeof *w);
    if (sum <= 0) { /* the rectangle lies outside the data: take the nearest pixel */
      int nearest = (int)center;
      lo = nearest < 0 ? 0 : nearest >= limit ? limit - 1 : nearest;
      hi = lo + 1;
      w[0] = 1 << PREC;
    } else {
      /* Rounded on the running total, so the weights sum to exactly 1 << PREC (flat areas keep
       * their value) and none is negative. */
      double run = 0, to_fixed = (1 << PREC) / sum;
      int before = 0;
      for (int i = b; i < e; i++) {
        run += row[i];
        int upto = i == e - 1 ? 1 << PREC : (int)(run * to_fixed + 0.5);
        w[i - b] = (int16_t)(upto - before);
        before = upto;
      }
      hi = lo + e;
      lo += b;
    }
    a->first[o] = lo;
    a->count[o] = hi - lo;
    if (hi - lo > a->most)
      a->most = hi - lo;
  }
}

/* ---- the vertical pass: N source rows from BASE into the int16 row MID, over SPAN bytes ---- */

/* One tap: (v << SHIFT) * w, rounded to MID fraction bits: what _mm256_mulhrs_epi16 computes. */
static inline int16_t tap(uint8_t v, int16_t w) {
  return (int16_t)(((int32_t)(v << SHIFT) * w + (1 << (PREC + SHIFT - MID - 1))) >> (PREC + SHIFT - MID));
}

static void vertical_from(const uint8_t *base, size_t stride, const int16_t *w, int n, size_t from, size_t span,
                          int16_t *mid) {
  if (n > ROUNDED_TAPS) { /* a reduction by over a hundred: rare, and not worth a vector loop */
    for (size_t j = from; j < span; j++) {
      int32_t s = 1 << (PREC - MID - 1);
      for (int i = 0; i < n; i++)
        s += w[i] * base[(size_t)i * stride + j];
      mid[j] = (int16_t)(s >> (PREC - MID));
    }
    return;
  }
  for (size_t j = from; j < span; j++) {
    int16_t s = 0;
    for (int i = 0; i < n; i++)
      s = (int16_t)(s + tap(base[(size_t)i * stride + j], w[i]));
    mid[j] = s;
  }
}

#ifdef DL_RESIZE_AVX2
__attribute__((target("avx2"))) static size_t vertical_avx2(const uint8_t *base, size_t stride, const int16_t *w,
                                                             int n, size_t span, int16_t *mid) {
  _Static_assert(PREC + SHIFT - MID == 15, "mulhrs rounds and shifts by 15");
  size_t j = 0;
  if (n > ROUNDED_TAPS)
    return 0;
  for (; j + 32 <= span; j += 32) {
    __m256i lo = _mm256_setzero_si256(), hi = lo;
    const uint8_t *p = base + j;
    for (int i = 0; i < n; i++, p += stride) {
      __m256i c = _mm256_set1_epi16(w[i]);
      __m256i a = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), SHIFT);
      __m256i b = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + 16))), SHIFT);
      lo = _mm256_add_epi16(lo, _mm256_mulhrs_epi16(a, c));
      hi = _mm256_add_epi16(hi, _mm256_mulhrs_epi16(b, c));
    }
    _mm256_storeu_si256((__m256i *)(mid + j), lo);
    _mm256_storeu_si256((__m256i *)(mid + j + 16), hi);
  }
  return j;
}
#endif

/* ---- the horizontal pass: the int16 row MID (starting at source column x_lo) to bytes ---- */

typedef struct row_out {
  uint8_t *out;   /* interleaved: the row; planar: the first plane's row */
  size_t plane;   /* planar: bytes between planes, else 0 */
  int ow, ch, flip;
} row_out;

static inline uint8_t to_u8(int32_t s) {
  s >>= PREC + MID;
  return s < 0 ? 0 : s > 255 ? 255 : (uint8_t)s;
}

static void horizontal_from(const int16_t *mid, const axis *ax, int x_lo, int from, const row_out *r) {
  for (int dx = from; dx < r->ow; dx++) {
    int x = r->flip ? r->ow - 1 - dx : dx;
    const int16_t *w = ax->w + (size_t)x * ax->taps;
    const int16_t *px = mid + (size_t)(ax->first[x] - x_lo) * r->ch;
    for (int c = 0; c < r->ch; c++) {
      int32_t s = 1 << (PREC + MID - 1);
      for (int i = 0; i < ax->count[x]; i++)
        s += w[i] * px[r->ch * i + c];
      if (r->plane)
        r->out[c * r->plane + (size_t)dx] = to_u8(s);
      else
        r->out[(size_t)dx * r->ch + c] = to_u8(s);
    }
  }
}

#ifdef DL_RESIZE_AVX2
/* Weights of the 3-channel output pixels laid out for horizontal3_avx2: per group of four taps,
 * lane 0 holds taps 0 and 1 as (w0 w1) once per channel, lane 1 taps 2 and 3, each lane ending in
 * two zeros where a fourth channel would be. AT: where each output pixel's first tap is in the
 * middle row. */
static void widen_weights(const axis *ax, int ow, int groups, int x_lo, int16_t *wide, int *at) {
  for (int x = 0; x < ow; x++) {
    at[x] = (ax->first[x] - x_lo) * 3;
    const int16_t *w = ax->w + (size_t)x * ax->taps;
    int16_t *d = wide + (size_t)x * groups * 16;
    for (int g = 0; g < groups; g++, d += 16)
      for (int lane = 0; lane < 2; lane++) {
        int t = g * GROUP + 2 * lane;
        int16_t a = t < ax->count[x] ? w[t] : 0, b = t + 1 < ax->count[x] ? w[t + 1] : 0;
        for (int c = 0; c < 3; c++) {
          d[lane * 8 + 2 * c] = a;
          d[lane * 8 + 2 * c + 1] = b;
        }
        d[lane * 8 + 6] = d[lane * 8 + 7] = 0;
      }
  }
}

/* Output pixels A and B at once, A in lane 0 and B in lane 1: per group of four taps, one load of
 * taps 0-1 and one of taps 2-3 for each, one shuffle into (R R' G G' B B' 0 0) per pair, one
 * multiply-add per pair; the result (R G B 0) per lane as int32, rounded and shifted. Keeping the
 * pixels apart in the lanes spares a lane-crossing sum per pixel (the shuffle port is the limit).
 * GROUPS is a constant where this is inlined, so the loop unrolls. */
__attribute__((target("avx2"), always_inline)) static inline __m256i pixel_pair(const int16_t *a, const int16_t *b,
                                                                                 const int16_t *wa, const int16_t *wb,
                                                                                 int groups, __m256i pick) {
  __m256i acc = _mm256_set1_epi32(1 << (PREC + MID - 1));
  for (int g = 0; g < groups; g++, a += 3 * GROUP, b += 3 * GROUP, wa += 16, wb += 16) {
    __m256i t01 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                          _mm_loadu_si128((const __m128i *)b), 1);
    __m256i t23 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a + 6))),
                                          _mm_loadu_si128((const __m128i *)(b + 6)), 1);
    __m256i w01 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_load_si128((const __m128i *)wa)),
                                          _mm_load_si128((const __m128i *)wb), 1);
    __m256i w23 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_load_si128((const __m128i *)(wa + 8))),
                                          _mm_load_si128((const __m128i *)(wb + 8)), 1);
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_shuffle_epi8(t01, pick), w01));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_shuffle_epi8(t23, pick), w23));
  }
  return _mm256_srai_epi32(acc, PREC + MID);
}

/* Eight output pixels a round, paired k with k + 4 so that the packs leave pixels 0-3 in lane 0
 * and 4-7 in lane 1; then stored as one interleaved run or as eight bytes in each plane. Returns
 * the output pixels done. */
__attribute__((target("avx2"), always_inline)) static inline int horizontal3_groups(const int16_t *mid, const int *at,
                                                                                     const int16_t *wide, int groups,
                                                                                     const row_out *r) {
  const __m256i pick = _mm256_setr_epi8(0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -1, -1, -1, -1, 0, 1, 6, 7, 2, 3, 8,
                                        9, 4, 5, 10, 11, -1, -1, -1, -1);
  /* Within each lane, (R G B 0) x 4 to RGB x 4 or to R x 4, G x 4, B x 4; then the lanes' dwords
   * brought together. */
  const __m256i order = r->plane ? _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, -1, -1, -1, -1, 0, 4, 8,
                                                    12, 1, 5, 9, 13, 2, 6, 10, 14, -1, -1, -1, -1)
                                 : _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, 0, 1, 2,
                                                    4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const __m256i join = r->plane ? _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7) : _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
  const size_t wstep = (size_t)groups * 16;
  int dx = 0;
  for (; dx + 8 <= r->ow; dx += 8) {
    __m256i p[4];
    for (int k = 0; k < 4; k++) {
      int xa = r->flip ? r->ow - 1 - (dx + k) : dx + k, xb = r->flip ? xa - 4 : xa + 4;
      p[k] = pixel_pair(mid + at[xa], mid + at[xb], wide + xa * wstep, wide + xb * wstep, groups, pick);
    }
    __m256i q = _mm256_packus_epi16(_mm256_packs_epi32(p[0], p[1]), _mm256_packs_epi32(p[2], p[3]));
    q = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(q, order), join);
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    if (r->plane) {
      _mm_storel_epi64((__m128i *)(r->out + dx), lo);
      _mm_storeh_pi((__m64 *)(r->out + r->plane + dx), _mm_castsi128_ps(lo));
      _mm_storel_epi64((__m128i *)(r->out + 2 * r->plane + dx), hi);
    } else {
      uint8_t *o = r->out + (size_t)dx * 3;
      _mm_storeu_si128((__m128i *)o, lo);
      _mm_storel_epi64((__m128i *)(o + 16), hi);
    }
  }
  return dx;
}

__attribute__((target("avx2"))) static int horizontal3_avx2(const int16_t *mid, const int *at, const int16_t *wide,
                                                            int groups, const row_out *r) {
  switch (groups) { /* one or two groups of four taps cover reductions up to 2x (see dl__jpeg_scale) */
  case 1:
    return horizontal3_groups(mid, at, wide, 1, r);
  case 2:
    return horizontal3_groups(mid, at, wide, 2, r);
  default:
    return horizontal3_groups(mid, at, wide, groups, r);
  }
}
#endif

void dl__resize_scratch_free(dl__resize_scratch *s) {
  dl__buf_free(&s->tmp);
  dl__buf_free(&s->coef);
  dl__buf_free(&s->wide);
}

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
  int most_taps = ax.taps > ay.taps ? ax.taps : ay.taps;
  size_t coef_bytes = (size_t)most_taps * sizeof(double) + ((size_t)ow + oh) * 2 * sizeof(int) +
                      ((size_t)ow * ax.taps + (size_t)oh * ay.taps) * sizeof(int16_t);
  if (dl__buf_reserve(&s->coef, coef_bytes))
    return -ENOMEM;
  double *row = (double *)s->coef.p;
  ax.first = (int *)(row + most_taps);
  ax.count = ax.first + ow;
  ay.first = ax.count + ow;
  ay.count = ay.first + oh;
  ax.w = (int16_t *)(ay.count + oh);
  ay.w = ax.w + (size_t)ow * ax.taps;
  coefficients(rect.x, rect.w, w, ow, &ax, row);
  coefficients(rect.y, rect.h, h, oh, &ay, row);
  /* Only the source columns some output pixel reads. */
  int x_lo = ax.first[0], x_hi = 0;
  for (int o = 0; o < ow; o++) {
    if (ax.first[o] < x_lo)
      x_lo = ax.first[o];
    if (ax.first[o] + ax.count[o] > x_hi)
      x_hi = ax.first[o] + ax.count[o];
  }
  size_t span = (size_t)(x_hi - x_lo) * ch;
  int groups = (ax.most + GROUP - 1) / GROUP;
  /* The middle row, then zeros for the horizontal pass's whole-group loads past its last pixel. */
  size_t pad = (size_t)3 * GROUP * groups + PAD;
  if (dl__buf_reserve(&s->tmp, (span + pad) * sizeof(int16_t)))
    return -ENOMEM;
  int16_t *mid = (int16_t *)s->tmp.p;
  memset(mid + span, 0, pad * sizeof(int16_t));
#ifdef DL_RESIZE_AVX2
  bool avx2 = use_avx2();
  const int16_t *wide = NULL;
  int *at = NULL;
  if (avx2 && ch == 3 && groups <= WIDE_GROUPS) {
    size_t weights = (size_t)ow * groups * 16 * sizeof(int16_t);
    if (dl__buf_reserve_aligned(&s->wide, weights + (size_t)ow * sizeof(int), 32))
      return -ENOMEM;
    at = (int *)((char *)s->wide.p + weights);
    widen_weights(&ax, ow, groups, x_lo, (int16_t *)s->wide.p, at);
    wide = (const int16_t *)s->wide.p;
  }
#endif
  for (int y = 0; y < oh; y++) {
    /* Vertical first, over contiguous bytes. */
    const uint8_t *base = src + (size_t)ay.first[y] * stride + (size_t)x_lo * ch;
    const int16_t *wy = ay.w + (size_t)y * ay.taps;
    size_t j = 0;
#ifdef DL_RESIZE_AVX2
    if (avx2)
      j = vertical_avx2(base, stride, wy, ay.count[y], span, mid);
#endif
    vertical_from(base, stride, wy, ay.count[y], j, span, mid);
    row_out r = {.out = planar ? out + (size_t)y * ow : out + (size_t)y * ow * ch,
                 .plane = planar ? plane : 0,
                 .ow = ow,
                 .ch = ch,
                 .flip = flip};
    int dx = 0;
#ifdef DL_RESIZE_AVX2
    if (wide)
      dx = horizontal3_avx2(mid, at, wide, groups, &r);
#endif
    horizontal_from(mid, &ax, x_lo, dx, &r);
  }
  return 0;
}
