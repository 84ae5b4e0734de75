/* libFuzzer entry point for the image decoders: any bytes as a JPEG or PNG member, decoded with a
 * random-resized crop (drawn from the input) into a small slot, as a worker does. */
#include "internal.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int plan(dl__decode_job *job, int w, int h, dl__err *e) {
  uint64_t key = *(uint64_t *)job->plan_arg;
  return dl__crop_rect(DL__CROP_RANDOM_RESIZED, w, h, job->out_w, job->out_h, key, &job->rect, e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static void *jpeg, *png;
  static dl__buf scratch;
  static dl__resize_scratch rs;
  if (!jpeg && (dl__jpeg_ops.create(&jpeg) || dl__png_ops.create(&png)))
    abort();
  uint64_t key = size;
  for (size_t i = 0; i < size && i < 64; i++)
    key = key * 31 + data[i];
  uint8_t out[24 * 24 * 3];
  for (int channels = 1; channels <= 3; channels += 2) {
    dl__decode_job job = {.src = data, .len = size, .channels = channels, .out_w = 24, .out_h = 24,
                          .max_pixels = 1 << 22, .plan = plan, .plan_arg = &key, .scratch = &scratch};
    dl__err e = {0};
    int codec = dl__sniff_codec(data, size);
    int r = codec == DL__CODEC_JPEG ? dl__jpeg_ops.decode(jpeg, &job, &e)
            : codec == DL__CODEC_PNG ? dl__png_ops.decode(png, &job, &e)
                                     : -1;
    if (r == 0 && dl__resize(job.pixels, job.width, job.height, job.stride, channels, job.mapped, out,
                             24, 24, channels == 1, 1, &rs))
      abort();
  }
  return 0;
}
