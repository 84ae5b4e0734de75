/* libFuzzer entry point for the image decoders: any bytes as a JPEG, PNG or WebP member (and as an
 * MDS pil column's raw pixels), decoded with a random-resized crop (drawn from the input) into a
 * small slot, as a worker does; and read by the JPEG marker reader that plans GPU decodes. */
#include "internal.h"

#include <stdbool.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int plan(dl__decode_job *job, int w, int h, dl__err *e) {
  uint64_t key = *(uint64_t *)job->plan_arg;
  return dl__crop_rect(DL__CROP_RANDOM_RESIZED, w, h, job->out_w, job->out_h, key, &job->rect, e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static dl__image_decoder d;
  static bool ready;
  if (!ready && dl__image_decoder_init(&d))
    abort();
  ready = true;
  uint64_t key = size;
  for (size_t i = 0; i < size && i < 64; i++)
    key = key * 31 + data[i];
  /* The marker reader the GPU path plans with, over whole files (scans and restart markers). */
  for (int whole = 0; whole <= 1; whole++) {
    dl__jpeg_info j;
    if (dl__jpeg_probe(data, size, whole, &j) == 0 && (j.scans < 1 || j.entropy_bytes > size || j.blocks < 0))
      abort();
  }
  uint8_t out[24 * 24 * 3];
  /* As the image bytes of a tar member (sniffed), and as an MDS pil column's raw pixels. */
  for (int run = 0; run < 4; run++) {
    int channels = run & 1 ? 3 : 1;
    dl__decode_job job = {.src = data, .len = size, .channels = channels, .out_w = 24, .out_h = 24,
                          .max_pixels = 1 << 22, .plan = plan, .plan_arg = &key, .scratch = &d.scratch,
                          .pil = run >= 2};
    dl__err e = {0};
    int r = dl__image_decode_job(&d, &job, &e);
    if (r == 0 && dl__resize(job.pixels, job.width, job.height, job.stride, channels, job.mapped, out,
                             24, 24, channels == 1, 1, &d.rs))
      abort();
    if (r != 0 && !e.msg[0])
      abort(); /* a refusal says why */
  }
  return 0;
}
