/*
 * WebP (lossy and lossless) through libwebp's incremental decoder: the whole image as RGB, alpha
 * dropped, fed in pieces so that a closing loader stops a large image partway. Grayscale output
 * takes BT.601 luma, as libjpeg does for JPEG.
 */
#include "decode/decode.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <webp/decode.h>

#define PIECE (64u << 10) /* bytes fed per step between checks for a close */

static int webp_create(void **ctx) {
  *ctx = NULL; /* libwebp keeps no state between images worth reusing */
  return 0;
}

static void webp_destroy(void *ctx) { (void)ctx; }

static int webp_decode(void *ctx, dl__decode_job *job, dl__err *e) {
  (void)ctx;
  WebPBitstreamFeatures f;
  VP8StatusCode st = WebPGetFeatures(job->src, job->len, &f);
  if (st != VP8_STATUS_OK)
    return dl__err_set(e, DL_ECORRUPT, "corrupt WebP (%s)",
                       st == VP8_STATUS_NOT_ENOUGH_DATA ? "the data ends early" : "bad header");
  if (f.has_animation)
    return dl__err_set(e, DL_EUNSUPPORTED, "animated WebP");
  job->src_width = f.width;
  job->src_height = f.height;
  if ((int64_t)f.width * f.height > job->max_pixels)
    return dl__err_set(e, DL_ELIMIT, "image is %dx%d, above max_pixels=%lld", f.width, f.height,
                       (long long)job->max_pixels);
  int r = job->plan(job, f.width, f.height, e);
  if (r)
    return r;
  size_t stride = (size_t)f.width * 3, bytes = stride * (size_t)f.height;
  if (dl__buf_reserve(job->scratch, bytes ? bytes : 1))
    return dl__err_set(e, -ENOMEM, "out of memory for a %dx%d image", f.width, f.height);
  WebPIDecoder *dec = WebPINewRGB(MODE_RGB, job->scratch->p, bytes, (int)stride);
  if (!dec)
    return dl__err_set(e, -ENOMEM, "out of memory starting a WebP decode");
  st = VP8_STATUS_SUSPENDED;
  for (size_t at = 0; at < job->len && st == VP8_STATUS_SUSPENDED;) {
    if (job->cancel && atomic_load_explicit(job->cancel, memory_order_relaxed)) {
      WebPIDelete(dec);
      return dl__err_set(e, DL_ECLOSED, "the loader was closed");
    }
    size_t n = job->len - at < PIECE ? job->len - at : PIECE;
    st = WebPIAppend(dec, job->src + at, n);
    at += n;
  }
  WebPIDelete(dec);
  if (st == VP8_STATUS_SUSPENDED)
    return dl__err_set(e, DL_ECORRUPT, "WebP data ends early (truncated)");
  if (st == VP8_STATUS_OUT_OF_MEMORY)
    return dl__err_set(e, -ENOMEM, "out of memory decoding a WebP");
  if (st != VP8_STATUS_OK)
    return dl__err_set(e, st == VP8_STATUS_UNSUPPORTED_FEATURE ? DL_EUNSUPPORTED : DL_ECORRUPT,
                       "corrupt WebP (libwebp status %d)", (int)st);
  if (job->channels == 1) { /* in place: each gray byte lands before the RGB it came from */
    uint8_t *p = job->scratch->p;
    for (size_t i = 0, n = (size_t)f.width * (size_t)f.height; i < n; i++)
      p[i] = dl__luma(p[3 * i], p[3 * i + 1], p[3 * i + 2]);
    stride = (size_t)f.width;
  }
  job->pixels = job->scratch->p;
  job->width = f.width;
  job->height = f.height;
  job->stride = stride;
  job->mapped = job->rect;
  return 0;
}

/* A RIFF container of form type WEBP. */
static bool webp_sniff(const uint8_t *p, size_t n) { return n >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "WEBP", 4); }

static const dl__decoder_ops webp_ops = {"webp", webp_create, webp_destroy, webp_decode};
const dl__codec dl__webp_codec = {.id = DL__CODEC_WEBP, .rfs = 4, .name = "webp", .label = "WebP", .exts = ".webp",
                                  .sniff = webp_sniff, .ops = &webp_ops};
