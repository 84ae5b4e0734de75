/* XXH3-64 compiled for AVX2 (see checksum.c, which calls these only where the processor has AVX2). */
#include "util/util.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t dl__checksum_avx2(const void *p, size_t n);
void dl__hash_update_avx2(void *state, const void *p, size_t n);

uint64_t dl__checksum_avx2(const void *p, size_t n) { return XXH3_64bits(p, n); }

void dl__hash_update_avx2(void *state, const void *p, size_t n) { XXH3_64bits_update(state, p, n); }
