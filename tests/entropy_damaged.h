/* Third-party JPEGs whose markers are all sound but whose entropy-coded data is damaged: libjpeg
 * runs out of data mid-scan ("premature end of data segment") and the CPU path fails them; only
 * a reader of the codes sees it, and nvJPEG's hardware engine decodes them without an error. The
 * workers read such scans through before the GPU may take them (jpeg_rows.c), so decode=gpu
 * skips them as the CPU path does (test_jpeg_rows, test_gpu_host, test_gpu_decode). The same
 * damage is made here in files of several scans (progressive, non-interleaved), which libjpeg
 * itself reads through. */
#ifndef RINGFEED_TEST_ENTROPY_DAMAGED_H
#define RINGFEED_TEST_ENTROPY_DAMAGED_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

static const char *const entropy_damaged[] = {
    "pillow/Tests-images/hopper_bad_exif.jpg",
    "jpeg-decoder/tests/crashtest/images/dc-predictor-overflow.jpg",
};

static inline int is_entropy_damaged(const char *path) {
  for (size_t i = 0; i < sizeof entropy_damaged / sizeof *entropy_damaged; i++) {
    size_t n = strlen(path), m = strlen(entropy_damaged[i]);
    if (n >= m && !strcmp(path + n - m, entropy_damaged[i]))
      return 1;
  }
  return 0;
}

/* A copy of the JPEG P whose scan SCAN (from 0) loses the second half of its entropy-coded data,
 * the markers around it sound: damage that only a reader of the codes sees. NULL where it has no
 * such scan or that scan holds under 64 bytes. */
static inline uint8_t *cut_scan(const uint8_t *p, size_t n, int scan, size_t *out_n) {
  for (size_t i = 2; i + 4 <= n && p[i] == 0xFF && p[i + 1] != 0xD9;) {
    size_t len = (size_t)p[i + 2] << 8 | p[i + 3], data = i + 2 + len, end = data;
    if (p[i + 1] != 0xDA) {
      i += 2 + len;
      continue;
    }
    while (end + 1 < n && !(p[end] == 0xFF && p[end + 1] != 0 && (p[end + 1] < 0xD0 || p[end + 1] > 0xD7)))
      end++;
    if (scan-- > 0) {
      i = end;
      continue;
    }
    if (end - data < 64)
      return NULL;
    size_t cut = data + (end - data) / 2;
    uint8_t *q = (uint8_t *)malloc(n);
    if (!q) {
      fprintf(stderr, "out of memory for a copy of %zu bytes\n", n);
      exit(1);
    }
    memcpy(q, p, cut);
    memcpy(q + cut, p + end, n - end);
    *out_n = cut + n - end;
    return q;
  }
  return NULL;
}

/* A JPEG of noise in several scans (*N bytes, malloc'd): progressive, or sequential with one
 * component a scan. nvJPEG's CUDA decoder takes either, not the engine. */
static inline uint8_t *several_scans_jpeg(int progressive, size_t *n) {
  enum { W = 160, H = 120 };
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char *mem = NULL;
  unsigned long len = 0;
  jpeg_mem_dest(&c, &mem, &len);
  c.image_width = W, c.image_height = H, c.input_components = 3, c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 90, TRUE);
  jpeg_scan_info one_each[3];
  for (int i = 0; i < 3; i++) {
    memset(&one_each[i], 0, sizeof one_each[i]);
    one_each[i].comps_in_scan = 1, one_each[i].component_index[0] = i, one_each[i].Se = 63;
  }
  if (progressive)
    jpeg_simple_progression(&c);
  else
    c.scan_info = one_each, c.num_scans = 3;
  jpeg_start_compress(&c, TRUE);
  uint8_t row[W * 3];
  uint64_t x = 88172645463325252ull;
  while (c.next_scanline < H) {
    for (int i = 0; i < W * 3; i++)
      x ^= x << 13, x ^= x >> 7, x ^= x << 17, row[i] = (uint8_t)(x >> 56);
    JSAMPROW r = row;
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  *n = len;
  return mem;
}

#endif
