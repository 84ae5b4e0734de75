/*
 * Order of samples: a function of (seed, epoch, rank, world_size) alone.
 *
 * Each epoch is a pseudo-random permutation of the dataset (a keyed Feistel network walked back
 * into [0, n), so no table is stored and any position is computed in O(1)). Rank r takes
 * positions off + r, off + r + W, off + r + 2W, ... so after every rank has consumed c batches the
 * consumed positions are exactly the prefix [0, off + c*B*W): a resume token is (epoch, prefix),
 * valid at any world size.
 *
 * With shuffle_block=K the permutation has two levels: the epoch's order of shards (a permutation
 * of the shard indices), cut into blocks of K shards, and within each block a permutation of its
 * samples. Positions still run over [0, n), so ranks, tokens and resumes work unchanged, and the
 * ranks together read one block (about K shards) at a time.
 *
 * Lock order: a block table's own mu only (it fills in lazily), never with the loader's.
 */
#include "options.h"
#include "sampler.h"

#include <ctype.h>
#include <pthread.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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

/* Epoch E's layout: the shards in their permuted order and where each block of K starts. */
typedef struct block_epoch {
  int64_t epoch; /* -1: empty */
  uint32_t *order; /* nfiles */
  int64_t *start;  /* nblocks + 1: each block's first position */
} block_epoch;

struct dl__blocks {
  pthread_mutex_t mu; /* workers and the cache's planner look positions up at once */
  uint32_t k, nfiles, nblocks;
  int64_t *first; /* nfiles + 1 */
  block_epoch cache[2]; /* the epochs in use: a run crosses from one into the next */
  int next;             /* the entry replaced next */
};

static void blocks_free(struct dl__blocks *b) {
  if (!b)
    return;
  for (int i = 0; i < 2; i++) {
    free(b->cache[i].order);
    free(b->cache[i].start);
  }
  free(b->first);
  pthread_mutex_destroy(&b->mu);
  free(b);
}

void dl__sampler_free(dl__sampler *s) {
  blocks_free(s->blocks);
  s->blocks = NULL;
}

int dl__sampler_set_blocks(dl__sampler *s, uint32_t k, uint32_t nfiles, const int64_t *first) {
  if (!s->shuffle)
    k = 0; /* in order: no blocks */
  if (s->token_block >= 0 && s->token_block != (int64_t)k)
    return dl__fail(DL_ESTATE, "the resume token was saved with shuffle_block=%" PRId64 ", not shuffle_block=%u",
                    s->token_block, k);
  if (k == 0 || !s->shuffle)
    return 0;
  if (first[nfiles] != s->n)
    return dl__fail(DL_EOPTION, "shuffle_block=%u: the samples are not grouped by shard", k);
  struct dl__blocks *b = calloc(1, sizeof *b);
  if (!b || !(b->first = malloc((nfiles + 1) * sizeof *b->first))) {
    free(b);
    return dl__fail(-ENOMEM, "out of memory");
  }
  pthread_mutex_init(&b->mu, NULL);
  memcpy(b->first, first, (nfiles + 1) * sizeof *first);
  b->k = k;
  b->nfiles = nfiles;
  b->nblocks = (nfiles + k - 1) / k;
  for (int i = 0; i < 2; i++) {
    b->cache[i].epoch = -1;
    b->cache[i].order = malloc((nfiles ? nfiles : 1) * sizeof *b->cache[i].order);
    b->cache[i].start = malloc((b->nblocks + 1) * sizeof *b->cache[i].start);
    if (!b->cache[i].order || !b->cache[i].start) {
      blocks_free(b);
      return dl__fail(-ENOMEM, "out of memory");
    }
  }
  s->blocks = b;
  return 0;
}

/* EPOCH's layout, computed into the older cache entry when it is not there (b->mu held). */
static const block_epoch *epoch_layout(const dl__sampler *s, struct dl__blocks *b, int64_t epoch) {
  for (int i = 0; i < 2; i++)
    if (b->cache[i].epoch == epoch)
      return &b->cache[i];
  block_epoch *e = &b->cache[b->next];
  b->next ^= 1;
  uint64_t key = dl__hash3(s->seed, 0xb10c, 1);
  e->start[0] = 0;
  for (uint32_t i = 0; i < b->nfiles; i++) {
    uint32_t f = (uint32_t)dl__permute(key, epoch, b->nfiles, i);
    e->order[i] = f;
    if (i % b->k == 0)
      e->start[i / b->k + 1] = e->start[i / b->k];
    e->start[i / b->k + 1] += b->first[f + 1] - b->first[f];
  }
  e->epoch = epoch;
  return e;
}

static int64_t block_sample(const dl__sampler *s, int64_t epoch, int64_t pos) {
  struct dl__blocks *b = s->blocks;
  pthread_mutex_lock(&b->mu);
  const block_epoch *e = epoch_layout(s, b, epoch);
  uint32_t lo = 0, hi = b->nblocks; /* the block holding POS: start[lo] <= pos < start[lo + 1] */
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (e->start[mid] <= pos)
      lo = mid;
    else
      hi = mid;
  }
  int64_t r = dl__permute(dl__hash3(s->seed, 0xb10c, 2 + lo), epoch, e->start[lo + 1] - e->start[lo],
                          pos - e->start[lo]);
  int64_t at = -1;
  for (uint32_t i = lo * b->k; i < b->nfiles && at < 0; i++) {
    uint32_t f = e->order[i];
    int64_t count = b->first[f + 1] - b->first[f];
    if (r < count)
      at = b->first[f] + r;
    r -= count;
  }
  pthread_mutex_unlock(&b->mu);
  return at;
}

static int64_t batches_in(const dl__sampler *s, int64_t off) {
  int64_t per_rank = (s->n - off) / s->world;
  return s->drop_last ? per_rank / s->batch : (per_rank + s->batch - 1) / s->batch;
}

/* The next '.'-separated field of T as an unsigned decimal: digits only, no sign, no overflow. */
static bool field(const char **t, uint64_t *out, bool last) {
  const char *p = *t;
  uint64_t v = 0;
  if (!isdigit((unsigned char)*p))
    return false;
  for (; isdigit((unsigned char)*p); p++)
    if (!dl__mul_ok(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*p - '0'), &v))
      return false;
  if (last ? *p != 0 && *p != '.' : *p != '.')
    return false;
  *t = *p ? p + 1 : p;
  *out = v;
  return true;
}

/* rf2.SEED.EPOCH.OFFSET.N.FINGERPRINT (hex), then .bK when saved with shuffle_block=K and .sS with
 * the shuffle it was saved with (tokens before .sS are not checked for it), or the older rf1
 * without the fingerprint. */
static int parse_token(dl__sampler *s, const char *t, int *shuffle) {
  uint64_t seed, epoch, off, n, fp = 0;
  bool v2 = !strncmp(t, "rf2.", 4), v1 = !strncmp(t, "rf1.", 4);
  const char *p = t + 4;
  bool ok = (v1 || v2) && field(&p, &seed, false) && field(&p, &epoch, false) && field(&p, &off, false) &&
            field(&p, &n, v1);
  uint64_t block = 0, shuffled = 2;
  *shuffle = -1;
  if (ok && v2) {
    char *end;
    const char *dot = strchr(p, '.');
    size_t fp_len = dot ? (size_t)(dot - p) : strlen(p);
    ok = isxdigit((unsigned char)*p) && fp_len == 16;
    fp = ok ? strtoull(p, &end, 16) : 0;
    ok = ok && end == p + 16;
    if (ok && dot && dot[1] == 'b') {
      p = dot + 2;
      ok = field(&p, &block, true) && block > 0 && block <= UINT32_MAX;
      dot = ok && p[-1] == '.' ? p - 1 : NULL;
    }
    if (ok && dot) {
      p = dot + 2;
      ok = dot[1] == 's' && field(&p, &shuffled, true) && *p == 0 && shuffled <= 1;
      *shuffle = (int)shuffled;
    }
  } else if (ok) {
    ok = *p == 0;
  }
  if (!ok)
    return dl__fail(DL_ESTATE, "resume token '%s' is malformed (expected rf2.SEED.EPOCH.OFFSET.N.FINGERPRINT[.bK].sS)", t);
  if (n != (uint64_t)s->n)
    return dl__fail(DL_ESTATE, "resume token '%s' is for %" PRIu64 " samples, the source has %" PRId64, t, n,
                    s->n);
  if (v2 && fp != s->fingerprint)
    return dl__fail(DL_ESTATE, "resume token '%s' was saved over another dataset (its samples' keys differ)", t);
  if (seed != s->seed)
    return dl__fail(DL_ESTATE, "resume token '%s' was saved with seed=%" PRIu64 ", not seed=%" PRIu64, t, seed,
                    s->seed);
  if (*shuffle >= 0 && *shuffle != !!s->shuffle)
    return dl__fail(DL_ESTATE, "resume token '%s' was saved with shuffle=%d, not shuffle=%d: the samples "
                    "it counts as done are others", t, *shuffle, !!s->shuffle);
  if (off > n || epoch > (uint64_t)INT64_MAX / 4)
    return dl__fail(DL_ESTATE, "resume token '%s' is out of range", t);
  if (v1)
    dl__log(DL__LOG_WARN, "resume token '%s' predates dataset fingerprints: it is not checked against the source", t);
  s->start_epoch = (int64_t)epoch;
  s->start_off = (int64_t)off;
  s->token_block = (int64_t)block;
  return 0;
}

int dl__sampler_init(dl__sampler *s, int64_t n, int world, int rank, int batch, int drop_last,
                     int shuffle, uint64_t seed, int64_t epochs, int64_t start_epoch, const char *resume,
                     uint64_t fingerprint) {
  memset(s, 0, sizeof *s);
  s->fingerprint = fingerprint;
  s->n = n;
  s->world = world;
  s->rank = rank;
  s->batch = batch;
  s->drop_last = drop_last;
  s->shuffle = shuffle;
  s->seed = seed;
  s->epochs = epochs;
  s->start_epoch = start_epoch;
  s->token_block = -1;
  if (resume && *resume) {
    int shuffled;
    int r = parse_token(s, resume, &shuffled);
    if (r)
      return r;
  }
  s->nb = batches_in(s, 0);
  if (s->nb == 0)
    return dl__fail(DL_ENOSAMPLES,
                    "%" PRId64 " samples give no batch of %d per rank at world_size=%d%s", n, batch,
                    world, drop_last ? " with drop_last=1" : "");
  s->nb_first = batches_in(s, s->start_off);
  int64_t later;
  if (epochs == 0)
    s->total = -1;
  else if (s->start_epoch >= epochs)
    s->total = 0;
  else if (__builtin_mul_overflow(epochs - 1 - s->start_epoch, s->nb, &later) ||
           __builtin_add_overflow(later, s->nb_first, &s->total))
    s->total = -1; /* more batches than a 64-bit count holds: as good as forever */
  return 0;
}

int64_t dl__sampler_epoch_batches(const dl__sampler *s, int64_t epoch) {
  if (epoch < s->start_epoch || (s->epochs && epoch >= s->epochs))
    return 0;
  return epoch == s->start_epoch ? s->nb_first : s->nb;
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

/* The dataset index of copy position V of EPOCH under repeat=. */
static int64_t mix_sample(const dl__sampler *s, int64_t epoch, int64_t v) {
  const dl__mix *m = s->mix;
  uint32_t lo = 0, hi = m->nparts; /* the part whose copies hold V: the last starting at or before it */
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (m->vfirst[mid] <= v)
      lo = mid;
    else
      hi = mid;
  }
  int64_t n = m->first[lo + 1] - m->first[lo], j = v - m->vfirst[lo];
  if (!s->shuffle)
    return m->first[lo] + j % n;
  /* Each copy is a permutation of its own, so a part's last, partial copy is another subset of
   * its samples every epoch. */
  return m->first[lo] + dl__permute(dl__hash3(s->seed, lo, (uint64_t)(j / n)), epoch, n, j % n);
}

int64_t dl__sampler_sample(const dl__sampler *s, int64_t k, int i, int64_t *epoch, int64_t *draw) {
  int64_t j, off;
  dl__sampler_locate(s, k, epoch, &j, &off);
  int64_t pos = off + s->rank + (int64_t)s->world * (j * s->batch + i);
  int64_t v = !s->shuffle ? pos : s->blocks ? block_sample(s, *epoch, pos) : dl__permute(s->seed, *epoch, s->n, pos);
  if (draw)
    *draw = v;
  return s->mix ? mix_sample(s, *epoch, v) : v;
}

int dl__mix_init(dl__mix *m, const dl__dataset *ds, const double *r, int nr) {
  *m = (dl__mix){0};
  if ((uint32_t)nr != ds->nparts)
    return dl__fail(DL_EOPTION, "option repeat= gives %d factor%s for a source of %u part%s (one for each "
                    "'::'-separated part)", nr, nr == 1 ? "" : "s", ds->nparts, ds->nparts == 1 ? "" : "s");
  m->first = malloc((ds->nparts + 1) * sizeof *m->first);
  m->vfirst = malloc((ds->nparts + 1) * sizeof *m->vfirst);
  if (!m->first || !m->vfirst) {
    dl__mix_free(m);
    return dl__fail(-ENOMEM, "out of memory");
  }
  m->nparts = ds->nparts;
  m->first[0] = m->vfirst[0] = 0;
  for (uint32_t p = 0; p < m->nparts; p++) {
    int64_t n = ds->part_first[p + 1] - ds->part_first[p];
    m->first[p + 1] = ds->part_first[p + 1];
    m->vfirst[p + 1] = m->vfirst[p] + llround(r[p] * (double)n);
  }
  if (m->vfirst[m->nparts] == 0) {
    char given[DL__MAX_PARTS * 8] = "";
    for (int p = 0; p < nr && strlen(given) + 24 < sizeof given; p++)
      snprintf(given + strlen(given), sizeof given - strlen(given), "%s%g", p ? "," : "", r[p]);
    dl__mix_free(m);
    return dl__fail(DL_ENOSAMPLES, "option repeat=%s: no sample is seen at these factors (each part's "
                    "factor times its samples rounds to 0)", given);
  }
  return 0;
}

void dl__mix_free(dl__mix *m) {
  free(m->first);
  free(m->vfirst);
  *m = (dl__mix){0};
}

uint64_t dl__mix_fingerprint(const dl__mix *m) {
  uint64_t h = 0x6d6978;
  for (uint32_t p = 0; p <= m->nparts; p++)
    h = dl__hash3(h, (uint64_t)m->first[p], (uint64_t)m->vfirst[p]);
  return h;
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
  char block[16] = "";
  if (s->blocks)
    snprintf(block, sizeof block, ".b%u", s->blocks->k);
  int n = snprintf(buf, cap, "rf2.%" PRIu64 ".%" PRId64 ".%" PRId64 ".%" PRId64 ".%016" PRIx64 "%s.s%d", s->seed,
                   epoch, off, s->n, s->fingerprint, block, !!s->shuffle);
  return n < 0 || (size_t)n >= cap ? -ENOSPC : n;
}
