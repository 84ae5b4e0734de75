#include "tar_writer.h"

#include <errno.h>
#include <string.h>

static void octal(char *field, size_t width, unsigned long long v) {
  snprintf(field, width, "%0*llo", (int)width - 1, v);
}

int tar_write_member(FILE *f, const char *name, const void *data, size_t len) {
  char h[512];
  memset(h, 0, sizeof h);
  size_t n = strlen(name);
  if (n <= 100) {
    memcpy(h, name, n);
  } else {
    const char *split = name + n - 101;
    split = strchr(split + 1, '/');
    if (!split || (size_t)(split - name) > 155 || strlen(split + 1) > 100)
      return -ENAMETOOLONG;
    memcpy(h + 345, name, (size_t)(split - name));
    memcpy(h, split + 1, strlen(split + 1));
  }
  octal(h + 100, 8, 0644);
  octal(h + 108, 8, 0);
  octal(h + 116, 8, 0);
  octal(h + 124, 12, len);
  octal(h + 136, 12, 0);
  h[156] = '0';
  memcpy(h + 257, "ustar", 6);
  memcpy(h + 263, "00", 2);
  memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++)
    sum += (unsigned char)h[i];
  snprintf(h + 148, 8, "%06o", sum);
  h[155] = ' ';
  static const char zeros[512];
  if (fwrite(h, 1, 512, f) != 512 || fwrite(data, 1, len, f) != len ||
      fwrite(zeros, 1, (512 - len % 512) % 512, f) != (512 - len % 512) % 512)
    return -EIO;
  return 0;
}

int tar_write_end(FILE *f) {
  static const char zeros[1024];
  return fwrite(zeros, 1, sizeof zeros, f) == sizeof zeros ? 0 : -EIO;
}
