/*
 * One image into its place in a batch on the CPU: decode only what the sample's crop needs,
 * resample it to the output size, flip it when its draw says so. The workers do this for every
 * image they decode; the GPU stage does it for the few JPEGs nvJPEG refuses.
 */
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

int dl__sniff_codec(const uint8_t *p, size_t n) {
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF)
    return DL__CODEC_JPEG;
  if (n >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8))
    return DL__CODEC_PNG;
  if (n >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "WEBP", 4))
    return DL__CODEC_WEBP;
  return DL__CODEC_OTHER;
}

int dl__codec_of_ext(const char *name) {
  const char *dot = strrchr(name, '.');
  const char *ext = dot ? dot + 1 : name;
  if (!strcasecmp(ext, "jpg") || !strcasecmp(ext, "jpeg"))
    return DL__CODEC_JPEG;
  if (!strcasecmp(ext, "png"))
    return DL__CODEC_PNG;
  if (!strcasecmp(ext, "webp"))
    return DL__CODEC_WEBP;
  return DL__CODEC_NONE;
}

int dl__image_decoder_init(dl__image_decoder *d) {
  *d = (dl__image_decoder){0};
  if (dl__jpeg_ops.create(&d->jpeg) || dl__png_ops.create(&d->png) || dl__webp_ops.create(&d->webp)) {
    dl__image_decoder_free(d);
    return -ENOMEM;
  }
  return 0;
}

void dl__image_decoder_free(dl__image_decoder *d) {
  dl__jpeg_ops.destroy(d->jpeg);
  dl__png_ops.destroy(d->png);
  dl__webp_ops.destroy(d->webp);
  dl__buf_free(&d->scratch);
  dl__resize_scratch_free(&d->rs);
  *d = (dl__image_decoder){0};
}

int dl__image_decode_job(dl__image_decoder *d, dl__decode_job *job, dl__err *e) {
  switch (job->pil ? DL__CODEC_PIL : dl__sniff_codec(job->src, job->len)) {
  case DL__CODEC_PIL:
    return dl__pil_ops.decode(NULL, job, e);
  case DL__CODEC_JPEG:
    return dl__jpeg_ops.decode(d->jpeg, job, e);
  case DL__CODEC_PNG:
    return dl__png_ops.decode(d->png, job, e);
  case DL__CODEC_WEBP:
    return dl__webp_ops.decode(d->webp, job, e);
  default:
    return dl__err_set(e, DL_EUNSUPPORTED, "not a JPEG, PNG or WebP (unrecognised leading bytes)");
  }
}

typedef struct plan_arg {
  const dl_loader *l;
  uint64_t key;
} plan_arg;

static int plan(dl__decode_job *job, int w, int h, dl__err *e) {
  plan_arg *a = job->plan_arg;
  return dl__crop_rect(a->l->o.crop, w, h, job->out_w, job->out_h, a->key, &job->rect, e);
}

int dl__image_decode(dl__image_decoder *d, const dl_loader *l, const uint8_t *image, size_t len, int codec,
                     uint64_t key, uint32_t sample, uint8_t *dst, dl__err *e) {
  plan_arg pa = {l, key};
  dl__decode_job job = {.src = image,
                        .len = len,
                        .channels = l->o.channels,
                        .out_w = l->o.width,
                        .out_h = l->o.height,
                        .max_pixels = l->o.max_pixels,
                        .plan = plan,
                        .plan_arg = &pa,
                        .scratch = &d->scratch,
                        .cancel = &l->cancel,
                        .pil = codec == DL__CODEC_PIL,
                        .rows = d->rows,
                        .sample = sample};
  int r = dl__image_decode_job(d, &job, e);
  if (r)
    return r;
  /* Float output is converted on the GPU from NHWC uint8, whatever layout it ends in. */
  bool planar = l->o.layout == DL__LAYOUT_NCHW && l->o.dtype == DL__DTYPE_UINT8;
  if (dl__resize(job.pixels, job.width, job.height, job.stride, l->o.channels, job.mapped, dst, l->o.width,
                 l->o.height, planar, dl__sample_flip(l, key), &d->rs))
    return dl__err_set(e, -ENOMEM, "out of memory resizing");
  return 0;
}
