#include "test_data.h"
#include "core.h"
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

void test_tar_shard(const char *path, const char *prefix, int n, int images, long base, long *ends) {
  FILE *f = fopen(path, "wb");
  ASSERT(f);
  unsigned char **jpg = calloc((size_t)images, sizeof *jpg);
  unsigned long *len = calloc((size_t)images, sizeof *len);
  ASSERT(jpg && len);
  for (int i = 0; i < n; i++) {
    char key[PATH_MAX], name[PATH_MAX + 8], text[32];
    snprintf(key, sizeof key, "%s%04d", prefix, i);
    int k = i % images;
    if (!jpg[k]) {
      tar_sample(f, key, k, base + i, SYNTHETIC_DEFAULT, &jpg[k], &len[k]);
    } else {
      snprintf(name, sizeof name, "%s.jpg", key);
      ASSERT_EQ(tar_write_member(f, name, jpg[k], len[k]), 0);
      snprintf(name, sizeof name, "%s.cls", key);
      int t = snprintf(text, sizeof text, "%ld", base + i);
      ASSERT_EQ(tar_write_member(f, name, text, (size_t)t), 0);
    }
    if (ends)
      ends[i] = ftell(f);
  }
  for (int k = 0; k < images; k++)
    free(jpg[k]);
  free(jpg);
  free(len);
  ASSERT_EQ(tar_write_end(f), 0);
  fclose(f);
}

void test_tar_synthetic(FILE *f, const char *key, long image_id, long label, synthetic_coding coding) {
  unsigned char *jpg;
  unsigned long len;
  tar_sample(f, key, image_id, label, coding, &jpg, &len);
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
