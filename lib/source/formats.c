/*
 * The source formats' table: a local path or a URL is asked of each format in turn, by its name
 * alone first (a folder, an MDS index), then by its first bytes (tar last: any file is one).
 */
#include "source/source.h"

#define DL__FORMAT_ROW(name) &dl__##name##_format,
static const dl__format *const formats[] = {DL__FORMATS(DL__FORMAT_ROW)};
#undef DL__FORMAT_ROW

const dl__format *dl__format_of(const char *path, const struct stat *st, const uint8_t *head, size_t n) {
  for (size_t i = 0; i < DL__ARRAY_LEN(formats); i++)
    if (formats[i]->by_name && formats[i]->by_name(path, st))
      return formats[i];
  for (size_t i = 0; head && i < DL__ARRAY_LEN(formats); i++)
    if (formats[i]->by_bytes && formats[i]->by_bytes(head, n))
      return formats[i];
  return NULL;
}
