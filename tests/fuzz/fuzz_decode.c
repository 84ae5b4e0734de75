/* libFuzzer entry point for the image decoders: any bytes as a JPEG, PNG or WebP member (and as an
 * MDS pil column's raw pixels), decoded with a random-resized crop (drawn from the input) into a
 * small slot, as a worker does; and read by the JPEG marker reader that plans GPU decodes. A JPEG
 * is also decoded from its crop's rows (jpeg_rows.c), at crops low in the image, which must give
 * the same result as the whole decode, pixels and error alike, and its scan walked whole as the
 * GPU path has it walked. */
#include "core.h"

#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int plan(dl__decode_job *job, int w, int h, dl__err *e) {
  uint64_t key = *(uint64_t *)job->plan_arg;
  return dl__crop_rect(DL__CROP_RANDOM_RESIZED, w, h, job->out_w, job->out_h, key, &job->rect, e);
}

/* The lower part of the image, from a fraction KEY's bits choose. */
static int plan_low(dl__decode_job *job, int w, int h, dl__err *e) {
  (void)e;
  uint64_t key = *(uint64_t *)job->plan_arg;
  double top = 0.1 + 0.8 * (double)(key % 97) / 97;
  job->rect = (dl__rect){0.1 * w, top * h, 0.8 * w, (1 - top) * h};
  return 0;
}

static void rows_alike(dl__image_decoder *whole, dl__image_decoder *rowwise, dl__jpeg_rows *store,
                       const uint8_t *data, size_t size, uint64_t key, int channels) {
  dl__decode_job a = {.src = data, .len = size, .channels = channels, .out_w = 16, .out_h = 16,
                      .max_pixels = 1 << 22, .plan = plan_low, .plan_arg = &key, .scratch = &whole->scratch};
  dl__decode_job b = a;
  b.scratch = &rowwise->scratch;
  b.rows = store;
  dl__err ea = {0}, eb = {0};
  int ra = dl__image_decode_job(whole, &a, &ea), rb = dl__image_decode_job(rowwise, &b, &eb);
  if (ra != rb || strcmp(ea.msg, eb.msg)) {
    fprintf(stderr, "whole: %d %s; from the crop's rows: %d %s\n", ra, ea.msg, rb, eb.msg);
    abort();
  }
  if (ra == 0 && (a.width != b.width || a.height != b.height || a.stride != b.stride))
    abort();
  for (int y = 0; ra == 0 && y < a.height; y++)
    if (memcmp(a.pixels + (size_t)y * a.stride, b.pixels + (size_t)y * b.stride, (size_t)a.width * channels))
      abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static dl__image_decoder d, whole, rowwise;
  static bool ready;
  if (!ready && (dl__image_decoder_init(&d) || dl__image_decoder_init(&whole) || dl__image_decoder_init(&rowwise)))
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
  if (dl__sniff_codec(data, size) == DL__CODEC_JPEG) {
    /* The first decode learns where rows begin, the second starts from what the first learnt; or
     * the walk of the whole scan that the GPU path asks for learns them first. */
    dl__jpeg_rows *store = dl__jpeg_rows_new(1, 1 << 20);
    if (!store)
      abort();
    if (key & 2) {
      int clean = dl__jpeg_rows_clean(store, 0, data, size, 1 << 22);
      if (clean < 0 || clean > 1 || dl__jpeg_rows_clean(store, 0, data, size, 1 << 22) != clean)
        abort();
    }
    rows_alike(&whole, &rowwise, store, data, size, key, 3);
    rows_alike(&whole, &rowwise, store, data, size, key * 7 + 5, key & 1 ? 1 : 3);
    dl__jpeg_rows_free(store);
  }
  return 0;
}
