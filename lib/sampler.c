/*
 * Order of samples: a function of (seed, epoch, rank, world_size) alone.
 *
 * Each epoch is a pseudo-random permutation of the dataset (a keyed Feistel network walked back
 * into [0, n), so no table is stored and any position is computed in O(1)). Rank r takes
 * positions off + r, off + r + W, off + r + 2W, ... so after every rank has consumed c batches the
 * consumed positions are exactly the prefix [0, off + c*B*W): a resume token is (epoch, prefix),
 * valid at any world size.
 */
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int64_t dl__permute(uint64_t seed, int64_t epoch, int64_t n, int64_t pos) {
  if (n <= 1)
    return 0;
  int bits = 64 - __builtin_clzll((unsigned long long)(n - 1));
  int half = (bits + 1) / 2;
  uint64_t mask = (1ull << half) - 1;
  uint64_t key = dl__hash3(seed, (uint64_t)epoch, 0x5eed);
  uint64_t x = (uint64_t)pos;
  do {
    uint64_t left = x >> half, right = x & mask;
    for (int round = 0; round < 4; round++) {
      uint64_t f = dl__hash3(key, (uint64_t)round, right) & mask;
      uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= (uint64_t)n);
  return (int64_t)x;
}

static int64_t batches_in(const dl__sampler *s, int64_t off) {
  int64_t per_rank = (s->n - off) / s->world;
  return s->drop_last ? per_rank / s->batch : (per_rank + s->batch - 1) / s->batch;
}

static int parse_token(dl__sampler *s, const char *t) {
  unsigned long long seed, epoch, off, n;
  char tail;
  if (sscanf(t, "rf1.%llu.%llu.%llu.%llu%c", &seed, &epoch, &off, &n, &tail) != 4)
    return dl__fail(DL_ESTATE, "resume token '%s' is malformed (expected rf1.SEED.EPOCH.OFFSET.N)", t);
  if (n != (unsigned long long)s->n)
    return dl__fail(DL_ESTATE, "resume token '%s' is for %llu samples, the source has %" PRId64, t,
                    n, s->n);
  if (seed != s->seed)
    return dl__fail(DL_ESTATE, "resume token '%s' was saved with seed=%llu, not seed=%" PRIu64, t,
                    seed, s->seed);
  if (off > n || epoch > (unsigned long long)INT64_MAX / 4)
    return dl__fail(DL_ESTATE, "resume token '%s' is out of range", t);
  s->start_epoch = (int64_t)epoch;
  s->start_off = (int64_t)off;
  return 0;
}

int dl__sampler_init(dl__sampler *s, int64_t n, int world, int rank, int batch, int drop_last,
                     int shuffle, uint64_t seed, int64_t epochs, const char *resume) {
  memset(s, 0, sizeof *s);
  s->n = n;
  s->world = world;
  s->rank = rank;
  s->batch = batch;
  s->drop_last = drop_last;
  s->shuffle = shuffle;
  s->seed = seed;
  s->epochs = epochs;
  if (resume && *resume) {
    int r = parse_token(s, resume);
    if (r)
      return r;
  }
  s->nb = batches_in(s, 0);
  if (s->nb == 0)
    return dl__fail(DL_ENOSAMPLES,
                    "%" PRId64 " samples give no batch of %d per rank at world_size=%d%s", n, batch,
                    world, drop_last ? " with drop_last=1" : "");
  s->nb_first = batches_in(s, s->start_off);
  if (epochs == 0)
    s->total = -1;
  else if (s->start_epoch >= epochs)
    s->total = 0;
  else
    s->total = s->nb_first + (epochs - 1 - s->start_epoch) * s->nb;
  return 0;
}

void dl__sampler_locate(const dl__sampler *s, int64_t k, int64_t *epoch, int64_t *index, int64_t *off) {
  if (k < s->nb_first) {
    *epoch = s->start_epoch;
    *index = k;
    *off = s->start_off;
    return;
  }
  k -= s->nb_first;
  *epoch = s->start_epoch + 1 + k / s->nb;
  *index = k % s->nb;
  *off = 0;
}

int dl__sampler_batch_len(const dl__sampler *s, int64_t k) {
  int64_t epoch, j, off;
  dl__sampler_locate(s, k, &epoch, &j, &off);
  int64_t per_rank = (s->n - off) / s->world;
  int64_t left = per_rank - j * s->batch;
  return (int)(left < s->batch ? left : s->batch);
}

int64_t dl__sampler_sample(const dl__sampler *s, int64_t k, int i, int64_t *epoch) {
  int64_t j, off;
  dl__sampler_locate(s, k, epoch, &j, &off);
  int64_t pos = off + s->rank + (int64_t)s->world * (j * s->batch + i);
  return s->shuffle ? dl__permute(s->seed, *epoch, s->n, pos) : pos;
}

int dl__sampler_token(const dl__sampler *s, int64_t k, char *buf, size_t cap) {
  int64_t epoch = s->start_epoch, off = s->start_off;
  if (k > 0) {
    int64_t j;
    dl__sampler_locate(s, k - 1, &epoch, &j, &off);
    int64_t in_epoch = epoch == s->start_epoch ? s->nb_first : s->nb;
    if (j + 1 >= in_epoch) {
      epoch++;
      off = 0;
    } else {
      off += (j + 1) * (int64_t)s->batch * s->world;
    }
  }
  int n = snprintf(buf, cap, "rf1.%" PRIu64 ".%" PRId64 ".%" PRId64 ".%" PRId64, s->seed, epoch, off,
                   s->n);
  return n < 0 || (size_t)n >= cap ? -ENOSPC : n;
}
