/*
 * The benchmarks' way into a tar shard: every .jpg/.jpeg member, read into memory that ALLOC
 * gives, handed to TAKE (which owns it from then on). A bench's inputs are its own test shards, so
 * anything unexpected ends the program. Also the clock the benches time with.
 */
#ifndef RINGFEED_BENCH_TAR_JPEGS_H
#define RINGFEED_BENCH_TAR_JPEGS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double bench_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* ALLOC for the benches that need no special memory. */
static inline unsigned char *tar_jpegs_malloc(size_t n) { return malloc(n ? n : 1); }

static void tar_jpegs(const char *path, unsigned char *(*alloc)(size_t), void (*take)(unsigned char *, size_t)) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    exit(1);
  }
  unsigned char h[512];
  while (fread(h, 1, 512, f) == 512 && h[0]) {
    size_t size = strtoull((char *)h + 124, NULL, 8), pad = (512 - size % 512) % 512;
    const char *dot = strrchr((char *)h, '.');
    if (!dot || (strcmp(dot, ".jpg") && strcmp(dot, ".jpeg"))) {
      fseek(f, (long)(size + pad), SEEK_CUR);
      continue;
    }
    unsigned char *p = alloc(size);
    if (!p || fread(p, 1, size, f) != size) {
      fprintf(stderr, "%s: truncated, or out of memory\n", path);
      exit(1);
    }
    fseek(f, (long)pad, SEEK_CUR);
    take(p, size);
  }
  fclose(f);
}

#endif
