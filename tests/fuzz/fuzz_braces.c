/* libFuzzer entry point for source patterns: any text through brace expansion ({a,b}, {000..146}).
 * Expansions are bounded, and each path is no longer than the pattern could make it. */
#include "core.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 256)
    return 0; /* longer patterns add nothing new, only time */
  char *text = malloc(size + 1);
  if (!text)
    return 0;
  memcpy(text, data, size);
  text[size] = 0;
  char **paths = NULL;
  size_t n = 0;
  if (dl__expand_braces(text, &paths, &n) == 0) {
    if (n > 1000000)
      abort();
    for (size_t i = 0; i < n; i++) {
      if (!paths[i])
        abort();
      free(paths[i]);
    }
    free(paths);
  }
  free(text);
  return 0;
}
