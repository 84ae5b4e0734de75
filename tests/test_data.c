#include "test_data.h"
#include "internal.h"
#include "synthetic.h"
#include "tar_writer.h"
#include "test.h"

#include <limits.h>

static void tar_sample(FILE *f, const char *key, long image_id, long label, synthetic_coding coding,
                       unsigned char **jpg, unsigned long *len) {
  ASSERT_EQ(synthetic_jpeg(image_id, coding, jpg, len), 0);
  char name[PATH_MAX], text[32];
  snprintf(name, sizeof name, "%s.jpg", key);
  ASSERT_EQ(tar_write_member(f, name, *jpg, *len), 0);
  snprintf(name, sizeof name, "%s.cls", key);
  int n = snprintf(text, sizeof text, "%ld", label);
  ASSERT_EQ(tar_write_member(f, name, text, (size_t)n), 0);
}

void test_tar_sample(FILE *f, const char *key, long image_id, long label, unsigned char **jpg,
                     unsigned long *len) {
  tar_sample(f, key, image_id, label, SYNTHETIC_DEFAULT, jpg, len);
}

void test_tar_synthetic(FILE *f, const char *key, long image_id, long label, int quality, int subsampling) {
  unsigned char *jpg;
  unsigned long len;
  tar_sample(f, key, image_id, label, (synthetic_coding){quality, subsampling}, &jpg, &len);
  free(jpg);
}

void test_write_file(const char *path, const void *p, size_t n) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) {
    *slash = 0;
    dl__mkdirs(dir);
  }
  FILE *g = fopen(path, "wb");
  ASSERT(g);
  ASSERT_EQ(fwrite(p, 1, n, g), n);
  fclose(g);
}
