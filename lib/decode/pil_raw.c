/*
 * Raw pixels as MosaicML Streaming's "pil" columns store them: width, height and the length of the
 * mode's name (uint32 each), the mode's name, then what PIL's Image.tobytes() gives, rows of
 * interleaved bytes without padding. Modes RGB, RGBA, L and LA are taken (alpha dropped); the
 * others (P has no palette stored, 1 is bit-packed, I;16, F, CMYK ...) are named. No decoding:
 * the pixels are read where they lie when the output has their channels, else converted once.
 * Grayscale from colour takes BT.601 luma, as libjpeg does.
 */
#include "decode/decode.h"

#include <errno.h>
#include <string.h>

static int pil_create(void **ctx) {
  *ctx = NULL;
  return 0;
}

static void pil_destroy(void *ctx) { (void)ctx; }

int dl__pil_header(const uint8_t *p, size_t len, int64_t max_pixels, dl__pil_image *im, dl__err *e) {
  *im = (dl__pil_image){0};
  if (len < 12)
    return dl__err_set(e, DL_ECORRUPT, "PIL pixels: %zu bytes, shorter than their header", len);
  uint32_t w = dl__le32(p), h = dl__le32(p + 4), mode_len = dl__le32(p + 8);
  static const struct { const char *mode; int bytes; } modes[] = {{"RGB", 3}, {"RGBA", 4}, {"L", 1}, {"LA", 2}};
  im->width = w, im->height = h;
  if (mode_len < sizeof im->mode && 12 + (size_t)mode_len <= len) {
    memcpy(im->mode, p + 12, mode_len);
    for (size_t i = 0; i < sizeof modes / sizeof *modes && !im->bpp; i++)
      im->bpp = !strcmp(im->mode, modes[i].mode) && strlen(im->mode) == mode_len ? modes[i].bytes : 0;
  }
  if (!im->bpp)
    return dl__err_set(e, DL_EUNSUPPORTED, "PIL pixels of mode '%.15s': RGB, RGBA, L and LA are read (convert the "
                       "images, e.g. to RGB)", mode_len < sizeof im->mode ? im->mode : "(too long)");
  if (!w || !h || (uint64_t)w * h > (uint64_t)max_pixels)
    return dl__err_set(e, w && h ? DL_ELIMIT : DL_ECORRUPT, "PIL pixels of %ux%u%s", w, h,
                       w && h ? ", above max_pixels" : "");
  uint64_t bytes = (uint64_t)w * h * (uint64_t)im->bpp;
  if (12 + (uint64_t)mode_len + bytes != len)
    return dl__err_set(e, DL_ECORRUPT, "PIL pixels: %ux%u %s is %llu bytes, the value holds %zu", w, h, im->mode,
                       (unsigned long long)bytes, len - 12 - mode_len);
  im->pixels = p + 12 + mode_len;
  return 0;
}

static int pil_decode(void *ctx, dl__decode_job *job, dl__err *e) {
  (void)ctx;
  dl__pil_image im;
  int r = dl__pil_header(job->src, job->len, job->max_pixels, &im, e);
  job->src_width = (int)(im.width > INT32_MAX ? INT32_MAX : im.width);
  job->src_height = (int)(im.height > INT32_MAX ? INT32_MAX : im.height);
  if (r)
    return r;
  uint32_t w = im.width, h = im.height;
  int bpp = im.bpp;
  if ((r = job->plan(job, (int)w, (int)h, e)))
    return r;
  const uint8_t *px = im.pixels;
  size_t stride = (size_t)w * (size_t)bpp;
  int in = bpp <= 2 ? 1 : 3; /* the channels that are not alpha */
  if (in != job->channels || bpp == 2 || bpp == 4) {
    size_t n = (size_t)w * h;
    if (dl__buf_reserve(job->scratch, n * (size_t)job->channels))
      return dl__err_set(e, -ENOMEM, "out of memory for a %ux%u image", w, h);
    uint8_t *out = job->scratch->p;
    for (size_t i = 0; i < n; i++) {
      const uint8_t *p = px + i * (size_t)bpp;
      if (job->channels == 1)
        out[i] = in == 1 ? p[0] : dl__luma(p[0], p[1], p[2]);
      else if (in == 1)
        out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = p[0];
      else
        memcpy(out + 3 * i, p, 3);
    }
    px = out;
    stride = (size_t)w * (size_t)job->channels;
  }
  job->pixels = px;
  job->width = (int)w;
  job->height = (int)h;
  job->stride = stride;
  job->mapped = job->rect;
  return 0;
}

/* No signature, no extension: a sample is raw pixels where its MDS column says "pil". Stored in
 * ringfeed shards as PNG (dlshard create). */
static const dl__decoder_ops pil_ops = {"pil", pil_create, pil_destroy, pil_decode};
const dl__codec dl__pil_codec = {.id = DL__CODEC_PIL, .rfs = -1, .name = "pil", .label = "raw pixels", .exts = "",
                                 .mds = "pil", .ops = &pil_ops};
