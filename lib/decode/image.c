/*
 * One image into its place in a batch on the CPU: decode only what the sample's crop needs,
 * resample it to the output size, flip it when its draw says so. The workers do this for every
 * image they decode; the GPU stage does it for the few JPEGs nvJPEG refuses.
 */
#include "decode/decode.h"

#include <errno.h>
#include <string.h>

int dl__image_decoder_init(dl__image_decoder *d) {
  *d = (dl__image_decoder){0};
  for (int i = 0; i < DL__MAX_CODECS; i++) {
    const dl__codec *c = dl__codec_of(i);
    if (c && c->ops->create(&d->ctx[i])) {
      dl__image_decoder_free(d);
      return -ENOMEM;
    }
  }
  return 0;
}

void dl__image_decoder_free(dl__image_decoder *d) {
  for (int i = 0; i < DL__MAX_CODECS; i++) {
    const dl__codec *c = dl__codec_of(i);
    if (c)
      c->ops->destroy(d->ctx[i]);
  }
  dl__buf_free(&d->scratch);
  dl__resize_scratch_free(&d->rs);
  *d = (dl__image_decoder){0};
}

int dl__image_decode_job(dl__image_decoder *d, dl__decode_job *job, dl__err *e) {
  int id = job->pil ? DL__CODEC_PIL : dl__sniff_codec(job->src, job->len);
  const dl__codec *c = dl__codec_of(id);
  if (!c) {
    char labels[128];
    return dl__err_set(e, DL_EUNSUPPORTED, "not a %s (unrecognised leading bytes)",
                       dl__codec_labels(labels, sizeof labels));
  }
  return c->ops->decode(d->ctx[id], job, e);
}

dl__image_spec dl__image_spec_of(const dl__options *o, const _Atomic int *cancel) {
  /* Float output is converted on the GPU from NHWC uint8, whatever layout it ends in. */
  return (dl__image_spec){.width = o->width, .height = o->height, .channels = o->channels, .crop = o->crop,
                          .planar = o->layout == DL__LAYOUT_NCHW && o->dtype == DL__DTYPE_UINT8,
                          .max_pixels = o->max_pixels, .cancel = cancel};
}

typedef struct plan_arg {
  int crop;
  uint64_t key;
} plan_arg;

static int plan(dl__decode_job *job, int w, int h, dl__err *e) {
  plan_arg *a = job->plan_arg;
  return dl__crop_rect(a->crop, w, h, job->out_w, job->out_h, a->key, &job->rect, e);
}

int dl__image_decode(dl__image_decoder *d, const dl__image_spec *spec, const uint8_t *image, size_t len, int codec,
                     uint64_t key, bool flip, uint32_t sample, uint8_t *dst, dl__err *e) {
  plan_arg pa = {spec->crop, key};
  dl__decode_job job = {.src = image,
                        .len = len,
                        .channels = spec->channels,
                        .out_w = spec->width,
                        .out_h = spec->height,
                        .max_pixels = spec->max_pixels,
                        .plan = plan,
                        .plan_arg = &pa,
                        .scratch = &d->scratch,
                        .cancel = spec->cancel,
                        .pil = codec == DL__CODEC_PIL,
                        .rows = d->rows,
                        .sample = sample};
  int r = dl__image_decode_job(d, &job, e);
  if (r)
    return r;
  if (dl__resize(job.pixels, job.width, job.height, job.stride, spec->channels, job.mapped, dst, spec->width,
                 spec->height, spec->planar, flip, &d->rs))
    return dl__err_set(e, -ENOMEM, "out of memory resizing");
  return 0;
}
