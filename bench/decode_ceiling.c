/*
 * The physical limit of the loader's work on this machine: bare libjpeg-turbo decoding every JPEG
 * member of the given tar shards, full size to RGB (the decoder's defaults: ISLOW IDCT, fancy
 * upsampling), on T threads, from memory. No I/O, no crop, no resize, no batching.
 * Usage: decode_ceiling [--threads T] [--seconds S] [--band top|bottom] SHARD...
 *   --band: only the top or the bottom half of each image's rows, as a crop's decode reads them
 *   (the rows above skipped with jpeg_skip_scanlines, those below never decoded): what a crop's
 *   place in the image costs.
 * Prints one JSON object: images, seconds, images_per_s, threads.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jpeglib.h>

#include "tar_jpegs.h"

typedef struct blob {
  unsigned char *p;
  size_t n;
} blob;

static blob *blobs;
static size_t nblobs, cap;
static double seconds = 5;
static int band; /* 0: every row, 1: the top half, 2: the bottom half */

static void keep(unsigned char *p, size_t n) {
  if (nblobs == cap) {
    cap = cap ? cap * 2 : 1024;
    blobs = realloc(blobs, cap * sizeof *blobs);
  }
  blobs[nblobs++] = (blob){p, n};
}

typedef struct worker {
  pthread_t t;
  int id, threads;
  long images;
  double start;
} worker;

static void *run(void *arg) {
  worker *w = arg;
  struct jpeg_decompress_struct d;
  struct jpeg_error_mgr err;
  d.err = jpeg_std_error(&err);
  jpeg_create_decompress(&d);
  unsigned char *out = NULL;
  size_t out_cap = 0;
  size_t i = (size_t)w->id;
  while (bench_now() - w->start < seconds) {
    blob *b = &blobs[i % nblobs];
    i += (size_t)w->threads;
    jpeg_mem_src(&d, b->p, (unsigned long)b->n);
    jpeg_read_header(&d, TRUE);
    d.out_color_space = JCS_RGB;
    jpeg_start_decompress(&d);
    size_t stride = (size_t)d.output_width * 3;
    if (stride * d.output_height > out_cap) {
      out_cap = stride * d.output_height;
      out = realloc(out, out_cap);
    }
    JDIMENSION half = d.output_height / 2, end = band == 1 ? half : d.output_height;
    if (band == 2)
      jpeg_skip_scanlines(&d, half);
    while (d.output_scanline < end) {
      JSAMPROW row = out + stride * d.output_scanline;
      jpeg_read_scanlines(&d, &row, 1);
    }
    if (band)
      jpeg_abort_decompress(&d);
    else
      jpeg_finish_decompress(&d);
    w->images++;
  }
  jpeg_destroy_decompress(&d);
  free(out);
  return NULL;
}

int main(int argc, char **argv) {
  int threads = 1;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--band") && i + 1 < argc && (!strcmp(argv[i + 1], "top") || !strcmp(argv[i + 1], "bottom")))
      band = !strcmp(argv[++i], "top") ? 1 : 2;
    else {
      fprintf(stderr, "usage: decode_ceiling [--threads T] [--seconds S] [--band top|bottom] SHARD...\n");
      return 2;
    }
  }
  for (; i < argc; i++)
    tar_jpegs(argv[i], tar_jpegs_malloc, keep);
  if (!nblobs || threads < 1) {
    fprintf(stderr, "decode_ceiling: no JPEG members found\n");
    return 1;
  }
  worker *w = calloc((size_t)threads, sizeof *w);
  double t0 = bench_now();
  for (int t = 0; t < threads; t++) {
    w[t] = (worker){.id = t, .threads = threads, .start = t0};
    pthread_create(&w[t].t, NULL, run, &w[t]);
  }
  long images = 0;
  for (int t = 0; t < threads; t++) {
    pthread_join(w[t].t, NULL);
    images += w[t].images;
  }
  double dt = bench_now() - t0;
  printf("{\"images\":%ld,\"seconds\":%.3f,\"images_per_s\":%.1f,\"threads\":%d,\"band\":\"%s\",\"distinct_images\":%zu}\n",
         images, dt, images / dt, threads, band == 1 ? "top" : band == 2 ? "bottom" : "all", nblobs);
  return 0;
}
