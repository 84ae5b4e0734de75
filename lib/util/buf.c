/* Grow-only buffers: a worker's scratch reaches its largest size once and is reused from then on. */
#include "internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

int dl__buf_reserve(dl__buf *b, size_t n) {
  if (n <= b->cap)
    return 0;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < n)
    cap *= 2;
  void *p = realloc(b->p, cap);
  if (!p)
    return -ENOMEM;
  b->p = p;
  b->cap = cap;
  return 0;
}

int dl__buf_reserve_aligned(dl__buf *b, size_t n, size_t align) {
  if (n <= b->cap && ((uintptr_t)b->p % align) == 0)
    return 0;
  size_t cap = (n + align - 1) / align * align;
  void *p = aligned_alloc(align, cap);
  if (!p)
    return -ENOMEM;
  free(b->p);
  b->p = p;
  b->cap = cap;
  return 0;
}

void dl__buf_free(dl__buf *b) {
  free(b->p);
  b->p = NULL;
  b->cap = 0;
}
