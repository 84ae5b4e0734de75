/*
 * Raw pixels as MosaicML Streaming's "pil" columns store them: width, height and the length of the
 * mode's name (uint32 each), the mode's name, then what PIL's Image.tobytes() gives, rows of
 * interleaved bytes without padding. Modes RGB, RGBA, L and LA are taken (alpha dropped); the
 * others (P has no palette stored, 1 is bit-packed, I;16, F, CMYK ...) are named. No decoding:
 * the pixels are read where they lie when the output has their channels, else converted once.
 * Grayscale from colour takes BT.601 luma, as libjpeg does.
 */
#include "internal.h"

#include <errno.h>
#include <string.h>

static int pil_create(void **ctx) {
  *ctx = NULL;
  return 0;
}

static void pil_destroy(void *ctx) { (void)ctx; }

static int pil_decode(void *ctx, dl__decode_job *job, dl__err *e) {
  (void)ctx;
  if (job->len < 12)
    return dl__err_set(e, DL_ECORRUPT, "PIL pixels: %zu bytes, shorter than their header", job->len);
  uint32_t w = dl__le32(job->src), h = dl__le32(job->src + 4), mode_len = dl__le32(job->src + 8);
  static const struct { const char *mode; int bytes; } modes[] = {{"RGB", 3}, {"RGBA", 4}, {"L", 1}, {"LA", 2}};
  int bpp = 0;
  char mode[16] = "";
  if (mode_len < sizeof mode && 12 + (size_t)mode_len <= job->len) {
    memcpy(mode, job->src + 12, mode_len);
    for (size_t i = 0; i < sizeof modes / sizeof *modes && !bpp; i++)
      bpp = !strcmp(mode, modes[i].mode) && strlen(mode) == mode_len ? modes[i].bytes : 0;
  }
  if (!bpp)
    return dl__err_set(e, DL_EUNSUPPORTED, "PIL pixels of mode '%.15s': RGB, RGBA, L and LA are read (convert the "
                       "images, e.g. to RGB)", mode_len < sizeof mode ? mode : "(too long)");
  job->src_width = (int)(w > INT32_MAX ? INT32_MAX : w);
  job->src_height = (int)(h > INT32_MAX ? INT32_MAX : h);
  if (!w || !h || (uint64_t)w * h > (uint64_t)job->max_pixels)
    return dl__err_set(e, w && h ? DL_ELIMIT : DL_ECORRUPT, "PIL pixels of %ux%u%s", w, h,
                       w && h ? ", above max_pixels" : "");
  uint64_t bytes = (uint64_t)w * h * (uint64_t)bpp;
  if (12 + (uint64_t)mode_len + bytes != job->len)
    return dl__err_set(e, DL_ECORRUPT, "PIL pixels: %ux%u %s is %llu bytes, the value holds %zu", w, h, mode,
                       (unsigned long long)bytes, job->len - 12 - mode_len);
  int r = job->plan(job, (int)w, (int)h, e);
  if (r)
    return r;
  const uint8_t *px = job->src + 12 + mode_len;
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
        out[i] = in == 1 ? p[0] : (uint8_t)((19595u * p[0] + 38470u * p[1] + 7471u * p[2] + 32768u) >> 16);
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

const dl__decoder_ops dl__pil_ops = {"pil", pil_create, pil_destroy, pil_decode};
