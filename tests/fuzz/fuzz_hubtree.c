/* libFuzzer entry point for pages of the Hugging Face Hub's tree API (JSON from a server): any
 * bytes as a page. Each path handed on is a string that ends inside the bounds it was read with. */
#include "remote/remote.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int check(const char *path, void *arg) {
  size_t *files = arg;
  if (strlen(path) >= 1100)
    abort();
  ++*files;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *page = malloc(size ? size : 1); /* its own allocation: reading past it is caught */
  if (!page)
    return 0;
  memcpy(page, data, size);
  size_t files = 0;
  if (dl__hub_tree_files(page, page + size, check, &files) == 0 && files > size)
    abort(); /* every file takes bytes of the page */
  free(page);
  return 0;
}
