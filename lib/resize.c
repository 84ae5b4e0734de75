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
    a->first[o] = lo;
    a->count[o] = n;
  }
}

static uint8_t clamp_u8(float v) {
  v += 0.5f;
  return v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)v;
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
  int y_lo = ay.first[0], y_hi = ay.first[oh - 1] + ay.count[oh - 1];
  for (int o = 0; o < oh; o++) {
    if (ay.first[o] < y_lo)
      y_lo = ay.first[o];
    if (ay.first[o] + ay.count[o] > y_hi)
      y_hi = ay.first[o] + ay.count[o];
  }
  int rows = y_hi - y_lo;
  size_t tmp_row = (size_t)ow * ch;
  if (dl__buf_reserve(&s->tmp, (size_t)rows * tmp_row * sizeof(float)))
    return -ENOMEM;
  float *tmp = (float *)s->tmp.p;
  for (int y = 0; y < rows; y++) {
    const uint8_t *row = src + (size_t)(y + y_lo) * stride;
    float *t = tmp + (size_t)y * tmp_row;
    for (int x = 0; x < ow; x++) {
      const float *wx = ax.w + (size_t)x * ax.taps;
      const uint8_t *px = row + (size_t)ax.first[x] * ch;
      int n = ax.count[x];
      if (ch == 3) {
        float r = 0, g = 0, b = 0;
        for (int i = 0; i < n; i++) {
          r += wx[i] * px[3 * i];
          g += wx[i] * px[3 * i + 1];
          b += wx[i] * px[3 * i + 2];
        }
        t[3 * x] = r, t[3 * x + 1] = g, t[3 * x + 2] = b;
      } else {
        for (int c = 0; c < ch; c++) {
          float v = 0;
          for (int i = 0; i < n; i++)
            v += wx[i] * px[ch * i + c];
          t[(size_t)x * ch + c] = v;
        }
      }
    }
  }
  for (int y = 0; y < oh; y++) {
    const float *wy = ay.w + (size_t)y * ay.taps;
    const float *base = tmp + (size_t)(ay.first[y] - y_lo) * tmp_row;
    int n = ay.count[y];
    for (int x = 0; x < ow; x++) {
      int dx = flip ? ow - 1 - x : x;
      for (int c = 0; c < ch; c++) {
        float v = 0;
        for (int i = 0; i < n; i++)
          v += wy[i] * base[(size_t)i * tmp_row + (size_t)x * ch + c];
        if (planar)
          out[c * plane + (size_t)y * ow + dx] = clamp_u8(v);
        else
          out[((size_t)y * ow + dx) * ch + c] = clamp_u8(v);
      }
    }
  }
  return 0;
}
