/*
 * The checksum of ringfeed shard records: XXH3-64. xxHash picks its vector width when it is
 * compiled, so the same code is built twice (here, and with -mavx2 in checksum_avx2.c) and the
 * AVX2 build is used where the processor has it: on large raw records the checksum is half the
 * worker's time otherwise.
 */
#include "internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t dl__checksum_avx2(const void *p, size_t n);

static uint64_t checksum_default(const void *p, size_t n) { return XXH3_64bits(p, n); }

uint64_t dl__rfs_checksum(const void *p, size_t n) {
#if defined(__x86_64__) && defined(DL_HAVE_AVX2_BUILD)
  static int have_avx2 = -1;
  if (have_avx2 < 0)
    have_avx2 = __builtin_cpu_supports("avx2");
  if (have_avx2)
    return dl__checksum_avx2(p, n);
#endif
  return checksum_default(p, n);
}
