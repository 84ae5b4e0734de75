#include "test_data.h"
#include "internal.h"
#include "synthetic.h"
#include "tar_writer.h"
#include "test.h"

#include <limits.h>

void test_tar_sample(FILE *f, const char *key, long image_id, long label, unsigned char **jpg,
                     unsigned long *len) {
  ASSERT_EQ(synthetic_jpeg(image_id, jpg, len), 0);
  char name[PATH_MAX], text[32];
  snprintf(name, sizeof name, "%s.jpg", key);
  ASSERT_EQ(tar_write_member(f, name, *jpg, *len), 0);
  snprintf(name, sizeof name, "%s.cls", key);
  int n = snprintf(text, sizeof text, "%ld", label);
  ASSERT_EQ(tar_write_member(f, name, text, (size_t)n), 0);
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
