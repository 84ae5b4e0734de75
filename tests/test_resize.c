/*
 * The fixed-point resampler: its AVX2 and portable loops give the same bytes (so a run's pixels
 * do not depend on the processor), and both stay within one level of the same filter computed in
 * double precision, over random crops (fractional, reaching past the data, up- and downscales,
 * one huge reduction), both layouts, flips, one and three channels; flat images stay flat.
 */
#include "core.h"
#include "test.h"

#include <math.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33);
}
static double unit(void) { return next() / 2147483648.0; }

/* The filter as resize.c defines it, in doubles and over every source pixel (W: LIMIT weights per
 * output index): a tent widened by the reduction, renormalised over the pixels inside the data, the
 * nearest pixel where none is under it. */
static double *weights(double start, double len, int limit, int out_len) {
  double *all = calloc((size_t)out_len * limit, sizeof *all);
  double scale = len / out_len, support = scale > 1 ? scale : 1;
  for (int o = 0; o < out_len; o++) {
    double *w = all + (size_t)o * limit, center = start + (o + 0.5) * scale, sum = 0;
    for (int i = 0; i < limit; i++) {
      double d = fabs((i + 0.5 - center) / support);
      sum += w[i] = d < 1 ? 1 - d : 0;
    }
    if (sum > 0)
      for (int i = 0; i < limit; i++)
        w[i] /= sum;
    else
      w[center < 0 ? 0 : center >= limit ? limit - 1 : (int)center] = 1;
  }
  return all;
}

/* The nonzero weights of W (N of them) lie in [*LO, *HI). */
static void nonzero(const double *w, int n, int *lo, int *hi) {
  *lo = 0, *hi = n;
  while (*lo < n && w[*lo] == 0)
    ++*lo;
  while (*hi > *lo && w[*hi - 1] == 0)
    --*hi;
}

static void reference(const uint8_t *src, int w, int h, int ch, dl__rect r, int ow, int oh, int planar, int flip,
                      double *out) {
  double *wx = weights(r.x, r.w, w, ow), *wy = weights(r.y, r.h, h, oh);
  double *rows = malloc(sizeof(double) * (size_t)w * ch);
  for (int y = 0; y < oh; y++) {
    const double *ry = wy + (size_t)y * h;
    int j0, j1;
    nonzero(ry, h, &j0, &j1);
    for (int i = 0; i < w * ch; i++) {
      rows[i] = 0;
      for (int j = j0; j < j1; j++)
        rows[i] += ry[j] * src[(size_t)j * w * ch + i];
    }
    for (int x = 0; x < ow; x++) {
      const double *rx = wx + (size_t)x * w;
      int i0, i1, dx = flip ? ow - 1 - x : x;
      nonzero(rx, w, &i0, &i1);
      for (int c = 0; c < ch; c++) {
        double v = 0;
        for (int i = i0; i < i1; i++)
          v += rx[i] * rows[(size_t)i * ch + c];
        out[planar ? (size_t)c * ow * oh + (size_t)y * ow + dx : ((size_t)y * ow + dx) * ch + c] = v;
      }
    }
  }
  free(wx);
  free(wy);
  free(rows);
}

typedef struct worst {
  double max, sum;
  size_t n;
} worst;

static void one(int w, int h, int ch, dl__rect r, int ow, int oh, int planar, int flip, bool noise, worst *acc) {
  size_t n = (size_t)w * h * ch, on = (size_t)ow * oh * ch;
  uint8_t *src = malloc(n), *simd = malloc(on), *portable = malloc(on);
  double *want = malloc(on * sizeof(double));
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int c = 0; c < ch; c++)
        src[((size_t)y * w + x) * ch + c] =
            noise ? (uint8_t)next() : (uint8_t)(127 + 120 * sin(x * 0.05 + c) * cos(y * 0.03 - c));
  dl__resize_scratch s = {0};
  dl__resize_force_portable(false);
  ASSERT_EQ(dl__resize(src, w, h, (size_t)w * ch, ch, r, simd, ow, oh, planar, flip, &s), 0);
  dl__resize_force_portable(true);
  ASSERT_EQ(dl__resize(src, w, h, (size_t)w * ch, ch, r, portable, ow, oh, planar, flip, &s), 0);
  dl__resize_force_portable(false);
  if (memcmp(simd, portable, on)) {
    size_t i = 0;
    while (simd[i] == portable[i])
      i++;
    FAIL_AT("%dx%dx%d crop (%.2f %.2f %.2f %.2f) to %dx%d planar %d flip %d: byte %zu is %d with AVX2, %d without",
            w, h, ch, r.x, r.y, r.w, r.h, ow, oh, planar, flip, i, simd[i], portable[i]);
  }
  reference(src, w, h, ch, r, ow, oh, planar, flip, want);
  for (size_t i = 0; i < on; i++) {
    double v = want[i] < 0 ? 0 : want[i] > 255 ? 255 : want[i];
    double d = fabs(simd[i] - v);
    if (d > acc->max)
      acc->max = d;
    acc->sum += d;
  }
  acc->n += on;
  dl__resize_scratch_free(&s);
  free(src);
  free(simd);
  free(portable);
  free(want);
}

static void random_cases(int count, bool noise, worst *acc) {
  for (int k = 0; k < count; k++) {
    int w = 1 + (int)(next() % 700), h = 1 + (int)(next() % 500);
    int ch = next() % 4 ? 3 : 1;
    int ow = 1 + (int)(next() % 260), oh = 1 + (int)(next() % 260);
    if (k % 3 == 0)
      ow = oh = 224; /* the usual shape, whose rows the vector loops take whole */
    dl__rect r;
    r.w = 0.5 + unit() * w;
    r.h = 0.5 + unit() * h;
    r.x = unit() * (w - r.w + 1.5) - 0.5; /* at times a little outside the data, as mapped crops are */
    r.y = unit() * (h - r.h + 1.5) - 0.5;
    one(w, h, ch, r, ow, oh, (int)(next() % 2), (int)(next() % 2), noise, acc);
  }
}

int main(void) {
  worst smooth = {0}, noise = {0};
  random_cases(200, false, &smooth);
  random_cases(100, true, &noise);
  printf("random crops: smooth images within %.3f levels of double precision (mean %.4f), noise within %.3f "
         "(mean %.4f); AVX2 and portable bytes equal\n",
         smooth.max, smooth.sum / smooth.n, noise.max, noise.sum / noise.n);
  ASSERT(smooth.max <= 1.0 && noise.max <= 1.0);
  ASSERT(smooth.sum / smooth.n < 0.3 && noise.sum / noise.n < 0.3);

  /* A reduction by 5,000 in one direction: the vertical pass takes its exact 32-bit loop; by 250
   * across sixteen pixels: the horizontal pass leaves its widened weights to the portable loop. */
  worst huge = {0};
  one(9, 5000, 3, (dl__rect){0, 0, 9, 5000}, 8, 1, 0, 0, true, &huge);
  one(5000, 3, 3, (dl__rect){0, 0, 5000, 3}, 1, 2, 1, 1, true, &huge);
  one(4000, 2, 3, (dl__rect){0, 0, 4000, 2}, 16, 1, 0, 1, true, &huge);
  printf("5000:1 and 250:1 reductions within %.3f levels\n", huge.max);
  ASSERT(huge.max <= 1.0);

  /* Flat images stay flat, at every value, through up- and downscales. */
  for (int v = 0; v < 256; v += 5) {
    int w = 97, h = 61, ch = 3;
    uint8_t *src = malloc((size_t)w * h * ch), out[50 * 40 * 3];
    memset(src, v, (size_t)w * h * ch);
    dl__resize_scratch s = {0};
    for (int k = 0; k < 3; k++) {
      dl__rect r = {unit() * 10, unit() * 10, 20 + unit() * 60, 10 + unit() * 40};
      ASSERT_EQ(dl__resize(src, w, h, (size_t)w * ch, ch, r, out, 50, 40, k & 1, k == 2, &s), 0);
      for (size_t i = 0; i < sizeof out; i++)
        ASSERT_EQ(out[i], v);
    }
    dl__resize_scratch_free(&s);
    free(src);
  }
  printf("flat images keep their value\n");
  return 0;
}
