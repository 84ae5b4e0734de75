/*
 * The order of every epoch (sampler.c): a function of (seed, epoch, rank, world_size) only, never
 * of the worker count or timing; the shuffles in blocks of shards and the mix of a source's parts
 * (repeat=); resume tokens.
 */
#ifndef RINGFEED_SAMPLER_H
#define RINGFEED_SAMPLER_H

#include "internal.h"

typedef struct dl__sampler {
  int64_t n;           /* samples in the dataset */
  int world, rank;
  int batch;
  int drop_last, shuffle;
  uint64_t seed;
  int64_t epochs;      /* 0: forever */
  int64_t start_epoch; /* first epoch of this run (resume) */
  int64_t start_off;   /* permutation positions of start_epoch already consumed by all ranks */
  int64_t nb_first;    /* batches in the first epoch for this rank */
  int64_t nb;          /* batches in every later epoch */
  int64_t total;       /* batches in the run, -1 forever */
  uint64_t fingerprint; /* of the dataset (its keys in order), carried by resume tokens */
  int64_t token_block;  /* the shuffle_block a resume token was saved with */
  struct dl__blocks *blocks; /* shuffle_block=K: the two-level order's tables, else NULL */
  const struct dl__mix *mix; /* repeat=: positions run over copies of the source's parts, else NULL */
} dl__sampler;

/* repeat=: an epoch runs over copies of each "::" part of the source. Part P's samples are the
 * dataset's FIRST[P] .. FIRST[P + 1] - 1, its copies the epoch's positions VFIRST[P] ..
 * VFIRST[P + 1] - 1 (round(R x samples) of them: whole copies, then a subset). */
typedef struct dl__mix {
  uint32_t nparts;
  int64_t *first, *vfirst; /* nparts + 1 each */
} dl__mix;
/* The mix of DS's parts under the factors R (NR of them: one per part), or an error naming what
 * does not fit. */
int dl__mix_init(dl__mix *m, const dl__dataset *ds, const double *r, int nr);
void dl__mix_free(dl__mix *m);
/* What the mix adds to a dataset's fingerprint: a token saved under other factors is refused. */
uint64_t dl__mix_fingerprint(const dl__mix *m);

int dl__sampler_init(dl__sampler *s, int64_t n, int world, int rank, int batch, int drop_last,
                     int shuffle, uint64_t seed, int64_t epochs, int64_t start_epoch, const char *resume,
                     uint64_t fingerprint);
/* Shuffles in blocks of K shards (K = 0: over the whole dataset): each epoch permutes the shards,
 * then the samples within each run of K of them. FIRST (NFILES + 1 entries) is where each shard's
 * samples start; they must be grouped by shard. Checks a resume token's block against K. */
int dl__sampler_set_blocks(dl__sampler *s, uint32_t k, uint32_t nfiles, const int64_t *first);
void dl__sampler_free(dl__sampler *s);
/* Batches this rank gets in EPOCH of the run: fewer in a resumed first epoch, 0 outside the run. */
int64_t dl__sampler_epoch_batches(const dl__sampler *s, int64_t epoch);
/* Batch K of the run: its epoch, index within the epoch, and the epoch's start offset. */
void dl__sampler_locate(const dl__sampler *s, int64_t k, int64_t *epoch, int64_t *index, int64_t *off);
int dl__sampler_batch_len(const dl__sampler *s, int64_t k);
/* Dataset index of sample I of batch K, its epoch, and (DRAW, may be NULL) what its random draws
 * are keyed by: its place in the epoch's order of the dataset (of the parts' copies with repeat=,
 * so that two copies of one sample are cropped apart). */
int64_t dl__sampler_sample(const dl__sampler *s, int64_t k, int i, int64_t *epoch, int64_t *draw);
/* Token for the state after batches [0, K) of the run were handed out. */
int dl__sampler_token(const dl__sampler *s, int64_t k, char *buf, size_t cap);
/* The index that position POS of epoch E's permutation holds. */
int64_t dl__permute(uint64_t seed, int64_t epoch, int64_t n, int64_t pos);

#endif /* RINGFEED_SAMPLER_H */
