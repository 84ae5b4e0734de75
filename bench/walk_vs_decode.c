/*
 * What gpu_check costs a worker: the walk of a JPEG's entropy-coded data that decides whether the
 * GPU may take it (dl__jpeg_rows_clean, every time, no verdict kept) against libjpeg-turbo's full
 * decode of the same image (RGB, its defaults), one thread, in alternating rounds so that both
 * see the same machine. Over every JPEG member of the given tar shards, from memory.
 * Usage: walk_vs_decode [--rounds R] SHARD...
 * Prints one JSON object: walk_ms and decode_ms per image (the medians of the rounds), walk_frac.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "decode/jpeg.h"
#include "tar_jpegs.h"

static struct {
  unsigned char *p;
  size_t n;
} *blobs;
static size_t nblobs, cap;

static void keep(unsigned char *p, size_t n) {
  if (nblobs == cap) {
    cap = cap ? cap * 2 : 1024;
    blobs = realloc(blobs, cap * sizeof *blobs);
  }
  blobs[nblobs].p = p, blobs[nblobs++].n = n;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int rounds = 5, i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: walk_vs_decode [--rounds R] SHARD...\n");
      return 2;
    }
  }
  for (; i < argc; i++)
    tar_jpegs(argv[i], tar_jpegs_malloc, keep);
  if (!nblobs || rounds < 1 || rounds > 99) {
    fprintf(stderr, "walk_vs_decode: no JPEG members found, or --rounds not 1-99\n");
    return 1;
  }
  struct jpeg_decompress_struct d;
  struct jpeg_error_mgr err;
  d.err = jpeg_std_error(&err);
  jpeg_create_decompress(&d);
  unsigned char *out = NULL;
  size_t out_cap = 0;
  double walk[99], decode[99];
  long clean = 0;
  for (int r = 0; r < rounds; r++) {
    double t = bench_now();
    clean = 0;
    for (size_t k = 0; k < nblobs; k++)
      clean += dl__jpeg_rows_clean(NULL, 0, blobs[k].p, blobs[k].n, (int64_t)1 << 40);
    walk[r] = (bench_now() - t) * 1e3 / (double)nblobs;
    t = bench_now();
    for (size_t k = 0; k < nblobs; k++) {
      jpeg_mem_src(&d, blobs[k].p, (unsigned long)blobs[k].n);
      jpeg_read_header(&d, TRUE);
      d.out_color_space = JCS_RGB;
      jpeg_start_decompress(&d);
      size_t stride = (size_t)d.output_width * 3;
      if (stride * d.output_height > out_cap)
        out = realloc(out, out_cap = stride * d.output_height);
      while (d.output_scanline < d.output_height) {
        JSAMPROW row = out + stride * d.output_scanline;
        jpeg_read_scanlines(&d, &row, 1);
      }
      jpeg_finish_decompress(&d);
    }
    decode[r] = (bench_now() - t) * 1e3 / (double)nblobs;
  }
  jpeg_destroy_decompress(&d);
  free(out);
  qsort(walk, (size_t)rounds, sizeof *walk, cmp);
  qsort(decode, (size_t)rounds, sizeof *decode, cmp);
  double w = walk[rounds / 2], dec = decode[rounds / 2];
  printf("{\"images\":%zu,\"clean\":%ld,\"rounds\":%d,\"walk_ms\":%.4f,\"decode_ms\":%.4f,\"walk_frac\":%.3f}\n", nblobs,
         clean, rounds, w, dec, w / dec);
  return 0;
}
