/*
 * Where each sample's pixels come from: torchvision's RandomResizedCrop (scale (0.08, 1), ratio
 * (3/4, 4/3), ten tries then a centre fallback), the evaluation centre crop (shorter side to
 * size/0.875, then the centre), a plain resize, or no crop at all. Draws come from a counter-based
 * generator keyed by (seed, epoch, sample index), so pixels never depend on timing or worker count.
 */
#include "decode/decode.h"

#include <math.h>

static int64_t randint(uint64_t key, uint64_t draw, int64_t lo, int64_t hi_inclusive) {
  int64_t span = hi_inclusive - lo + 1;
  int64_t v = lo + (int64_t)(dl__uniform(key, draw) * (double)span);
  return v > hi_inclusive ? hi_inclusive : v;
}

static void random_resized(int W, int H, uint64_t key, dl__rect *r) {
  double area = (double)W * H;
  double lo = log(3.0 / 4.0), hi = log(4.0 / 3.0);
  for (int attempt = 0; attempt < 10; attempt++) {
    uint64_t base = (uint64_t)attempt * 4;
    double target = area * (0.08 + 0.92 * dl__uniform(key, base));
    double ratio = exp(lo + (hi - lo) * dl__uniform(key, base + 1));
    long w = lround(sqrt(target * ratio)), h = lround(sqrt(target / ratio));
    if (w > 0 && w <= W && h > 0 && h <= H) {
      r->y = (double)randint(key, base + 2, 0, H - h);
      r->x = (double)randint(key, base + 3, 0, W - w);
      r->w = (double)w;
      r->h = (double)h;
      return;
    }
  }
  double in_ratio = (double)W / H;
  long w = W, h = H;
  if (in_ratio < 3.0 / 4.0)
    h = lround(w / (3.0 / 4.0));
  else if (in_ratio > 4.0 / 3.0)
    w = lround(h * (4.0 / 3.0));
  if (h > H)
    h = H;
  if (w > W)
    w = W;
  r->x = (double)((W - w) / 2);
  r->y = (double)((H - h) / 2);
  r->w = (double)w;
  r->h = (double)h;
}

/* Where in its image a sample's crop begins and ends, top to bottom (0..1), from its draws alone:
 * the image's shape is not known before it is read, so a 4:3 one stands in. */
void dl__crop_rows_hint(int mode, int ow, int oh, uint64_t key, double *top, double *bottom) {
  dl__rect r;
  dl__err e = {0};
  if (dl__crop_rect(mode, 640, 480, ow, oh, key, &r, &e)) {
    *top = 0, *bottom = 1;
    return;
  }
  *top = r.y / 480;
  *bottom = (r.y + r.h) / 480;
}

int dl__crop_rect(int mode, int W, int H, int ow, int oh, uint64_t key, dl__rect *r, dl__err *e) {
  switch (mode) {
  case DL__CROP_RANDOM_RESIZED:
    random_resized(W, H, key, r);
    return 0;
  case DL__CROP_CENTER: {
    double shorter = W < H ? W : H;
    double target = (double)(ow < oh ? ow : oh) / 0.875;
    double scale = target / shorter;
    r->w = ow / scale < W ? ow / scale : W;
    r->h = oh / scale < H ? oh / scale : H;
    r->x = (W - r->w) / 2;
    r->y = (H - r->h) / 2;
    return 0;
  }
  case DL__CROP_RESIZE:
    *r = (dl__rect){0, 0, W, H};
    return 0;
  default:
    if (W != ow || H != oh)
      return dl__err_set(e, DL_EUNSUPPORTED, "image is %dx%d but crop=none needs %dx%d (image_size=%dx%d)",
                         W, H, ow, oh, oh, ow);
    *r = (dl__rect){0, 0, W, H};
    return 0;
  }
}
