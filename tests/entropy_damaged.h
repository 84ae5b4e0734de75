/* Third-party JPEGs whose markers are all sound but whose entropy-coded data is damaged: libjpeg
 * runs out of data mid-scan ("premature end of data segment") and the CPU path fails them; only
 * a reader of the codes sees it, and nvJPEG's hardware engine decodes them without an error. The
 * workers read such scans through before the GPU may take them (jpeg_rows.c), so decode=gpu
 * skips them as the CPU path does (test_jpeg_rows, test_gpu_host, test_gpu_decode). */
#ifndef RINGFEED_TEST_ENTROPY_DAMAGED_H
#define RINGFEED_TEST_ENTROPY_DAMAGED_H

#include <string.h>

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

#endif
