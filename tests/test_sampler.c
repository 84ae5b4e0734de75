/* Epoch permutations, rank splits and resume tokens, at any world size. */
#include "core.h"
#include "test.h"

static void check_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  char *seen = calloc((size_t)n, 1);
  for (int64_t i = 0; i < n; i++) {
    int64_t v = dl__permute(seed, epoch, n, i);
    ASSERT(v >= 0 && v < n);
    ASSERT_EQ(seen[v], 0);
    seen[v] = 1;
  }
  free(seen);
}

/* Samples of a whole run for one rank, in order, and the run's batch count. */
static int64_t run(dl__sampler *s, int64_t *out, int64_t cap) {
  int64_t n = 0;
  for (int64_t k = 0; s->total < 0 || k < s->total; k++) {
    int len = dl__sampler_batch_len(s, k);
    for (int i = 0; i < len; i++) {
      int64_t epoch;
      ASSERT_LT(n, cap);
      out[n++] = dl__sampler_sample(s, k, i, &epoch, NULL);
    }
  }
  return n;
}

/* shuffle_block: shards of uneven sizes (one empty), blocks of K. */
static void check_blocks(void) {
  enum { F = 11, K = 3, B = 8 };
  int64_t first[F + 1] = {0};
  for (int f = 0; f < F; f++)
    first[f + 1] = first[f] + (f == 4 ? 0 : 20 + 7 * f);
  const int64_t n = first[F];
  int64_t *shard = malloc((size_t)n * sizeof *shard);
  for (int f = 0; f < F; f++)
    for (int64_t i = first[f]; i < first[f + 1]; i++)
      shard[i] = f;
  for (int64_t epoch = 0; epoch < 3; epoch++) {
    dl__sampler s;
    ASSERT_EQ(dl__sampler_init(&s, n, 1, 0, B, 0, 1, 5, 3, 0, NULL, 0), 0);
    ASSERT_EQ(dl__sampler_set_blocks(&s, K, F, first), 0);
    /* Every epoch is a permutation; consecutive positions stay within K shards until the block
     * ends, and every block (but the last) spans K shards. */
    char *seen = calloc((size_t)n, 1);
    int blocks = 0, in_block = 0;
    int64_t block_shards[F];
    for (int64_t pos = 0; pos < n; pos++) {
      int64_t k = pos / B, e;
      int64_t v = dl__sampler_sample(&s, k + epoch * s.nb, (int)(pos % B), &e, NULL);
      ASSERT_EQ(e, epoch);
      ASSERT(v >= 0 && v < n);
      ASSERT_EQ(seen[v], 0);
      seen[v] = 1;
      bool known = false;
      for (int j = 0; j < in_block; j++)
        known |= block_shards[j] == shard[v];
      if (!known) {
        if (in_block == K) {
          blocks++;
          in_block = 0;
        }
        block_shards[in_block++] = shard[v];
      }
    }
    /* 10 shards with samples in blocks of 3 shards of 11: at most 4 blocks, at least 3 changes. */
    ASSERT(blocks >= 2 && blocks <= 3);
    free(seen);
    /* Not the global order, and another epoch's order differs. */
    int64_t e;
    int same = 0;
    for (int i = 0; i < B; i++)
      same += dl__sampler_sample(&s, 0, i, &e, NULL) == dl__permute(5, 0, n, i);
    ASSERT_LT(same, B);
    dl__sampler_free(&s);
  }
  /* Tokens carry K: the rest of the run resumes exactly with the same K and is refused with another. */
  dl__sampler a, b;
  ASSERT_EQ(dl__sampler_init(&a, n, 2, 1, B, 0, 1, 5, 2, 0, NULL, 0), 0);
  ASSERT_EQ(dl__sampler_set_blocks(&a, K, F, first), 0);
  char tok[128];
  ASSERT_GT(dl__sampler_token(&a, 9, tok, sizeof tok), 0);
  ASSERT(strstr(tok, ".b3.s1") != NULL);
  ASSERT_EQ(dl__sampler_init(&b, n, 2, 1, B, 0, 1, 5, 2, 0, tok, 0), 0);
  ASSERT_EQ(dl__sampler_set_blocks(&b, K, F, first), 0);
  ASSERT_EQ(b.total, a.total - 9);
  for (int64_t k = 0; k < b.total; k++)
    for (int i = 0; i < dl__sampler_batch_len(&b, k); i++) {
      int64_t e1, e2;
      ASSERT_EQ(dl__sampler_sample(&b, k, i, &e1, NULL), dl__sampler_sample(&a, k + 9, i, &e2, NULL));
    }
  dl__sampler_free(&b);
  ASSERT_EQ(dl__sampler_init(&b, n, 2, 1, B, 0, 1, 5, 2, 0, tok, 0), 0);
  ASSERT_EQ(dl__sampler_set_blocks(&b, 4, F, first), DL_ESTATE);
  ASSERT(strstr(dl_last_error(), "shuffle_block=3") != NULL);
  ASSERT_EQ(dl__sampler_set_blocks(&b, 0, F, first), DL_ESTATE);
  /* A global-shuffle token is refused by a block-shuffled loader. */
  ASSERT_GT(dl__sampler_token(&b, 0, tok, sizeof tok), 0);
  dl__sampler c;
  ASSERT_EQ(dl__sampler_init(&c, n, 1, 0, B, 0, 1, 5, 2, 0, "rf2.5.0.16.400.0000000000000000", 0), DL_ESTATE);
  char global[128];
  snprintf(global, sizeof global, "rf2.5.0.16.%lld.0000000000000000", (long long)n);
  ASSERT_EQ(dl__sampler_init(&c, n, 1, 0, B, 0, 1, 5, 2, 0, global, 0), 0);
  ASSERT_EQ(dl__sampler_set_blocks(&c, K, F, first), DL_ESTATE);
  /* Malformed block suffixes. */
  const char *bad[] = {".b", ".b0", ".bx", ".b3x", ".c3", ".b-1", ".s", ".s2", ".b3.s", ".s1.b3", ".b3.s1x", ".b3.s1.s1"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    snprintf(global, sizeof global, "rf2.5.0.16.%lld.0000000000000000%s", (long long)n, bad[i]);
    ASSERT_EQ(dl__sampler_init(&c, n, 1, 0, B, 0, 1, 5, 2, 0, global, 0), DL_ESTATE);
  }
  dl__sampler_free(&a);
  free(shard);
}

int main(void) {
  check_blocks();
  for (int64_t n = 1; n < 300; n += 37)
    check_permutation(n, 5, 1);
  check_permutation(100003, 9, 0);
  /* Different epochs and seeds give different orders. */
  int same = 0;
  for (int i = 0; i < 100; i++)
    same += dl__permute(1, 0, 1000, i) == dl__permute(1, 1, 1000, i);
  ASSERT_LT(same, 10);

  /* Ranks: disjoint, equal batch counts, together all but n % W samples. */
  enum { N = 1003, B = 10 };
  for (int W = 1; W <= 8; W++) {
    char *seen = calloc(N, 1);
    int64_t total = -1, buf[N];
    for (int r = 0; r < W; r++) {
      dl__sampler s;
      ASSERT_EQ(dl__sampler_init(&s, N, W, r, B, 0, 1, 7, 1, 0, NULL, 0), 0);
      if (total < 0)
        total = s.total;
      ASSERT_EQ(s.total, total);
      int64_t got = run(&s, buf, N);
      ASSERT_EQ(got, N / W);
      for (int64_t i = 0; i < got; i++) {
        ASSERT_EQ(seen[buf[i]], 0);
        seen[buf[i]] = 1;
      }
    }
    free(seen);
  }

  /* Resume at the same and at other world sizes: the rest of the epoch, nothing lost or repeated. */
  for (int W = 1; W <= 4; W++)
    for (int W2 = 1; W2 <= 4; W2++) {
      dl__sampler s;
      ASSERT_EQ(dl__sampler_init(&s, N, W, 0, B, 0, 1, 3, 2, 0, NULL, 0), 0);
      int64_t c = 7; /* batches every rank consumed */
      char tok[128];
      ASSERT_GT(dl__sampler_token(&s, c, tok, sizeof tok), 0);
      char *seen = calloc(N, 1);
      int64_t before = 0;
      for (int r = 0; r < W; r++) {
        dl__sampler sr;
        dl__sampler_init(&sr, N, W, r, B, 0, 1, 3, 2, 0, NULL, 0);
        for (int64_t k = 0; k < c; k++)
          for (int i = 0; i < dl__sampler_batch_len(&sr, k); i++) {
            int64_t e, v = dl__sampler_sample(&sr, k, i, &e, NULL);
            ASSERT_EQ(seen[v], 0);
            seen[v] = 1;
            before++;
          }
      }
      int64_t after = 0;
      for (int r = 0; r < W2; r++) {
        dl__sampler s2;
        ASSERT_EQ(dl__sampler_init(&s2, N, W2, r, B, 0, 1, 3, 2, 0, tok, 0), 0);
        ASSERT_EQ(s2.start_epoch, 0);
        for (int64_t k = 0; k < s2.nb_first; k++)
          for (int i = 0; i < dl__sampler_batch_len(&s2, k); i++) {
            int64_t e, v = dl__sampler_sample(&s2, k, i, &e, NULL);
            ASSERT_EQ(e, 0);
            ASSERT_EQ(seen[v], 0);
            seen[v] = 1;
            after++;
          }
      }
      /* Only the remainder that cannot be split evenly over W2 ranks is left out. */
      ASSERT_EQ(before + after, N - (N - before) % W2);
      free(seen);
      if (W == W2) {
        /* At the same world size the resumed stream is exactly the rest of the original. */
        dl__sampler a, b;
        dl__sampler_init(&a, N, W, W - 1, B, 0, 1, 3, 2, 0, NULL, 0);
        dl__sampler_init(&b, N, W, W - 1, B, 0, 1, 3, 2, 0, tok, 0);
        ASSERT_EQ(b.total, a.total - c);
        for (int64_t k = 0; k < b.total; k++) {
          ASSERT_EQ(dl__sampler_batch_len(&b, k), dl__sampler_batch_len(&a, k + c));
          for (int i = 0; i < dl__sampler_batch_len(&b, k); i++) {
            int64_t e1, e2;
            ASSERT_EQ(dl__sampler_sample(&b, k, i, &e1, NULL), dl__sampler_sample(&a, k + c, i, &e2, NULL));
            ASSERT_EQ(e1, e2);
          }
        }
      }
    }

  /* A token at an epoch's end moves to the next epoch; bad tokens are refused with reasons. */
  dl__sampler s;
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 0, 0, 3, 0, NULL, 0), 0);
  char tok[128];
  dl__sampler_token(&s, 10, tok, sizeof tok);
  ASSERT_STR_EQ(tok, "rf2.0.1.0.100.0000000000000000.s0");
  dl__sampler_token(&s, 3, tok, sizeof tok);
  ASSERT_STR_EQ(tok, "rf2.0.0.30.100.0000000000000000.s0");
  /* The shuffle is in the token: the prefix it counts as done is of that order, so a token of the
   * shuffled order resumed in file order (or back) would skip samples never seen and repeat
   * others. Tokens from before .sS are taken as they are. */
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 1, 0, 3, 0, tok, 0), DL_ESTATE);
  ASSERT_CONTAINS(dl_last_error(), "shuffle=0, not shuffle=1");
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 0, 0, 3, 0, "rf2.0.0.30.100.0000000000000000.s1", 0), DL_ESTATE);
  ASSERT_CONTAINS(dl_last_error(), "shuffle=1, not shuffle=0");
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 1, 0, 3, 0, "rf2.0.0.30.100.0000000000000000.s1", 0), 0);
  ASSERT_EQ(s.start_off, 30);
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 1, 0, 3, 0, "rf2.0.0.30.100.0000000000000000", 0), 0);
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 0, 0, 3, 0, "rf2.0.0.30.99.0000000000000000", 0), DL_ESTATE);
  ASSERT_CONTAINS(dl_last_error(), "99 samples");
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 0, 5, 3, 0, "rf2.0.0.30.100.0000000000000000", 0), DL_ESTATE);
  ASSERT_CONTAINS(dl_last_error(), "seed=0");
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 0, 0, 3, 0, "garbage", 0), DL_ESTATE);
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 0, 0, 3, 0, "rf2.0.0.30.100.0000000000000000x", 0), DL_ESTATE);
  /* Tokens of another dataset of the same size, with signs, or with wrapped numbers: refused. */
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 0, 0, 3, 0, "rf2.0.0.30.100.00000000000000ab", 0), DL_ESTATE);
  ASSERT_CONTAINS(dl_last_error(), "another dataset");
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 0, 0, 3, 0, "rf2.0.0.+30.100.0000000000000000", 0), DL_ESTATE);
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 0, 0, 3, 0, "rf2.0.0.-18446744073709551586.100.0000000000000000", 0),
            DL_ESTATE);
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 0, 0, 3, 0, "rf2.0.0.18446744073709551646.100.0000000000000000", 0),
            DL_ESTATE);
  /* start_epoch: the run begins there; epochs outside the run have no batches. A resumed first
   * epoch has fewer. */
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 1, 0, 5, 2, NULL, 0), 0);
  ASSERT_EQ(s.total, 30);
  int64_t first_epoch, ix, off;
  dl__sampler_locate(&s, 0, &first_epoch, &ix, &off);
  ASSERT_EQ(first_epoch, 2);
  ASSERT_EQ(dl__sampler_epoch_batches(&s, 1), 0);
  ASSERT_EQ(dl__sampler_epoch_batches(&s, 2), 10);
  ASSERT_EQ(dl__sampler_epoch_batches(&s, 4), 10);
  ASSERT_EQ(dl__sampler_epoch_batches(&s, 5), 0);
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 1, 0, 5, 0, "rf2.0.3.40.100.0000000000000000", 0), 0);
  ASSERT_EQ(dl__sampler_epoch_batches(&s, 3), 6);
  ASSERT_EQ(dl__sampler_epoch_batches(&s, 4), 10);
  ASSERT_EQ(s.total, 16);
  /* The older rf1 tokens (no fingerprint) still resume. */
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 10, 0, 0, 0, 3, 0, "rf1.0.0.30.100", 7), 0);
  ASSERT_EQ(s.start_off, 30);
  /* Epochs past what a 64-bit batch count holds run as if forever, instead of wrapping. */
  ASSERT_EQ(dl__sampler_init(&s, 100, 1, 0, 1, 0, 0, 0, 4611686018427387903ll, 0, NULL, 0), 0);
  ASSERT_EQ(s.total, -1);
  /* shuffle=0 keeps index order; epochs=0 runs forever; drop_last drops the partial batch. */
  ASSERT_EQ(dl__sampler_init(&s, 95, 1, 0, 10, 0, 0, 0, 0, 0, NULL, 0), 0);
  ASSERT_EQ(s.total, -1);
  int64_t e;
  ASSERT_EQ(dl__sampler_sample(&s, 3, 4, &e, NULL), 34);
  ASSERT_EQ(dl__sampler_sample(&s, 12, 0, &e, NULL), 20);
  ASSERT_EQ(e, 1);
  ASSERT_EQ(dl__sampler_batch_len(&s, 9), 5);
  ASSERT_EQ(dl__sampler_init(&s, 95, 1, 0, 10, 1, 0, 0, 1, 0, NULL, 0), 0);
  ASSERT_EQ(s.total, 9);
  ASSERT_EQ(dl__sampler_init(&s, 5, 1, 0, 10, 1, 0, 0, 1, 0, NULL, 0), DL_ENOSAMPLES);
  printf("sampler: ok\n");
  return 0;
}
