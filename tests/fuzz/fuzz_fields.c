/* libFuzzer entry point for compressed tensor fields: any bytes as a zstd frame, inflated within a
 * limit, then read as a .npy payload as the loader does with `.npy.zst` members and zstd fields. */
#include "core.h"

#include <stdlib.h>
#include <zstd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  void *ctx = NULL;
  dl__buf out = {0};
  size_t len = 0;
  dl__err e = {0};
  enum { LIMIT = 1 << 22 };
  if (dl__zstd_inflate(&ctx, data, size, LIMIT, &out, &len, &e) == 0) {
    if (len > LIMIT || (len && !out.p))
      abort();
    dl__npy a;
    dl__err e2 = {0};
    if (dl__npy_parse(out.p, len, len, &a, &e2) == 0 && a.data + a.bytes > out.p + len)
      abort();
  } else if (!e.code || !e.msg[0]) {
    abort();
  }
  ZSTD_freeDCtx(ctx);
  free(out.p);
  return 0;
}
