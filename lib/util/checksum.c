/*
 * The checksum of ringfeed shard records: XXH3-64. xxHash picks its vector width when it is
 * compiled, so the same code is built twice (here, and with -mavx2 in checksum_avx2.c) and the
 * AVX2 build is used where the processor has it. The hasher can also copy while it hashes, so a
 * record's tensor data is read from memory once on its way into the batch slot.
 */
#include "util/util.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define COPY_CHUNK (64u << 10) /* small enough to be hashed while still in cache */

uint64_t dl__checksum_avx2(const void *p, size_t n);
void dl__hash_update_avx2(void *state, const void *p, size_t n);

static bool use_avx2(void) {
#if defined(__x86_64__) && defined(DL_HAVE_AVX2_BUILD)
  static _Atomic int have = -1; /* asked first by several threads at once: a first open's index scans */
  int h = atomic_load_explicit(&have, memory_order_relaxed);
  if (h < 0) {
    __builtin_cpu_init();
    atomic_store_explicit(&have, h = __builtin_cpu_supports("avx2") != 0, memory_order_relaxed);
  }
  return h;
#else
  return false;
#endif
}

uint64_t dl__rfs_checksum(const void *p, size_t n) {
#if defined(DL_HAVE_AVX2_BUILD)
  if (use_avx2())
    return dl__checksum_avx2(p, n);
#endif
  return XXH3_64bits(p, n);
}

struct dl__hasher {
  XXH3_state_t state;
};

dl__hasher *dl__hasher_new(void) {
  dl__hasher *h = aligned_alloc(64, (sizeof *h + 63) / 64 * 64);
  if (h)
    XXH3_64bits_reset(&h->state);
  return h;
}

void dl__hasher_free(dl__hasher *h) { free(h); }

void dl__hasher_reset(dl__hasher *h) { XXH3_64bits_reset(&h->state); }

void dl__hasher_update(dl__hasher *h, const void *p, size_t n) {
#if defined(DL_HAVE_AVX2_BUILD)
  if (use_avx2()) {
    dl__hash_update_avx2(&h->state, p, n);
    return;
  }
#endif
  XXH3_64bits_update(&h->state, p, n);
}

void dl__hasher_copy(dl__hasher *h, void *dst, const void *src, size_t n) {
  for (size_t at = 0; at < n; at += COPY_CHUNK) {
    size_t k = n - at < COPY_CHUNK ? n - at : COPY_CHUNK;
    memcpy((uint8_t *)dst + at, (const uint8_t *)src + at, k);
    dl__hasher_update(h, (const uint8_t *)src + at, k);
  }
}

uint64_t dl__hasher_digest(dl__hasher *h) { return XXH3_64bits_digest(&h->state); }
