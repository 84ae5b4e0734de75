/*
 * A JPEG decode that starts at its crop's rows, the rows above stood in for (jpeg_rows.c), gives
 * what a decode that reads every row gives: the same pixels to the bit, or the same error. Over
 * synthetic ImageNet-like files (q90 4:2:0, q96 4:4:4, odd sizes, restart markers) and every JPEG of the
 * third-party test data (DL_TESTDATA), corrupt ones included, at many crops, scales and both channel
 * counts; and the stand-ins are really used. Half the files have their row starts learnt by a
 * walk of the whole scan (dl__jpeg_rows_clean, which the GPU path asks) before their decodes, the
 * others by the decodes and then walked whole.
 * A scan that walk calls clean is one libjpeg reads to its end without finding the data short,
 * and the files whose data is short are not called clean. The device's read of a scan in spans
 * (decode/jpeg_span.h) gives the whole walk's verdict on each of those files, and on damaged
 * copies of them: bytes changed or the data cut short at places spread over the scan (files with
 * restart markers read interval by interval); of a clean one, the row starts a walk notes, and a
 * quarter of the files' crops are decoded from those.
 */
#include "entropy_damaged.h"
#include "core.h"
#include "decode/jpeg_span.h"
#include "test.h"
#include "test_data.h"

#include <ftw.h>
#include <pthread.h>
#include <strings.h>
#include <sys/stat.h>

typedef struct crop {
  double x, y, w, h; /* fractions of the image */
} crop;

static int plan(dl__decode_job *job, int w, int h, dl__err *e) {
  (void)e;
  const crop *c = job->plan_arg;
  job->rect = (dl__rect){c->x * w, c->y * h, c->w * w, c->h * h};
  if (job->rect.w < 1)
    job->rect.w = 1;
  if (job->rect.h < 1)
    job->rect.h = 1;
  return 0;
}

static struct pair *main_pair; /* the single-threaded parts' */
static uint32_t next_sample;
static long decodes, failures, clean, damaged, short_data;

static uint64_t draw(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

/* A pair of decoders: one decodes whole images, the other from their crops' rows. */
typedef struct pair {
  dl__image_decoder whole, rows;
  dl__jpeg_rows *store;
} pair;

static pair *pair_new(dl__jpeg_rows *store) {
  pair *d = calloc(1, sizeof *d);
  ASSERT(d && dl__image_decoder_init(&d->whole) == 0 && dl__image_decoder_init(&d->rows) == 0);
  d->store = store;
  return d;
}

static void pair_free(pair *d) {
  dl__image_decoder_free(&d->whole);
  dl__image_decoder_free(&d->rows);
  free(d);
}

/* The same crop of P, the store's SAMPLE, through both decoders of D: equal results, pixels
 * included. Returns the result. */
static int same(pair *d, const uint8_t *p, size_t n, const char *name, uint32_t sample, const crop *c,
                int out, int ch) {
  dl__decode_job a = {.src = p,
                      .len = n,
                      .channels = ch,
                      .out_w = out,
                      .out_h = out,
                      .max_pixels = 1 << 26,
                      .plan = plan,
                      .plan_arg = (void *)c,
                      .scratch = &d->whole.scratch};
  dl__decode_job b = a;
  b.scratch = &d->rows.scratch;
  b.rows = d->store;
  b.sample = sample;
  dl__err ea = {0}, eb = {0};
  int ra = dl__image_decode_job(&d->whole, &a, &ea), rb = dl__image_decode_job(&d->rows, &b, &eb);
  if (ra != rb || strcmp(ea.msg, eb.msg))
    FAIL_AT("%s crop %.3f,%.3f %.3fx%.3f out %d ch %d: %d \"%s\" as a whole, %d \"%s\" from its rows", name,
            c->x, c->y, c->w, c->h, out, ch, ra, ea.msg, rb, eb.msg);
  if (ra)
    return ra;
  ASSERT_EQ(a.width, b.width);
  ASSERT_EQ(a.height, b.height);
  ASSERT_EQ(a.stride, b.stride);
  ASSERT(a.mapped.x == b.mapped.x && a.mapped.y == b.mapped.y && a.mapped.w == b.mapped.w &&
         a.mapped.h == b.mapped.h);
  for (int y = 0; y < a.height; y++)
    if (memcmp(a.pixels + (size_t)y * a.stride, b.pixels + (size_t)y * b.stride, (size_t)a.width * ch))
      FAIL_AT("%s crop %.3f,%.3f %.3fx%.3f out %d ch %d: row %d of %d differs", name, c->x, c->y, c->w, c->h,
              out, ch, y, a.height);
  return 0;
}

static long span_walks, span_damaged, span_intervals, span_rows_same, span_learnt; /* gpu/walk.cu's reads */
/* Whole files whose blocks share their tables, and the rounds their reads in spans took (before
 * span_blocks, such a scan settled span by span: 254 rounds on average over the synthetic ones). */
static long shared_walks, shared_rounds, shared_worst;

/* The row starts of P's scan as a worker's walk notes them (jpeg_rows.c's walk_rows); how many. */
static uint32_t walked_rows(const uint8_t *p, size_t n, scan *s, row_start *at) {
  size_t e;
  if (scan_open(p, n, s, &e) || s->restart || s->mcu_rows > SPAN_ROWS)
    return 0;
  reader r;
  reader_at(&r, p + e, n - e, 0);
  int32_t dc[3] = {0, 0, 0};
  uint64_t mcu = 0;
  at[0] = (row_start){0, {0, 0, 0}};
  for (uint32_t y = 0; y + 1 < s->mcu_rows; y++) {
    if (walk_row(&r, s, dc, &mcu))
      return 0;
    at[y + 1] = (row_start){tell(&r), {(int16_t)dc[0], (int16_t)dc[1], (int16_t)dc[2]}};
  }
  return s->mcu_rows;
}

/* The device's read of P in spans against the whole walk, both from decode/jpeg_walk.h's steps:
 * the verdict, and a clean scan's row starts. */
static void span_check(const uint8_t *p, size_t n, const char *name, int variant) {
  static scan s;
  static span_room room;
  static row_start rows[SPAN_ROWS], walked[SPAN_ROWS];
  int whole = walk_whole(p, n, &s);
  int spans = span_walk_whole(p, n, &s, &room, rows);
  if (spans != whole)
    FAIL_AT("%s (copy %d): read in spans %d, walked whole %d", name, variant, spans, whole);
  span_walks++;
  span_damaged += spans == 0;
  span_intervals += s.restart != 0;
  if (variant == 0 && s.shared && s.blocks > 1 && !s.restart) {
    shared_walks++;
    shared_rounds += room.rounds;
    shared_worst = room.rounds > shared_worst ? room.rounds : shared_worst;
  }
  uint32_t count = spans == 1 ? walked_rows(p, n, &s, walked) : 0;
  for (uint32_t y = 0; y < count; y++)
    if (rows[y].bit != walked[y].bit || memcmp(rows[y].dc, walked[y].dc, sizeof rows[y].dc))
      FAIL_AT("%s (copy %d): row %u starts at bit %u (DC %d %d %d) read in spans, %u (%d %d %d) walked", name,
              variant, y, rows[y].bit, rows[y].dc[0], rows[y].dc[1], rows[y].dc[2], walked[y].bit,
              walked[y].dc[0], walked[y].dc[1], walked[y].dc[2]);
  span_rows_same += count > 0;
}

/* SAMPLE's row starts as the GPU path keeps them from the device's read (walks_end), for the
 * decodes of its crops that follow. */
static void span_learn(const uint8_t *p, size_t n, uint32_t sample) {
  static scan s;
  static span_room room;
  static row_start rows[SPAN_ROWS];
  if (span_walk_whole(p, n, &s, &room, rows) == 1 && !s.restart && s.mcu_rows <= SPAN_ROWS) {
    dl__jpeg_rows_learn(main_pair->store, sample, p, n, (uint32_t)(room.cut.d - p), rows, s.mcu_rows);
    span_learnt++;
  }
}

/* Damaged copies of P: a byte changed, a few, or the file cut short, at places past its markers. */
static void span_variants(const uint8_t *p, size_t n, const char *name) {
  uint8_t *q = malloc(n);
  ASSERT(q);
  uint64_t seed = n;
  for (int v = 1; v <= 8 && n > 64; v++) {
    memcpy(q, p, n);
    size_t at = n / 5 + draw(&seed) % (n - n / 5), len = n;
    if (v % 3 == 0)
      len = at;
    else
      for (int k = 0; k < (v % 3 == 1 ? 1 : 4); k++, at = n / 5 + draw(&seed) % (n - n / 5))
        q[at] ^= (uint8_t)(1 + draw(&seed) % 255);
    span_check(q, len, name, v);
  }
  free(q);
}

/* The walk the GPU path asks for, against libjpeg reading the whole image; and the device's read
 * of the file in spans against that walk, on the file and on damaged copies of it. */
static void whole_scan(const uint8_t *p, size_t n, const char *name, uint32_t sample) {
  int verdict = dl__jpeg_rows_clean(main_pair->store, sample, p, n, 1 << 26);
  crop whole = {0, 0, 1, 1};
  dl__decode_job j = {.src = p,
                      .len = n,
                      .channels = 3,
                      .out_w = 32,
                      .out_h = 32,
                      .max_pixels = 1 << 26,
                      .plan = plan,
                      .plan_arg = &whole,
                      .scratch = &main_pair->whole.scratch};
  dl__err e = {0};
  bool is_short =
      dl__image_decode_job(&main_pair->whole, &j, &e) == DL_ECORRUPT && strcasestr(e.msg, "premature end");
  if (verdict == 1 && is_short)
    FAIL_AT("%s: the walk calls its scan clean, libjpeg: %s", name, e.msg);
  if (is_entropy_damaged(name))
    ASSERT_EQ(verdict, 0);
  clean += verdict == 1;
  damaged += verdict == 0;
  short_data += is_short;
  ASSERT_EQ(dl__jpeg_rows_clean(main_pair->store, sample, p, n, 1 << 26), verdict); /* kept */
  ASSERT_EQ(dl__jpeg_rows_clean(NULL, 0, p, n, 1 << 26), verdict); /* read again without a store */
  static scan room;
  int walked = walk_whole(p, n, &room);
  if (walked >= 0) {
    ASSERT_EQ(walked, verdict);
    span_check(p, n, name, 0);
    span_variants(p, n, name);
  }
}

/* CROPS crops of one file, as a sample's epochs would draw them: its row starts are learnt by the
 * first decodes and used by the later ones. */
static void file_crops(const uint8_t *p, size_t n, const char *name, int crops, uint64_t seed) {
  static const int outs[] = {224, 64, 24, 8};
  uint32_t sample = next_sample++;
  if (sample % 2)
    whole_scan(p, n, name, sample);
  else if (sample % 4 == 0)
    span_learn(p, n, sample);
  for (int k = 0; k < crops; k++) {
    double w = 0.2 + 0.8 * (double)(draw(&seed) % 1000) / 1000,
           h = 0.2 + 0.8 * (double)(draw(&seed) % 1000) / 1000;
    crop c = {(1 - w) * (double)(draw(&seed) % 1001) / 1000, (1 - h) * (double)(draw(&seed) % 1001) / 1000, w,
              h};
    decodes++;
    failures += same(main_pair, p, n, name, sample, &c, outs[draw(&seed) % 4], draw(&seed) % 3 ? 3 : 1) != 0;
  }
  if (sample % 2 == 0)
    whole_scan(p, n, name, sample);
}

static void synthetic(void) {
  static const synthetic_coding codings[] = {
      {90, 420, 0, 0, 0, 0},     {96, 444, 0, 0, 0, 0},      {90, 420, 333, 251, 0, 0},
      {75, 444, 97, 1200, 0, 0}, {90, 420, 1200, 90, 0, 0},  {95, 420, 40, 33, 0, 0},
      {90, 420, 0, 0, 7, 0},     {96, 444, 333, 251, 64, 0}, {90, 420, 0, 0, 0, 1},
      {96, 444, 0, 0, 0, 1},     {90, 420, 1200, 90, 0, 1},  {90, 420, 0, 0, 7, 1}};
  for (size_t k = 0; k < DL__ARRAY_LEN(codings); k++)
    for (long i = 0; i < 12; i++) {
      unsigned char *jpg;
      unsigned long len;
      ASSERT_EQ(synthetic_jpeg(i + 100 * (long)k, codings[k], &jpg, &len), 0);
      char name[64];
      snprintf(name, sizeof name, "synthetic %zu/%ld", k, i);
      file_crops(jpg, len, name, 40, (uint64_t)k * 1000 + (uint64_t)i);
      free(jpg);
    }
}

static long files;

static int visit(const char *path, const struct stat *st, int type, struct FTW *f) {
  (void)f;
  const char *dot = strrchr(path, '.');
  if (type != FTW_F || !dot || (strcasecmp(dot, ".jpg") && strcasecmp(dot, ".jpeg")) ||
      st->st_size > (64 << 20))
    return 0;
  FILE *fp = fopen(path, "rb");
  ASSERT(fp);
  uint8_t *p = malloc((size_t)st->st_size + 1);
  ASSERT(p);
  size_t n = fread(p, 1, (size_t)st->st_size, fp);
  fclose(fp);
  file_crops(p, n, path, 12, (uint64_t)st->st_size);
  free(p);
  files++;
  return 0;
}

/* Four threads on the same samples at once, as a loader's workers are across an epoch's end: each
 * decode still gives the whole decode's bytes, and the walks the GPU path asks for agree (under
 * ThreadSanitizer in make test). */
enum { SHARED_IMAGES = 6, THREADS = 4 };
static unsigned char *shared_jpg[SHARED_IMAGES];
static unsigned long shared_len[SHARED_IMAGES];
static dl__jpeg_rows *shared_store;

static void *worker(void *arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg;
  pair *d = pair_new(shared_store);
  for (int k = 0; k < 30; k++) {
    uint32_t i = (uint32_t)(draw(&seed) % SHARED_IMAGES);
    double h = 0.2 + 0.6 * (double)(draw(&seed) % 1000) / 1000;
    crop c = {0.1, (1 - h) * (double)(draw(&seed) % 1001) / 1000, 0.8, h};
    if (k % 3 == 0)
      ASSERT_EQ(dl__jpeg_rows_clean(shared_store, i, shared_jpg[i], shared_len[i], 1 << 26), 1);
    ASSERT_EQ(same(d, shared_jpg[i], shared_len[i], "shared", i, &c, 64, 3), 0);
  }
  pair_free(d);
  return NULL;
}

/* A store whose budget holds no record: every decode is a whole one, still the same, and the
 * walk the GPU path asks for still gives its verdict. */
static void no_budget(void) {
  dl__jpeg_rows *none = dl__jpeg_rows_new(4, 16);
  ASSERT(none);
  pair *d = pair_new(none);
  unsigned char *jpg;
  unsigned long len;
  ASSERT_EQ(synthetic_jpeg(7, SYNTHETIC_DEFAULT, &jpg, &len), 0);
  crop c = {0.1, 0.5, 0.8, 0.45};
  ASSERT_EQ(dl__jpeg_rows_clean(none, 0, jpg, len, 1 << 26), 1);
  for (int k = 0; k < 3; k++)
    ASSERT_EQ(same(d, jpg, len, "no budget", 0, &c, 64, 3), 0);
  ASSERT_EQ(dl__jpeg_rows_bytes(none), 0);
  ASSERT_EQ(dl__jpeg_rows_skipped(none), 0);
  printf("a budget of 16 bytes: no row starts kept, the same decodes\n");
  free(jpg);
  pair_free(d);
  dl__jpeg_rows_free(none);
}

static void threads(void) {
  ASSERT((shared_store = dl__jpeg_rows_new(SHARED_IMAGES, 1 << 20)));
  for (int i = 0; i < SHARED_IMAGES; i++)
    ASSERT_EQ(synthetic_jpeg(500 + i, SYNTHETIC_DEFAULT, &shared_jpg[i], &shared_len[i]), 0);
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    ASSERT_EQ(pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1)), 0);
  for (int i = 0; i < THREADS; i++)
    ASSERT_EQ(pthread_join(t[i], NULL), 0);
  printf("threads: %d x 30 decodes of %d shared samples the same\n", THREADS, SHARED_IMAGES);
  ASSERT_GT(dl__jpeg_rows_skipped(shared_store), 0);
  for (int i = 0; i < SHARED_IMAGES; i++)
    free(shared_jpg[i]);
  dl__jpeg_rows_free(shared_store);
}

int main(void) {
  dl__jpeg_rows *store = dl__jpeg_rows_new(100000, 64 << 20);
  ASSERT(store);
  main_pair = pair_new(store);
  threads();
  no_budget();
  /* Under ThreadSanitizer the threads are the point: the rest is the release build's. */
  if (getenv("DL_TEST_THREADS_ONLY"))
    return 0;

  synthetic();
  uint64_t skipped = dl__jpeg_rows_skipped(store);
  ASSERT_GT(clean, 30); /* the synthetic files walked */
  printf("synthetic: %ld decodes the same; %" PRIu64 " rows of MCUs neither walked nor decoded\n", decodes,
         skipped);
  /* A crop's first row is on average a sixth of the way down: most decodes start below row 1. */
  ASSERT_GT(skipped, (uint64_t)decodes);

  const char *testdata = getenv("DL_TESTDATA");
  struct stat st;
  if (testdata && stat(testdata, &st) == 0) {
    long before = decodes;
    ASSERT_EQ(nftw(testdata, visit, 16, FTW_PHYS), 0);
    printf("third-party: %ld files, %ld decodes the same (%ld of all failed alike); %" PRIu64
           " rows neither walked nor decoded\n",
           files, decodes - before, failures, dl__jpeg_rows_skipped(store) - skipped);
    ASSERT_GT(files, 100);
    ASSERT_GT(dl__jpeg_rows_skipped(store), skipped);
  } else {
    printf("third-party test data not found: synthetic files only\n");
  }
  printf("whole scans walked: %ld clean, %ld not (libjpeg found %ld short); read in spans the same, with their "
         "damaged copies: %ld (%ld damaged; %ld of them with restart markers, read interval by interval), the "
         "row starts of %ld the same; %ld files' crops decoded from the spans' row starts\n",
         clean, damaged, short_data, span_walks, span_damaged, span_intervals, span_rows_same, span_learnt);
  ASSERT_GT(span_walks, 100);
  ASSERT_GT(span_damaged, 50);
  ASSERT_GT(span_rows_same, 30);
  ASSERT_GT(span_intervals, 50); /* files with restart markers (synthetic and third-party), and copies */
  ASSERT_GT(span_learnt, 15);
  printf("scans whose blocks share their tables: %ld read in spans, in %.1f rounds on average, %ld at most\n",
         shared_walks, shared_walks ? (double)shared_rounds / (double)shared_walks : 0.0, shared_worst);
  ASSERT_GT(shared_walks, 15);
  ASSERT(shared_rounds <= 8 * shared_walks);
  printf("row index: %" PRIu64 " bytes\n", dl__jpeg_rows_bytes(store));
  pair_free(main_pair);
  dl__jpeg_rows_free(store);
  return 0;
}
