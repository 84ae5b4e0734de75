/*
 * The host's side of JPEG decoding on the GPU, which runs without a GPU:
 * - every JPEG of the third-party test data that the workers would hand to nvJPEG decodes on the
 *   CPU without complaint (so a file libjpeg rejects is never a GPU sample: it stays on the CPU,
 *   which names it as it always has), and the usual suspects go where they should (progressive
 *   to the CUDA decoder, arithmetic, 12-bit, CMYK, truncated files and sound markers around
 *   damaged entropy-coded data to the CPU, those of several scans even with gpu_check=0); with
 *   the devices reading scans (gpu/walk.cu), the engine's files go unread, and the device's
 *   walker finds damaged every one of them the CPU fails;
 * - the region the engine decodes holds the crop and its filter's reach, on the 16-pixel grid;
 * - decode=gpu and decode=hybrid without a GPU fail at open with DL_ENODEVICE and the reason;
 *   decode=auto decodes on the CPU and says so in the stats; a missing nvJPEG is named;
 * - hybrid's split: the workers take the samples whose crops end highest in their images (spread
 *   evenly over the batch where all crops end alike), and the split moves a step toward the
 *   balance of the two sides' measured rates only after three batches agree.
 */
#include "gpu/gpu.h"
#include "gpu/nvjpeg.h"
#include "core.h"
#include "decode/jpeg_span.h"
#include "ringfeed.h"
#include "entropy_damaged.h"
#include "test.h"

#include <dlfcn.h>
#include <ftw.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

static dl_loader l;
static dl_batch slot;
static dl__gpu_job jobs[1];
static uint8_t *arena;
static dl__image_decoder cpu;
static int seen, to_engine, to_cuda, to_cpu, cpu_ok_only, entropy_faults, read_on_device, damaged_on_device;

static uint8_t *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *p = len > 0 ? malloc((size_t)len) : NULL;
  if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
    free(p);
    p = NULL;
  }
  fclose(f);
  *n = (size_t)len;
  return p;
}

/* Where the workers would send this file, the dataset's sample INDEX, with and without JPEG
 * engines (and without the device's reads of scans, unless a test sets l.gpu_walk). */
static int route(const uint8_t *p, size_t n, bool engines, uint64_t key, int64_t index) {
  l.gpu_hw = engines;
  memcpy(arena, p, n);
  if (!dl__gpu_plan(&l, &slot, 0, index, arena, arena, n, key))
    return 0;
  return jobs[0].engine;
}

/* With the devices reading scans (gpu/walk.cu), as a first run on a card with JPEG engines: the
 * engines' single-scan files go to the GPU unread, and the device's read in spans (the steps of
 * decode/jpeg_span.h, compiled for it; a file it leaves is read on the CPU after) must then find
 * damaged every one the CPU fails, which is then decoded on the CPU. Any other file goes where it
 * went (WITH). */
static void device_read(const char *path, const uint8_t *p, size_t n, uint64_t key, int with) {
  static int64_t index = 1 << 24; /* samples no verdict is kept for */
  l.gpu_walk = true;
  int unread = route(p, n, true, key, index++);
  l.gpu_walk = false;
  if (!unread || !jobs[0].walk) {
    ASSERT_EQ(unread, with);
    return;
  }
  ASSERT_EQ(unread, DL__GPU_ENGINE_HW);
  static scan tables;
  static span_room room;
  int verdict = span_walk_whole(p, n, &tables, &room, NULL);
  if (verdict < 0)
    verdict = dl__jpeg_rows_clean(NULL, 0, p, n, 1 << 26); /* walks_end: the CPU reads it */
  ASSERT_EQ(verdict, dl__jpeg_rows_clean(NULL, 0, p, n, 1 << 26)); /* what a worker would have found */
  dl__err e = {0};
  uint8_t *out = malloc(l.sample_bytes);
  bool cpu_fails =
      dl__image_decode(&cpu, &l.image_spec, p, n, DL__CODEC_JPEG, key, dl__sample_flip(&l, key), 0, out, &e) != 0;
  free(out);
  if (cpu_fails && verdict == 1)
    FAIL_AT("%s: the CPU says \"%s\", yet the device's walk finds its scan clean", path, e.msg);
  if (is_entropy_damaged(path))
    ASSERT_EQ(verdict, 0);
  read_on_device++;
  damaged_on_device += verdict != 1;
}

static int visit(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  (void)ftw;
  if (type != FTW_F || st->st_size < 4 || st->st_size > (16 << 20))
    return 0;
  size_t n;
  uint8_t *p = read_file(path, &n);
  if (!p || p[0] != 0xFF || p[1] != 0xD8) {
    free(p);
    return 0;
  }
  seen++;
  uint64_t key = (uint64_t)seen * 7919;
  int with = route(p, n, true, key, seen), without = route(p, n, false, key, seen);
  entropy_faults += is_entropy_damaged(path);
  if (with || without) {
    /* The GPU may take it: libjpeg, the judge of every file, must find nothing wrong with it. */
    dl__err e = {0};
    uint8_t *out = malloc(l.sample_bytes);
    if (dl__image_decode(&cpu, &l.image_spec, p, n, DL__CODEC_JPEG, key, dl__sample_flip(&l, key), 0, out, &e))
      FAIL_AT("%s goes to the GPU, but the CPU says: %s", path, e.msg);
    free(out);
    ASSERT_EQ(jobs[0].index, seen);
    ASSERT_EQ(jobs[0].len, n);
    ASSERT_EQ(jobs[0].at, 0);
  } else {
    dl__err e = {0};
    uint8_t *out = malloc(l.sample_bytes);
    if (dl__image_decode(&cpu, &l.image_spec, p, n, DL__CODEC_JPEG, key, dl__sample_flip(&l, key), 0, out, &e) == 0)
      cpu_ok_only++; /* fine on the CPU, unusual enough to stay there */
    free(out);
  }
  to_engine += with == DL__GPU_ENGINE_HW;
  to_cuda += with == DL__GPU_ENGINE_CUDA;
  to_cpu += !with;
  if (with == DL__GPU_ENGINE_HW)
    ASSERT_EQ(without, DL__GPU_ENGINE_CUDA); /* without engines the CUDA decoder takes the same */
  device_read(path, p, n, key, with);
  free(p);
  return 0;
}

static int route_file(const char *testdata, const char *rel, bool engines) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", testdata, rel);
  size_t n;
  uint8_t *p = read_file(path, &n);
  if (!p)
    FAIL_AT("cannot read %s", path);
  static int64_t index = 1 << 19; /* samples of their own */
  int r = route(p, n, engines, 42, index++);
  free(p);
  return r;
}

/* Every scan of the JPEG P (NAME) cut in turn: wherever the CPU then fails the file, the GPU must
 * not take it (nvJPEG's CUDA decoder fills in what is missing without a word). Returns how many
 * cuts the CPU failed. */
static int cut_scans(const char *name, const uint8_t *p, size_t n) {
  static int64_t index = 3 << 19; /* each cut of each call a sample of its own: no verdict kept before */
  uint8_t *q, *out = malloc(l.sample_bytes);
  size_t m;
  int failed = 0;
  for (int scan = 0; scan < 64; scan++) {
    if (!(q = cut_scan(p, n, scan, &m)))
      continue;
    dl__err e = {0};
    bool cpu_fails = dl__image_decode(&cpu, &l.image_spec, q, m, DL__CODEC_JPEG, 42, dl__sample_flip(&l, 42), 0, out, &e) != 0;
    int gpu = route(q, m, true, 42, index++);
    if (cpu_fails && gpu)
      FAIL_AT("%s with scan %d cut: the CPU says \"%s\", yet decoder %d would take it", name, scan, e.msg, gpu);
    failed += cpu_fails;
    free(q);
  }
  free(out);
  return failed;
}

static void routes(const char *testdata) {
  l.arena_bytes = 16 << 20;
  l.gpu_pool = 256 << 20;
  l.sample_bytes = (size_t)l.o.height * l.o.width * l.o.channels;
  arena = malloc(l.arena_bytes);
  ASSERT((l.jpeg_rows = dl__jpeg_rows_new((1 << 20) + 2, 64 << 20)));
  slot.arena = arena;
  slot.jobs = jobs;
  ASSERT_EQ(dl__image_decoder_init(&cpu), 0);
  ASSERT_EQ(nftw(testdata, visit, 16, FTW_PHYS), 0);
  printf("%d JPEG-looking files: %d to the engine, %d to the CUDA decoder, %d stay on the CPU (%d of those "
         "decode there; %d with damaged entropy-coded data)\n",
         seen, to_engine, to_cuda, to_cpu, cpu_ok_only, entropy_faults);
  printf("with scans read on the device: %d of the engine's files taken unread, %d of them found damaged there "
         "(and decoded on the CPU)\n", read_on_device, damaged_on_device);
  ASSERT_GT(seen, 300);
  ASSERT_EQ(entropy_faults, (int)(sizeof entropy_damaged / sizeof *entropy_damaged));
  ASSERT_GT(read_on_device, 20);
  ASSERT_GE(damaged_on_device, entropy_faults);
  for (size_t i = 0; i < sizeof entropy_damaged / sizeof *entropy_damaged; i++) {
    ASSERT_EQ(route_file(testdata, entropy_damaged[i], true), 0);
    ASSERT_EQ(route_file(testdata, entropy_damaged[i], false), 0);
    l.o.gpu_check = 0; /* trusting the data, the engine would take them */
    ASSERT_NE(route_file(testdata, entropy_damaged[i], true), 0);
    l.o.gpu_check = 1;
  }
  ASSERT_GT(to_engine, 20);
  ASSERT_GT(to_cuda, 0);
  ASSERT_EQ(route_file(testdata, "libjpeg-turbo/testimages/testorig.jpg", true), DL__GPU_ENGINE_HW);
  ASSERT_EQ(route_file(testdata, "libjpeg-turbo/testimages-historical/testimgp.jpg", true), DL__GPU_ENGINE_CUDA);
  ASSERT_EQ(route_file(testdata, "libjpeg-turbo/testimages/testimgari.jpg", true), 0);
  ASSERT_EQ(route_file(testdata, "libjpeg-turbo/testimages/monkey12.jpg", true), 0);
  ASSERT_EQ(route_file(testdata, "jpeg-decoder/tests/reftest/images/ycck.jpg", true), 0);
  ASSERT_EQ(route_file(testdata, "jpeg-decoder/tests/reftest/images/partial_progressive.jpg", true), 0);
  /* Progressive scans that refine coefficients no scan coded: libjpeg's to judge (it warns, then
   * runs out of data), where nvJPEG's CUDA decoder delivered an image without a word. */
  ASSERT_EQ(route_file(testdata, "jpeg-decoder/tests/crashtest/images/subtract-with-overflow.jpg", true), 0);
  /* Damaged scans of files that decode in several scans (progressive, non-interleaved): kept on
   * the CPU, which names them. */
  char path[4096];
  snprintf(path, sizeof path, "%s/libjpeg-turbo/testimages-historical/testimgp.jpg", testdata);
  size_t n;
  uint8_t *p = read_file(path, &n);
  ASSERT(p);
  int progressive_cuts = cut_scans(path, p, n), separate_cuts = 0;
  ASSERT_GT(progressive_cuts, 3);
  free(p);
  for (int progressive = 0; progressive < 2; progressive++) {
    p = several_scans_jpeg(progressive, &n);
    ASSERT_EQ(route(p, n, true, 42, (5 + progressive) << 19), DL__GPU_ENGINE_CUDA); /* whole: the CUDA decoder's */
    int cuts = cut_scans(progressive ? "a progressive JPEG" : "a non-interleaved JPEG", p, n);
    ASSERT_GT(cuts, progressive ? 3 : 0);
    /* Trusting the data (gpu_check=0) covers single-scan files only: nvJPEG's CUDA decoder is
     * never given an unread scan of these (plan.c says why). */
    l.o.gpu_check = 0;
    const char *trusted = progressive ? "a progressive JPEG, gpu_check=0"
                                      : "a non-interleaved JPEG, gpu_check=0";
    ASSERT_EQ(cut_scans(trusted, p, n), cuts);
    l.o.gpu_check = 1;
    progressive_cuts += progressive ? cuts : 0;
    separate_cuts += progressive ? 0 : cuts;
    free(p);
  }
  printf("scans cut in half: the CPU failed %d of two progressive files' and %d of a non-interleaved one's, none "
         "went to the GPU\n", progressive_cuts, separate_cuts);
  /* A ringfeed shard's writer vouches for single-scan files only (plan.c): sample V's claim, its
   * verdict taken at open, is not believed of a progressive file, whose damaged cuts each stay on
   * the CPU; of a single-scan file it is, as gpu_check=0 trusts one. */
  enum { V = 1000 }; /* a sample no route above was */
  dl__sample *vouched = calloc(V + 1, sizeof *vouched);
  uint8_t *clean = calloc(V + 1, 1);
  ASSERT(vouched && clean);
  vouched[V].flags = DL__SAMPLE_SCAN_CLEAN;
  l.ds.samples = vouched, l.ds.n = V + 1;
  clean[V] = DL__VERDICT_CLEAN;
  ASSERT_EQ(dl__jpeg_rows_take_verdicts(l.jpeg_rows, clean, V + 1), 1);
  free(clean);
  p = several_scans_jpeg(1, &n);
  uint8_t *out = malloc(l.sample_bytes);
  int disbelieved = 0;
  for (int scan = 0; scan < 64; scan++) {
    size_t m;
    uint8_t *q = cut_scan(p, n, scan, &m);
    if (!q)
      continue;
    dl__err e = {0};
    if (dl__image_decode(&cpu, &l.image_spec, q, m, DL__CODEC_JPEG, 42, dl__sample_flip(&l, 42), 0, out, &e)) {
      ASSERT_EQ(route(q, m, true, 42, V), 0);
      disbelieved++;
    }
    free(q);
  }
  ASSERT_GT(disbelieved, 3);
  free(out);
  free(p);
  snprintf(path, sizeof path, "%s/%s", testdata, entropy_damaged[0]);
  ASSERT((p = read_file(path, &n)));
  ASSERT_NE(route(p, n, true, 42, V), 0);
  free(p);
  free(vouched);
  l.ds.samples = NULL, l.ds.n = 0;
  printf("a shard's word that a JPEG reads clean: not believed of %d damaged cuts of a progressive file, believed "
         "of a single-scan file\n", disbelieved);
  /* A baseline file cut short: the data never reaches its EOI. */
  snprintf(path, sizeof path, "%s/libjpeg-turbo/testimages/testorig.jpg", testdata);
  p = read_file(path, &n);
  ASSERT(p);
  ASSERT_EQ(route(p, n - 100, true, 1, 1 << 20), 0);
  ASSERT_EQ(route(p, n, true, 1, (1 << 20) + 1), DL__GPU_ENGINE_HW);
  /* The engine's region: the crop and its filter's reach, on the 16-pixel grid, inside the image. */
  const dl__gpu_job *g = &jobs[0];
  double sx = fmax(g->rect[2] / l.o.width, 1), sy = fmax(g->rect[3] / l.o.height, 1);
  ASSERT(g->roi[0] % 16 == 0 && g->roi[1] % 16 == 0);
  ASSERT(g->roi[0] <= g->rect[0] - sx || g->roi[0] == 0);
  ASSERT(g->roi[1] <= g->rect[1] - sy || g->roi[1] == 0);
  ASSERT(g->roi[0] + g->roi[2] >= g->rect[0] + g->rect[2] + sx || g->roi[0] + g->roi[2] == g->width);
  ASSERT(g->roi[1] + g->roi[3] >= g->rect[1] + g->rect[3] + sy || g->roi[1] + g->roi[3] == g->height);
  ASSERT(g->roi[0] + g->roi[2] <= g->width && g->roi[1] + g->roi[3] <= g->height);
  /* Too large for the pool: the CPU's. */
  l.gpu_pool = 1000;
  ASSERT_EQ(route(p, n, true, 1, (1 << 20) + 1), 0);
  free(p);
  free(arena);
  dl__jpeg_rows_free(l.jpeg_rows);
  l.jpeg_rows = NULL;
  dl__image_decoder_free(&cpu);
}

static void choices(const char *shards) {
  char source[4096];
  snprintf(source, sizeof source, "%s/format-tar-gnu.tar", shards);
  dl_loader *x;
  const char *asks[] = {"decode=gpu", "decode=hybrid"};
  for (int i = 0; i < 2; i++) {
    ASSERT_EQ(dl_open(&x, source, asks[i]), DL_ENODEVICE);
    ASSERT_CONTAINS(dl_last_error(), asks[i]);
    ASSERT_CONTAINS(dl_last_error(), "device=cpu");
  }
  char opts[128];
  snprintf(opts, sizeof opts, "%s device=cuda:0", asks[0]);
  ASSERT_EQ(dl_open(&x, source, opts), DL_ENODEVICE); /* no GPU here, or none built in */
  /* Without a driver CUDA's own words are "driver version is insufficient": the message says what
   * is missing instead. */
  void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver)
    dlclose(driver);
  else if (!strstr(dl_last_error(), "built without CUDA"))
    ASSERT_CONTAINS(dl_last_error(), "no NVIDIA driver is installed: libcuda.so.1 is not found");
  ASSERT_EQ(dl_open(&x, source, "decode=sometimes"), DL_EOPTION);
  ASSERT_CONTAINS(dl_last_error(), "decode=sometimes");
  ASSERT_EQ(dl_open(&x, source, "gpu_share=1.5"), DL_EOPTION);
  ASSERT_EQ(dl_open(&x, source, "gpu_decode_mb=1"), DL_EOPTION);
  OPEN_OK(x, source, "decode=auto batch_size=2 workers=1");
  dl_batch *b;
  int n = 0;
  while (dl_next_batch(x, &b) == 0) {
    n += dl_batch_size(b);
    dl_batch_release(b, NULL);
  }
  ASSERT_EQ(n, 2);
  char stats[4096];
  ASSERT_GT(dl_stats_json(x, stats, sizeof stats), 0);
  ASSERT_CONTAINS(stats, "\"decode_backend\":\"cpu\"");
  ASSERT_CONTAINS(stats, "\"decode_reason\":\"device=cpu\"");
  ASSERT_CONTAINS(stats, "\"cpu_decoded\":2");
  ASSERT_CONTAINS(stats, "\"gpu_decoded\":0");
  dl_close(x);
  printf("decode=gpu|hybrid without a GPU: DL_ENODEVICE; decode=auto: decode_backend cpu\n");
}

/* A named library that is not there: not found, and the message says where it looked. */
static void missing_nvjpeg(void) {
  setenv("RINGFEED_NVJPEG", "/nonexistent/libnvjpeg.so.13", 1);
  char why[1024] = "";
  ASSERT(dl__nvjpeg_load(why, sizeof why) == NULL);
  ASSERT_CONTAINS(why, "nvJPEG not found");
  ASSERT_CONTAINS(why, "/nonexistent/libnvjpeg.so.13");
  ASSERT_STR_EQ(dl__nvjpeg_status_name(3), "NVJPEG_STATUS_BAD_JPEG");
  printf("nvJPEG named by RINGFEED_NVJPEG and absent: %s\n", why);
}

/* Hybrid's choice of the workers' samples in batch K of sampler SM at the loader's crop:
 * checks it takes CPU_N, those that cost a worker least, returns how many of them are neighbours
 * and the mean cost of the chosen (*MINE) and of the whole batch (*ALL), in whole decodes. */
static int choose(const dl__sampler *sm, int64_t k, dl_batch *b, double *mine, double *all) {
  dl_batch again = *b;
  uint8_t flags[256];
  again.on_cpu = flags;
  dl__gpu_split_batch(&l, sm, b);
  dl__gpu_split_batch(&l, sm, &again);
  ASSERT_EQ(memcmp(b->on_cpu, flags, (size_t)b->len), 0); /* the draws and the share say which, nothing else */
  uint32_t direct[1] = {0};
  l.ds.direct = direct;
  dl__sample s = {.codec = DL__CODEC_JPEG, .size = 1000};
  int cpu_n = 0, side_by_side = 0;
  bool last = false;
  double chosen_cost = 0, cheapest_left = 2, dearest_chosen = -1, sum = 0;
  for (int i = 0; i < b->len; i++) {
    bool on_cpu = dl__gpu_arena_take(&l, b, i, &s) == NULL;
    int64_t epoch, draw;
    dl__sampler_sample(sm, k, i, &epoch, &draw);
    double cost = dl__split_cost(&l, epoch > sm->start_epoch, dl__sample_key(&l, epoch, draw));
    sum += cost;
    if (on_cpu) {
      chosen_cost += cost;
      dearest_chosen = cost > dearest_chosen ? cost : dearest_chosen;
    } else {
      cheapest_left = cost < cheapest_left ? cost : cheapest_left;
    }
    cpu_n += on_cpu;
    side_by_side += on_cpu && last;
    last = on_cpu;
  }
  l.ds.direct = NULL;
  ASSERT_EQ(cpu_n, b->cpu_n);
  ASSERT(dearest_chosen <= cheapest_left); /* none left to the GPU costs less than one the workers take */
  *mine = chosen_cost / cpu_n;
  *all = sum / b->len;
  return side_by_side;
}

static void split(void) {
  l.arena_bytes = 1 << 20;
  uint8_t *mem = malloc(l.arena_bytes), flags[256];
  dl_batch b = {.arena = mem, .on_cpu = flags, .len = 256, .cpu_n = 77, .k = 5};
  dl__sampler sm;
  ASSERT_EQ(dl__sampler_init(&sm, 100000, 1, 0, 256, 0, 1, 7, 0, 0, NULL, 0), 0);
  dl__split_rank rank[256];
  l.split.rank = rank;
  /* Random crops: the workers take the 77 that cost them least, a fraction of the average one's
   * cost. Without row starts a decode reads every row down to the crop's bottom; with them, the
   * rows above are walked (the run's first epoch) or, after it, skipped for some samples. */
  double mine, all;
  choose(&sm, b.k, &b, &mine, &all);
  ASSERT(mine < all - 0.1);
  printf("hybrid, random crops: the workers' 77 of 256 samples cost %.2f of a whole decode on average, the "
         "batch's %.2f (no row starts: down to the crop's bottom)\n", mine, all);
  ASSERT((l.jpeg_rows = dl__jpeg_rows_new(100000, 1 << 20)));
  const char *when[] = {"the first epoch, the rows above walked", "later epochs, some skipped"};
  for (int e = 0; e < 2; e++) {
    b.k = e ? sm.nb_first + 5 : 5;
    double cheapest, mean;
    choose(&sm, b.k, &b, &cheapest, &mean);
    ASSERT(cheapest < mean - 0.1);
    ASSERT(cheapest < mine);
    printf("  with row starts, %s: %.2f, the batch's %.2f\n", when[e], cheapest, mean);
  }
  dl__jpeg_rows_free(l.jpeg_rows);
  l.jpeg_rows = NULL;
  b.k = 5;
  /* Centre crops all end alike: the share is spread evenly, never two CPU samples side by side. */
  dl__options o = l.o;
  ASSERT_EQ(dl__options_parse(&l.o, "image_size=64 crop=center"), 0);
  l.image_spec = dl__image_spec_of(&l.o, &l.cancel);
  ASSERT_EQ(choose(&sm, b.k, &b, &mine, &all), 0);
  ASSERT(fabs(mine - all) < 1e-9);
  l.o = o;
  l.image_spec = dl__image_spec_of(&l.o, &l.cancel);
  l.split.rank = NULL;
  dl__sampler_free(&sm);
  free(mem);

  /* The split moves half the way toward the balance of the two sides' measured rates (in 32nds of
   * a batch, one at least) after three batches that agree, and only then; a consumer that never
   * waits moves it to the CPU while the copy stage waits for the consumer over a quarter of
   * the time (AHEAD: that share of the time since the update before, PERIOD ms apart), by 1/8 while
   * over half, else it holds; and only as far as both sides' parts of a batch at the new split stay
   * within 0.8 of that period.
   * The GPU decodes 192 of 256 images in 10 ms a batch; four workers take WORKER_MS per image. */
  pthread_mutex_init(&l.mu, NULL);
  l.decode = DL__DECODE_HYBRID;
  l.o.gpu_share = -1;
  l.o.workers = 4;
  l.nstreams = 1;
  l.share = 0.75;
  ASSERT_EQ(l.o.batch_size, 256);
  double gpu_rate = 192 / 10.0;
  struct { bool starved; double ahead, period, balance, want; } steps[] = {
      {true, 0, 0, 0.9, 0.75}, {true, 0, 0, 0.9, 0.75}, /* start-up: not counted */
      /* the GPU side is faster: it takes more, 2/32 of the 0.15 to the balance */
      {true, 0, 0, 0.9, 0.75}, {true, 0, 0, 0.9, 0.75}, {true, 0, 0, 0.9, 0.8125},
      {true, 0, 0, 0.81, 0.8125}, {true, 0, 0, 0.81, 0.8125}, {true, 0, 0, 0.81, 0.8125}, /* balanced: stays */
      /* never waited, ahead: to the CPU (its 56 images would take 26 ms, the consumer 60 a batch) */
      {false, 0.375, 60, 0.9, 0.8125}, {false, 0.375, 60, 0.9, 0.8125}, {false, 0.375, 60, 0.9, 0.78125},
      /* far ahead: faster (88 images would take the workers 41 ms of the consumer's 100) */
      {false, 0.9, 100, 0.9, 0.78125}, {false, 0.9, 100, 0.9, 0.78125}, {false, 0.9, 100, 0.9, 0.65625},
      {false, 0, 0, 0.9, 0.65625}, {false, 0, 0, 0.9, 0.65625}, {false, 0, 0, 0.9, 0.65625}, /* never waited, just ahead: holds */
      /* At 0.625 both sides take 8.3 ms a batch and the consumer steps at 10 ms: at 0.53125 the
       * workers' part would take 10.4 ms and at 0.625 8.3, over 0.8 of the step, however far ahead
       * the copy stage runs now and then. It holds... */
      {false, 0.6, 10, 0.625, 0.65625}, {false, 0.6, 10, 0.625, 0.65625}, {false, 0.6, 10, 0.625, 0.65625},
      /* ...where a consumer of 30 ms steps leaves room to go by 1/8. */
      {false, 0.6, 30, 0.625, 0.65625}, {false, 0.6, 30, 0.625, 0.65625}, {false, 0.6, 30, 0.625, 0.53125},
  };
  for (size_t k = 0; k < sizeof steps / sizeof *steps; k++) {
    if (steps[k].starved)
      l.st.starved++;
    if (steps[k].ahead > 0) { /* that share of the time since the last update, a little of it before the next */
      l.split.period = steps[k].period;
      usleep((useconds_t)(steps[k].period * 1000));
      atomic_fetch_add(&l.st.release_wait_ns, (int64_t)(steps[k].ahead * (dl__now() - l.split.t) * 1e9));
    }
    double worker_ms = l.o.workers / (gpu_rate * (1 / steps[k].balance - 1));
    l.st.cpu_decoded += 10;
    l.st.cpu_decode_ns += (int64_t)(10 * worker_ms * 1e6);
    l.split.cpu_ms = worker_ms; /* the rate as measured from here on */
    if (steps[k].ahead > 0) /* and the consumer's pace, its window just begun */
      l.split.win_t = dl__now(), l.split.win_n = 0;
    dl__gpu_share_update(&l, 192, 10.0);
    if (fabs(l.share - steps[k].want) > 1e-9)
      FAIL_AT("after update %zu the share is %.5f, not %.5f", k, l.share, steps[k].want);
  }
  ASSERT_EQ(l.split.holds, 1);
  /* The consumer's pace over windows of 0.1 s, in ms: slots handed back three at a time 20 ms apart
   * are batches 6.7 ms apart (more on a loaded machine, whose sleeps run long). */
  l.split.win_t = 0, l.split.period = 0;
  for (int k = 0; k < 8; k++) {
    for (int j = 0; j < 3; j++)
      dl__gpu_share_update(&l, 192, 10.0);
    usleep(20000);
  }
  if (!(l.split.period > 6 && l.split.period < 40))
    FAIL_AT("batches 6.7 ms apart measured %.3f ms apart", l.split.period);
  /* Toward a balance far below, step by step, to rest at it. */
  double worker_ms = l.o.workers / gpu_rate; /* both sides alike: 0.5 */
  for (int k = 0; k < 60; k++) {
    l.st.starved++;
    l.st.cpu_decoded += 10;
    l.st.cpu_decode_ns += (int64_t)(10 * worker_ms * 1e6);
    dl__gpu_share_update(&l, 192, 10.0);
  }
  ASSERT(fabs(l.share - 0.5) < 1e-9);
  /* The workers also walk each image the GPU takes (a first epoch's gpu_check): at 0.1 ms an image
   * beside their 0.208 ms decodes, the balance is 0.208 / (0.208 - 0.1 + 0.208) = 0.658, where the
   * split rests; walks as slow as the GPU side's cost per worker (0.25 ms) give the GPU all, and
   * once they end (a dataset's second epoch) it comes back to 0.5. Each within 23 batches, a first
   * epoch of 6,000 images, where steps of 1/32 took 15, 33 and 48 (the walks' rate eases in). */
  double walks[] = {0.1, 0.25, 0}, rests[] = {0.65625, 1, 0.5};
  for (int w = 0; w < 3; w++) {
    int rested = -1;
    for (int k = 0; k < 60; k++) {
      l.st.starved++;
      l.st.cpu_decoded += 10;
      l.st.cpu_decode_ns += (int64_t)(10 * worker_ms * 1e6);
      l.st.gpu_planned += 192;
      l.st.gpu_plan_ns += (int64_t)(192 * walks[w] * 1e6);
      dl__gpu_share_update(&l, 192, 10.0);
      if (fabs(l.share - rests[w]) > 1e-9)
        rested = -1;
      else if (rested < 0)
        rested = k + 1;
    }
    if (rested < 0 || rested > 23)
      FAIL_AT("with walks of %.2f ms the share rests at %.5f after %d batches, not %.5f within 23", walks[w], l.share,
              rested, rests[w]);
    printf("hybrid: with the workers' walks at %.2f ms an image the split rests at %.3f after %d batches\n", walks[w],
           rests[w], rested);
  }
  l.decode = DL__DECODE_CPU;

  /* Which side holds a batch back, for the verdict: the GPU's 192 of 256 at 10/192 ms an image
   * take 10 ms, four workers' 64 at CPU_MS an image 16 * CPU_MS; within a tenth is the balance. */
  double gpu_part, cpu_part;
  ASSERT(!dl__split_limit(0.75, 256, 0, 0.5, 0, 4, &gpu_part, &cpu_part)); /* nothing measured yet */
  ASSERT_STR_EQ(dl__split_limit(0.75, 256, 10.0 / 192, 0.5, 0, 4, &gpu_part, &cpu_part), "gpu");
  ASSERT(fabs(gpu_part - 10) < 1e-9 && fabs(cpu_part - 8) < 1e-9);
  ASSERT_STR_EQ(dl__split_limit(0.75, 256, 10.0 / 192, 0.8, 0, 4, &gpu_part, &cpu_part), "cpu");
  ASSERT(fabs(cpu_part - 12.8) < 1e-9);
  ASSERT_STR_EQ(dl__split_limit(0.75, 256, 10.0 / 192, 0.6, 0, 4, &gpu_part, &cpu_part), "neither"); /* 9.6 ms */
  ASSERT_STR_EQ(dl__split_limit(1, 256, 10.0 / 192, 0.6, 0, 4, &gpu_part, &cpu_part), "gpu");  /* all on the GPU */
  ASSERT(cpu_part == 0);
  /* The workers' walks of the GPU's images (gpu_check in a first epoch), 0.2 ms each: at 0.75 they
   * take the workers 9.6 ms of a batch beside 3.2 of decodes, which alone would leave the GPU's
   * 10 ms the longer part; at 1, 12.8 ms against the GPU's 13.3. */
  ASSERT_STR_EQ(dl__split_limit(0.75, 256, 10.0 / 192, 0.2, 0, 4, &gpu_part, &cpu_part), "gpu");
  ASSERT_STR_EQ(dl__split_limit(0.75, 256, 10.0 / 192, 0.2, 0.2, 4, &gpu_part, &cpu_part), "cpu");
  ASSERT(fabs(cpu_part - 12.8) < 1e-9);
  ASSERT_STR_EQ(dl__split_limit(1, 256, 10.0 / 192, 0.2, 0.2, 4, &gpu_part, &cpu_part), "neither");
  printf("hybrid: the verdict names the side of the split a batch waits for (its part of a batch the longer by a "
         "tenth), or neither at the balance\n");
  printf("hybrid: the split moves half the way to the measured balance after three agreeing batches (the "
         "workers' walks of the GPU's images counted as theirs), and drifts to the CPU only while the batches "
         "still come well ahead of the consumer\n");
}

int main(void) {
  const char *shards = test_shards();
  const char *testdata = getenv("DL_TESTDATA");
  ASSERT(testdata && *testdata);
  ASSERT_EQ(dl__options_parse(&l.o, "image_size=64 crop=random_resized flip=1"), 0);
  l.image_spec = dl__image_spec_of(&l.o, &l.cancel);
  routes(testdata);
  split();
  choices(shards);
  missing_nvjpeg();
  return 0;
}
