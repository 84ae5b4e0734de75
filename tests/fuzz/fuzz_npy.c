/* libFuzzer entry point for .npy headers: any bytes as a payload. What is accepted must describe
 * data that lies inside the payload and has the size its shape and dtype say. */
#include "core.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  dl__npy a;
  dl__err e = {0};
  if (dl__npy_parse(data, size, size, &a, &e) == 0) {
    uint64_t count = 1;
    for (int d = 0; d < a.ndim; d++) {
      if (a.shape[d] < 0 || (a.shape[d] && count > UINT64_MAX / (uint64_t)a.shape[d]))
        abort();
      count *= (uint64_t)a.shape[d];
    }
    if (a.ndim < 0 || a.ndim > DL__NPY_MAX_DIMS || a.data < data || a.bytes > size ||
        a.data + a.bytes > data + size || count * (a.dtype.bits / 8) != a.bytes)
      abort();
  } else if (!e.code || !e.msg[0]) {
    abort(); /* a refusal says why */
  }
  return 0;
}
