/*
 * One image into its place in a batch on the CPU: decode only what the sample's crop needs,
 * resample it to the output size, flip it when its draw says so. The workers do this for every
 * image they decode; the GPU stage does it for the few JPEGs nvJPEG refuses.
 */
#include "internal.h"

#include <errno.h>

int dl__image_decoder_init(dl__image_decoder *d) {
  *d = (dl__image_decoder){0};
  if (dl__jpeg_ops.create(&d->jpeg) || dl__png_ops.create(&d->png)) {
    dl__image_decoder_free(d);
    return -ENOMEM;
  }
  return 0;
}

void dl__image_decoder_free(dl__image_decoder *d) {
  dl__jpeg_ops.destroy(d->jpeg);
  dl__png_ops.destroy(d->png);
  dl__buf_free(&d->scratch);
  dl__buf_free(&d->rs.tmp);
  dl__buf_free(&d->rs.coef);
  *d = (dl__image_decoder){0};
}

typedef struct plan_arg {
  const dl_loader *l;
  uint64_t key;
} plan_arg;

static int plan(dl__decode_job *job, int w, int h, dl__err *e) {
  plan_arg *a = job->plan_arg;
  return dl__crop_rect(a->l->o.crop, w, h, job->out_w, job->out_h, a->key, &job->rect, e);
}

int dl__image_decode(dl__image_decoder *d, const dl_loader *l, const uint8_t *image, size_t len, uint64_t key,
                     uint8_t *dst, dl__err *e) {
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
                        .cancel = &l->cancel};
  int codec = dl__sniff_codec(image, len);
  int r;
  if (codec == DL__CODEC_JPEG)
    r = dl__jpeg_ops.decode(d->jpeg, &job, e);
  else if (codec == DL__CODEC_PNG)
    r = dl__png_ops.decode(d->png, &job, e);
  else
    r = dl__err_set(e, DL_EUNSUPPORTED, "not a JPEG or PNG (unrecognised leading bytes)");
  if (r)
    return r;
  /* Float output is converted on the GPU from NHWC uint8, whatever layout it ends in. */
  bool planar = l->o.layout == DL__LAYOUT_NCHW && l->o.dtype == DL__DTYPE_UINT8;
  if (dl__resize(job.pixels, job.width, job.height, job.stride, l->o.channels, job.mapped, dst, l->o.width,
                 l->o.height, planar, dl__sample_flip(l, key), &d->rs))
    return dl__err_set(e, -ENOMEM, "out of memory resizing");
  return 0;
}
