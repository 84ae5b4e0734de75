/*
 * dlbench: runs the loader over a source (or the built-in synthetic set) and reports its rate.
 * --digest prints a hash of each delivered batch's bytes, in order, and of the whole stream, so
 * two runs (other worker counts, a resumed run) can be compared line by line. With --json, stdout
 * holds nothing but one JSON object, the digests and keys inside it.
 */
#include "ringfeed.h"
#include "cli_number.h"
#include "synthetic.h"
#include "tools.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#ifdef DL_WITH_CUDA
#include "gpu_step.h"
#endif

/* Text gathered for the JSON object (digests, keys); a failed growth drops it and says so once. */
typedef struct text {
  char *p;
  size_t len, cap;
  bool failed;
} text;

static void text_add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_add(text *t, const char *fmt, ...) {
  for (int attempt = 0; attempt < 2 && !t->failed; attempt++) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = true;
    } else if (t->p && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    } else {
      size_t cap = (t->cap + (size_t)n + 1) * 2;
      char *p = realloc(t->p, cap);
      if (!p)
        t->failed = true;
      else
        t->p = p, t->cap = cap;
    }
  }
  if (t->failed)
    fprintf(stderr, "dlbench: out of memory gathering the JSON output\n");
}

/* S as a JSON string, quotes included. */
static void text_add_string(text *t, const char *s) {
  text_add(t, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      text_add(t, "\\%c", c);
    else if (c < 0x20)
      text_add(t, "\\u%04x", c);
    else
      text_add(t, "%c", c);
  }
  text_add(t, "\"");
}

/* A number in the loader's stats JSON, 0 when absent. */
static double stat_of(const char *stats, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *p = strstr(stats, k);
  return p ? atof(p + strlen(k)) : 0;
}

/* A string of the loader's stats (those it writes have no escaped quotes), or "". */
static const char *text_of(const char *stats, const char *key, char *out, size_t cap) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":\"", key);
  const char *p = strstr(stats, k), *end = p ? strchr(p + strlen(k), '"') : NULL;
  size_t n = end ? (size_t)(end - p - strlen(k)) : 0;
  n = n < cap - 1 ? n : cap - 1;
  memcpy(out, p ? p + strlen(k) : "", n);
  out[n] = 0;
  return out;
}

static double clock_s(clockid_t c) {
  struct timespec t;
  clock_gettime(c, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static double now(void) { return clock_s(CLOCK_MONOTONIC); }

static void usage(FILE *f) {
  fprintf(f,
          "usage: dlbench [SOURCE...] [options]\n"
          "  SOURCE            tar or ringfeed shards (list with ::, globs, {000..009} ranges) or an\n"
          "                    ImageFolder; several are read as one list (a shell-expanded glob);\n"
          "                    none: the built-in synthetic set\n"
          "  --workers N       worker threads (default: auto, the CPUs this process may use / LOCAL_WORLD_SIZE)\n"
          "  --batch B         batch size (256)\n"
          "  --size S          output size, N or HxW (224)\n"
          "  --crop MODE       random_resized | center | resize | none (random_resized)\n"
          "  --flip            random horizontal flips\n"
          "  --prefetch P      batch slots (4)\n"
          "  --epochs E        epochs, 0 = forever (1)\n"
          "  --seed S          seed (0)\n"
          "  --io MODE         auto | uring | pread | mmap (auto)\n"
          "  --decode MODE     auto | cpu | gpu | hybrid: where JPEGs are decoded (auto: hybrid on CUDA)\n"
          "  --on-error MODE   skip | fail (skip)\n"
          "  --rank R --world-size W   this rank's share of each epoch\n"
          "  --device D        cpu | cuda | cuda:N (cpu)\n"
          "  --dtype T         uint8 | float32 | float16 | bfloat16 (uint8; floats are normalised:\n"
          "                    --option mean=a,b,c --option std=a,b,c, ImageNet's by default)\n"
          "  --step-ms T       GPU consumer: keep the GPU busy T ms per batch, report its idle time\n"
          "  --step-kernel-ms K   ... in kernels of K ms each, holding every SM (1)\n"
          "  --resume TOKEN    continue after a saved state\n"
          "  --stop-after K    stop after K batches and print the resume token\n"
          "  --first-after MS  take the first batch MS ms after dl_open, as a training script that opens\n"
          "                    its loader before building its model (steady rates count from that batch)\n"
          "  --second-loader   first open a loader of the same source and options, take one epoch (more\n"
          "                    until the GPU has decoded) and close it, as a training loop's later epochs\n"
          "                    find their process (CUDA and nvJPEG started, decoders kept and used); the\n"
          "                    figures are the second loader's\n"
          "  --option K=V      any other loader option (repeatable)\n"
          "  --synthetic N     samples in the synthetic set (10000)\n"
          "  --quality Q --subsampling 420|444   how the synthetic set is encoded (90, 420;\n"
          "                    ImageNet-quality files: --quality 96 --subsampling 444)\n"
          "  --shared-tables   ... every component coded with one set of Huffman tables, as some\n"
          "                    encoders write them\n"
          "  --make-synthetic  only make (once) the synthetic set and print its source pattern\n"
          "  --json            print one JSON object\n"
          "  --digest          print a hash of every batch's bytes, then of the whole stream\n"
          "  --keys            print each batch's sample keys\n"
          "  --list-options    print every loader option (--option K=V) with its values (=md: as Markdown)\n"
          "  --version         print the version\n");
}

/* What the command line asks for. */
typedef struct args {
  char opts[4096]; /* the loader's options */
  const char *device;
  bool json, digest, keys, make_only, second_loader;
  long synthetic, stop_after, first_after_ms;
  synthetic_coding coding;
  double step_ms, step_kernel_ms;
} args;

/* Reads the command line into A: -1 to run, else the exit status (help, version, a bad flag). */
static int parse_args(int argc, char **argv, args *a) {
  enum { O_BATCH = 256, O_SIZE, O_CROP, O_PREFETCH, O_EPOCHS, O_SEED, O_IO, O_ONERR, O_RANK, O_WORLD,
         O_DEVICE, O_DTYPE, O_STEP, O_RESUME, O_STOP, O_OPTION, O_SYNTH, O_JSON, O_DIGEST, O_KEYS,
         O_FLIP, O_WORKERS, O_HELP, O_MAKE, O_DECODE, O_QUALITY, O_SUBSAMPLING, O_SHARED_TABLES, O_VERSION,
         O_STEP_KERNEL, O_LIST_OPTIONS, O_FIRST_AFTER, O_SECOND_LOADER };
  static const struct option longopts[] = {
      {"workers", 1, 0, O_WORKERS}, {"batch", 1, 0, O_BATCH},      {"size", 1, 0, O_SIZE},
      {"crop", 1, 0, O_CROP},       {"prefetch", 1, 0, O_PREFETCH}, {"epochs", 1, 0, O_EPOCHS},
      {"seed", 1, 0, O_SEED},       {"io", 1, 0, O_IO},            {"on-error", 1, 0, O_ONERR},
      {"rank", 1, 0, O_RANK},       {"world-size", 1, 0, O_WORLD}, {"device", 1, 0, O_DEVICE},
      {"dtype", 1, 0, O_DTYPE},     {"step-ms", 1, 0, O_STEP},     {"resume", 1, 0, O_RESUME},
      {"stop-after", 1, 0, O_STOP}, {"option", 1, 0, O_OPTION},    {"synthetic", 1, 0, O_SYNTH},
      {"json", 0, 0, O_JSON},       {"digest", 0, 0, O_DIGEST},    {"keys", 0, 0, O_KEYS},
      {"flip", 0, 0, O_FLIP},       {"help", 0, 0, O_HELP},        {"make-synthetic", 0, 0, O_MAKE},
      {"decode", 1, 0, O_DECODE},   {"quality", 1, 0, O_QUALITY},  {"subsampling", 1, 0, O_SUBSAMPLING},
      {"step-kernel-ms", 1, 0, O_STEP_KERNEL}, {"list-options", 2, 0, O_LIST_OPTIONS},
      {"shared-tables", 0, 0, O_SHARED_TABLES}, {"first-after", 1, 0, O_FIRST_AFTER},
      {"second-loader", 0, 0, O_SECOND_LOADER}, {"version", 0, 0, O_VERSION}, {0, 0, 0, 0}};
  *a = (args){.device = "cpu", .synthetic = 10000, .stop_after = -1, .coding = SYNTHETIC_DEFAULT, .step_kernel_ms = 1};
  size_t olen = 0;
#define ADD(...) olen += (size_t)snprintf(a->opts + olen, sizeof a->opts - olen, __VA_ARGS__)
  bool kernel_given = false, synthetic_given = false;
  long v;
  int c;
  opterr = 0; /* cli_bad_flag says it, last */
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case O_WORKERS: ADD(" workers=%s", optarg); break;
    case O_BATCH: ADD(" batch_size=%s", optarg); break;
    case O_SIZE: ADD(" image_size=%s", optarg); break;
    case O_CROP: ADD(" crop=%s", optarg); break;
    case O_PREFETCH: ADD(" prefetch=%s", optarg); break;
    case O_EPOCHS: ADD(" epochs=%s", optarg); break;
    case O_SEED: ADD(" seed=%s", optarg); break;
    case O_IO: ADD(" io=%s", optarg); break;
    case O_ONERR: ADD(" on_error=%s", optarg); break;
    case O_RANK: ADD(" rank=%s", optarg); break;
    case O_WORLD: ADD(" world_size=%s", optarg); break;
    case O_DEVICE: a->device = optarg; ADD(" device=%s", optarg); break;
    case O_DTYPE: ADD(" dtype=%s", optarg); break;
    case O_RESUME: ADD(" resume=%s", optarg); break;
    case O_OPTION: ADD(" %s", optarg); break;
    case O_FLIP: ADD(" flip=1"); break;
    case O_STEP:
      if (!cli_number(optarg, &a->step_ms) || !(a->step_ms > 0)) {
        fprintf(stderr, "dlbench: --step-ms %s: a length in ms above 0\n", optarg);
        return 2;
      }
      break;
    case O_STEP_KERNEL:
      kernel_given = true;
      if (!cli_number(optarg, &a->step_kernel_ms) || !(a->step_kernel_ms > 0)) {
        fprintf(stderr, "dlbench: --step-kernel-ms %s: a length in ms above 0\n", optarg);
        return 2;
      }
      break;
    case O_STOP:
      if (!cli_whole_number("dlbench", "--stop-after", optarg, 0, &a->stop_after))
        return 2;
      break;
    case O_FIRST_AFTER:
      if (!cli_whole_number("dlbench", "--first-after", optarg, 0, &a->first_after_ms))
        return 2;
      break;
    case O_SYNTH:
      if (!cli_whole_number("dlbench", "--synthetic", optarg, 1, &a->synthetic))
        return 2;
      synthetic_given = true;
      break;
    case O_DECODE: ADD(" decode=%s", optarg); break;
    case O_QUALITY:
      if (!cli_whole_number("dlbench", "--quality", optarg, 1, &v))
        return 2;
      a->coding.quality = (int)v, synthetic_given = true;
      break;
    case O_SUBSAMPLING:
      if (!cli_whole_number("dlbench", "--subsampling", optarg, 0, &v))
        return 2;
      a->coding.subsampling = (int)v, synthetic_given = true;
      break;
    case O_SHARED_TABLES: a->coding.shared_tables = 1, synthetic_given = true; break;
    case O_JSON: a->json = true; break;
    case O_DIGEST: a->digest = true; break;
    case O_KEYS: a->keys = true; break;
    case O_MAKE: a->make_only = true; break;
    case O_SECOND_LOADER: a->second_loader = true; break;
    case O_HELP: case 'h': usage(stdout); return 0;
    case O_LIST_OPTIONS: dl_tool_options(stdout, optarg && !strcmp(optarg, "md")); return 0;
    case O_VERSION: printf("dlbench (ringfeed) %s\n", dl_version()); return 0;
    default: return cli_bad_flag("dlbench", c, argv, optind, optopt, longopts);
    }
  }
#undef ADD
  if (olen >= sizeof a->opts) {
    fprintf(stderr, "dlbench: options too long\n");
    return 2;
  }
  if (kernel_given && !(a->step_ms > 0)) { /* it shapes the --step-ms consumer, and nothing else */
    fprintf(stderr, "dlbench: --step-kernel-ms needs --step-ms\n");
    return 2;
  }
  if (a->step_ms > 0 && strncmp(a->device, "cuda", 4) != 0) { /* its consumer is a GPU's: on the CPU it would run no step */
    fprintf(stderr, "dlbench: --step-ms runs a GPU consumer: it needs --device cuda:N (not %s)\n", a->device);
    return 2;
  }
  if (synthetic_given && optind < argc) { /* they shape the built-in set, which a SOURCE replaces */
    fprintf(stderr, "dlbench: --synthetic, --quality, --subsampling and --shared-tables make the built-in "
                    "set: give them without a SOURCE\n");
    return 2;
  }
  return -1;
}

/* The source: the SOURCE arguments (several, as a shell expands a glob, are one list), or the
 * synthetic set, made once. NULL with the exit status in *STATUS. */
static char *make_source(int argc, char **argv, const args *a, int *status) {
  size_t need = 1;
  for (int i = optind; i < argc; i++)
    need += strlen(argv[i]) + 2;
  size_t cap = need > PATH_MAX * 2 ? need : PATH_MAX * 2;
  char *source = malloc(cap);
  *status = 1;
  if (!source) {
    fprintf(stderr, "dlbench: out of memory\n");
    return NULL;
  }
  source[0] = 0;
  if (optind < argc) {
    for (int i = optind, at = 0; i < argc; i++)
      at += snprintf(source + at, cap - (size_t)at, "%s%s", i > optind ? "::" : "", argv[i]);
    return source;
  }
  if (a->synthetic < 1) {
    fprintf(stderr, "dlbench: --synthetic needs at least 1 sample\n");
    *status = 2;
  } else if (a->coding.quality < 1 || a->coding.quality > 100 ||
             (a->coding.subsampling != 420 && a->coding.subsampling != 444)) {
    fprintf(stderr, "dlbench: --quality takes 1..100 and --subsampling 420 or 444\n");
    *status = 2;
  } else {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (!synthetic_dataset(a->synthetic, a->coding, (int)(cpus > 0 ? cpus : 1), source, cap))
      return source;
  }
  free(source);
  return NULL;
}

#define MAX_EPOCHS_REPORTED 32

/* A run over the loader: what was delivered, the digests and keys, and the GPU consumer. */
typedef struct run {
  const args *a;
  double t0, last_print, first_ms;
  int64_t samples, batches, bytes, first_samples;
  /* Each epoch's rate (a dataset's first epoch may differ: caches, gpu_check's reads): its samples
   * and the time its batches took, the first epoch's from its first batch, as steady counts. */
  int64_t epoch, epoch_samples[MAX_EPOCHS_REPORTED];
  double epoch_t0, epoch_end[MAX_EPOCHS_REPORTED];
  int nepochs; /* the epochs before the current one */
  XXH3_state_t *all, *one;
  text batch_digests, batch_keys;
  void *host_copy; /* a device field's bytes, for its digest */
  size_t host_cap;
  bool tty;
#ifdef DL_WITH_CUDA
  gpu_step *gs;
#endif
} run;

/* The digest of one field's bytes, fetched from the device where they are there. */
static void digest_field(run *r, dl_batch *b, const DLTensor *t, size_t tb) {
  (void)b;
  const void *data = t->data;
  if (t->device.device_type == kDLCUDA) {
#ifdef DL_WITH_CUDA
    if (r->host_cap < tb) {
      free(r->host_copy);
      r->host_cap = tb;
      r->host_copy = malloc(r->host_cap);
    }
    gpu_step_fetch(r->gs, b, t, r->host_copy);
    data = r->host_copy;
#endif
  }
  XXH3_64bits_update(r->one, data, tb);
  XXH3_64bits_update(r->all, data, tb);
}

/* A batch of N samples from EPOCH, delivered now: the epoch before it ended with the batch before. */
static void count_epoch(run *r, int64_t epoch, int n) {
  double t = now();
  if (r->batches == 0) { /* start-up: the first batch's time and samples left out, as steady does */
    r->epoch = epoch, r->epoch_t0 = r->epoch_end[0] = t; /* an epoch of that batch alone ends there */
    return;
  }
  if (epoch != r->epoch)
    r->epoch = epoch, r->nepochs++;
  if (r->nepochs < MAX_EPOCHS_REPORTED) {
    r->epoch_samples[r->nepochs] += n;
    r->epoch_end[r->nepochs] = t;
  }
}

/* Batch B counted, digested and its keys kept as asked, then released (after the GPU consumer's
 * step, with --step-ms); 0, or 1 when the consumer failed. */
static int consume(run *r, dl_batch *b) {
  const args *a = r->a;
  if (r->first_ms < 0) {
    r->first_ms = (now() - r->t0) * 1000;
    r->first_samples = dl_batch_size(b);
  }
  /* Every field counts (images, labels, tensors): the step kernel reads the first. */
  DLTensor img;
  dl_batch_field(b, dl_batch_field_name(b, 0), &img);
  int n = dl_batch_size(b);
  size_t nbytes = 0;
  if (a->digest)
    XXH3_64bits_reset(r->one);
  for (int f = 0; f < dl_batch_field_count(b); f++) {
    DLTensor t;
    dl_batch_field(b, dl_batch_field_name(b, f), &t);
    size_t tb = (size_t)(t.dtype.bits / 8);
    for (int d = 0; d < t.ndim; d++)
      tb *= (size_t)t.shape[d];
    nbytes += tb;
    if (a->digest)
      digest_field(r, b, &t, tb);
  }
  /* Bytes fields (captions, JSON, MDS text columns) too: each sample's length, then its bytes. */
  for (int f = 0; a->digest && f < dl_batch_bytes_count(b); f++)
    for (int i = 0; i < n; i++) {
      size_t len = 0;
      const void *p = dl_batch_bytes(b, dl_batch_bytes_name(b, f), i, &len);
      uint64_t len64 = p ? (uint64_t)len : UINT64_MAX;
      XXH3_64bits_update(r->one, &len64, sizeof len64);
      XXH3_64bits_update(r->all, &len64, sizeof len64);
      if (p && len) {
        XXH3_64bits_update(r->one, p, len);
        XXH3_64bits_update(r->all, p, len);
      }
    }
  int64_t ep, ix;
  dl_batch_position(b, &ep, &ix);
  count_epoch(r, ep, n);
  if (a->digest && a->json)
    text_add(&r->batch_digests, "%s\"%" PRId64 ":%" PRId64 " %016llx\"", r->batches ? "," : "", ep, ix,
             (unsigned long long)XXH3_64bits_digest(r->one));
  else if (a->digest)
    printf("batch %" PRId64 ":%" PRId64 " %016llx\n", ep, ix, (unsigned long long)XXH3_64bits_digest(r->one));
  if (a->keys && a->json) {
    text_add(&r->batch_keys, "%s[", r->batches ? "," : "");
    for (int i = 0; i < n; i++) {
      text_add(&r->batch_keys, "%s", i ? "," : "");
      text_add_string(&r->batch_keys, dl_batch_key(b, i));
    }
    text_add(&r->batch_keys, "]");
  } else if (a->keys) {
    printf("keys %" PRId64 ":%" PRId64, ep, ix);
    for (int i = 0; i < n; i++)
      printf(" %s", dl_batch_key(b, i));
    printf("\n");
  }
  r->samples += n;
  r->bytes += (int64_t)nbytes;
  r->batches++;
#ifdef DL_WITH_CUDA
  if (r->gs) { /* the step kernel reads the batch, then the batch is released on its stream */
    if (gpu_step_consume(r->gs, b, &img)) {
      fprintf(stderr, "dlbench: GPU consumer: %s\n", gpu_step_error());
      dl_batch_release(b, NULL);
      return 1;
    }
  } else
#endif
    dl_batch_release(b, NULL);
  double t = now();
  if (r->tty && t - r->last_print > 0.25) {
    fprintf(stderr, "\r%8" PRId64 " samples  %8.0f samples/s  %6" PRId64 " batches", r->samples,
            r->samples / (t - r->t0), r->batches);
    r->last_print = t;
  }
  return 0;
}

/* What the run ended with, for the report: from the loader's stats and the process. */
typedef struct outcome {
  double wall, cpu, steady, h2d, rss_mb, wait;
  double mem_before, mem_open, mem_end; /* device memory in use, MB: -1 without a device */
  double idle;                          /* the GPU consumer's idle share, -1 without --step-ms */
  long long errors;
  char io[32], decode[16], token[256], stats[8192];
#ifdef DL_WITH_CUDA
  gpu_step_idle gaps;
#endif
} outcome;

static int epochs_reported(const run *r) {
  return r->batches > 1 ? (r->nepochs < MAX_EPOCHS_REPORTED ? r->nepochs + 1 : MAX_EPOCHS_REPORTED) : 0;
}

/* Epoch K's samples a second, from the batch that ended the epoch before (the first batch for K 0). */
static double epoch_rate(const run *r, int k) {
  double span = r->epoch_end[k] - (k ? r->epoch_end[k - 1] : r->epoch_t0);
  return span > 0 ? (double)r->epoch_samples[k] / span : 0;
}

static void report_json(const run *r, const outcome *o) {
  const args *a = r->a;
  const char *stats = o->stats;
  printf("{\"samples\":%" PRId64 ",\"batches\":%" PRId64 ",\"wall_s\":%.6f,\"samples_per_s\":%.3f"
         ",\"bytes_per_s\":%.1f,\"first_batch_ms\":%.3f,\"consumer_wait_s\":%.6f,\"errors\":%lld"
         ",\"workers\":%d,\"io_backend\":\"%s\",\"device\":\"%s\",\"decode_backend\":\"%s\""
         ",\"peak_rss_mb\":%.1f,\"steady_samples_per_s\":%.3f,\"cpu_s\":%.3f",
         r->samples, r->batches, o->wall, r->samples / o->wall, r->bytes / o->wall, r->first_ms, o->wait, o->errors,
         (int)stat_of(stats, "workers"), o->io, a->device, o->decode, o->rss_mb, o->steady, o->cpu);
#ifdef DL_WITH_CUDA
  if (o->idle >= 0) {
    printf(",\"gpu_idle_frac\":%.6f,\"step_ms\":%.3f,\"gpu_idle_gaps_over_1ms\":%ld,\"gpu_idle_over_1ms_ms\":%.3f"
           ",\"gpu_idle_largest\":[", o->idle, a->step_ms, o->gaps.gaps_over_1ms, o->gaps.over_1ms_ms);
    for (int i = 0; i < o->gaps.nlargest; i++)
      printf("%s{\"step\":%ld,\"ms\":%.3f}", i ? "," : "", o->gaps.largest[i].step, o->gaps.largest[i].ms);
    printf("]");
  }
#endif
  printf(",\"epochs_samples_per_s\":[");
  for (int k = 0; k < epochs_reported(r); k++)
    printf("%s%.3f", k ? "," : "", epoch_rate(r, k));
  printf("]");
  if (o->h2d >= 0)
    printf(",\"h2d_gb_s\":%.3f", o->h2d);
  if (o->mem_before >= 0)
    printf(",\"device_mem_open_mb\":%.1f,\"device_mem_end_mb\":%.1f", o->mem_open - o->mem_before,
           o->mem_end - o->mem_before);
  if (a->digest)
    printf(",\"digest\":\"%016llx\",\"batch_digests\":[%s]", (unsigned long long)XXH3_64bits_digest(r->all),
           r->batch_digests.p ? r->batch_digests.p : "");
  if (a->keys)
    printf(",\"keys\":[%s]", r->batch_keys.p ? r->batch_keys.p : "");
  printf(",\"state\":\"%s\",\"loader\":%s}\n", o->token, stats);
}

static void report_text(const run *r, const outcome *o) {
  const args *a = r->a;
  const char *stats = o->stats;
  printf("%" PRId64 " samples in %" PRId64 " batches, %.2f s: %.1f samples/s (%.1f after the first batch), "
         "%.1f MB/s delivered\n",
         r->samples, r->batches, o->wall, r->samples / o->wall, o->steady, r->bytes / o->wall / 1e6);
  if (epochs_reported(r) > 1) {
    printf("samples/s by epoch (the first after its first batch):");
    for (int k = 0; k < epochs_reported(r); k++)
      printf(" %.0f", epoch_rate(r, k));
    printf("\n");
  }
  char first[32] = "first batch none"; /* a run that failed or stopped before one */
  if (r->first_ms >= 0)
    snprintf(first, sizeof first, "first batch %.1f ms", r->first_ms);
  int workers = (int)stat_of(stats, "workers");
  printf("%s, consumer waited %.3f s, %lld errors, %d worker%s, io %s, device %s, JPEG decode %s, peak RSS %.0f MB\n",
         first, o->wait, o->errors, workers, workers == 1 ? "" : "s", o->io, a->device, o->decode, o->rss_mb);
  printf("CPU time %.2f s in all threads: %.1f CPUs on average, %.3f ms a sample\n", o->cpu,
         o->wall > 0 ? o->cpu / o->wall : 0.0, r->samples ? o->cpu * 1e3 / (double)r->samples : 0.0);
#ifdef DL_WITH_CUDA
  if (o->idle >= 0)
    printf("GPU idle %.4f of the time between steps of %.2f ms: %ld gaps over 1 ms (%.1f ms in all), the "
           "largest %.2f ms before step %ld\n", o->idle, a->step_ms, o->gaps.gaps_over_1ms, o->gaps.over_1ms_ms,
           o->gaps.nlargest ? o->gaps.largest[0].ms : 0.0, o->gaps.nlargest ? o->gaps.largest[0].step : 0L);
#endif
  if (o->h2d >= 0)
    printf("host-to-device copies %.2f GB/s; the GPU stage's stream busy %.1f%% of the time\n", o->h2d,
           100 * stat_of(stats, "gpu_stage_busy_frac"));
  printf("dl_open %.1f ms: index %.1f, devices %.1f, GPU JPEG decoders %.1f, batch slots %.1f, workers %.1f\n",
         stat_of(stats, "open_ms"), stat_of(stats, "open_index_ms"), stat_of(stats, "open_cuda_ms"),
         stat_of(stats, "open_gpu_decode_ms"), stat_of(stats, "open_slots_ms"), stat_of(stats, "open_workers_ms"));
  if (stat_of(stats, "pin_ms") > 0 || stat_of(stats, "gpu_decoders_start_ms") > 0)
    printf("meanwhile, while the workers decoded: batch slots pinned in %.1f ms, nvJPEG started in %.1f ms\n",
           stat_of(stats, "pin_ms"), stat_of(stats, "gpu_decoders_start_ms"));
  double requests = stat_of(stats, "requests"), hits = stat_of(stats, "cache_hits");
  if (requests || hits)
    printf("remote: %.0f requests (%.3f per sample), %.0f retries, %.1f MB of samples read\n", requests,
           r->samples ? requests / r->samples : 0.0, stat_of(stats, "retries"), stat_of(stats, "bytes_read") / 1e6);
  if (strstr(a->opts, "cache_dir="))
    printf("shard cache: %.0f samples read from cached shards, %.0f shards (%.1f MB) fetched whole\n", hits,
           stat_of(stats, "cache_fetches"), stat_of(stats, "cache_fetch_bytes") / 1e6);
  char word[32], why[400];
  if (stat_of(stats, "workers_active") != stat_of(stats, "workers"))
    printf("workers at work at the end: %.0f of %.0f (%s)\n", stat_of(stats, "workers_active"),
           stat_of(stats, "workers"), text_of(stats, "workers_active_why", why, sizeof why));
  printf("bottleneck: %s (%s)\n", text_of(stats, "bottleneck", word, sizeof word),
         text_of(stats, "bottleneck_why", why, sizeof why));
}

/* The loader's own figures, out of its stats object, and the process's, for the report. */
static void conclude(dl_loader *l, run *r, outcome *o, double cpu0) {
  o->wall = now() - r->t0;
  o->cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
#ifdef DL_WITH_CUDA
  if (o->mem_before >= 0)
    o->mem_end = gpu_used_mb(r->a->device);
#endif
  if (r->tty)
    fprintf(stderr, "\r%60s\r", "");
  strcpy(o->stats, "{}");
  dl_stats_json(l, o->stats, sizeof o->stats);
  dl_state_save(l, o->token, sizeof o->token);
  const char *stats = o->stats, *p = strstr(stats, "\"h2d_gb_s\":");
  o->h2d = p ? atof(p + 11) : -1;
  o->idle = -1;
#ifdef DL_WITH_CUDA
  if (r->gs) {
    gpu_step_close(r->gs, &o->gaps);
    o->idle = o->gaps.frac;
  }
#endif
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  o->rss_mb = ru.ru_maxrss / 1024.0;
  strcpy(o->io, "?");
  strcpy(o->decode, "?");
  if ((p = strstr(stats, "\"errors\":")))
    o->errors = atoll(p + 9);
  if ((p = strstr(stats, "\"io_backend\":\"")))
    sscanf(p + 14, "%31[^\"]", o->io);
  p = strstr(stats, "\"consumer_wait_s\":");
  o->wait = p ? atof(p + 18) : 0;
  if ((p = strstr(stats, "\"decode_backend\":\"")))
    sscanf(p + 18, "%15[^\"]", o->decode);
  /* The rate after the first batch: start-up (CUDA's included) left out. */
  double after = o->wall - r->first_ms / 1000;
  o->steady = after > 0 ? (r->samples - r->first_samples) / after : 0;
}

/* Whether a loader's JPEG decoding on the GPU has yet to run: decode=auto's nvJPEG still starting,
 * or a GPU decoder that has decoded nothing. */
static bool gpu_decode_pending(dl_loader *l) {
  char stats[8192], backend[16], why[512];
  if (dl_stats_json(l, stats, sizeof stats))
    return false;
  if (strstr(text_of(stats, "decode_reason", why, sizeof why), "nvJPEG is starting"))
    return true;
  text_of(stats, "decode_backend", backend, sizeof backend);
  return (!strcmp(backend, "gpu") || !strcmp(backend, "hybrid")) && stat_of(stats, "gpu_decoded") == 0;
}

/* --second-loader: a loader of the same source and options opened, one epoch taken and closed, so
 * that the measured one finds what a training loop's later epochs find: its decoders kept, and
 * used. A first epoch over before nvJPEG was ready (a small set) goes on, up to another epoch,
 * until the GPU has decoded: decoders that had never decoded made the second loader's first epoch
 * slower (an H100 host, q90: 25,400-26,400 images/s against 32,200-32,400), which no training
 * loop's later epoch meets. 0, or the exit status. */
static int first_loader(const char *source, const char *opts) {
  dl_loader *l;
  dl_batch *b;
  int rc = dl_open(&l, source, opts);
  if (rc) {
    fprintf(stderr, "dlbench: the first loader: %s: %s\n", dl_errname(rc), dl_last_error());
    return 1;
  }
  int64_t epoch = dl_batches_per_epoch(l), taken = 0;
  while ((rc = dl_next_batch(l, &b)) == 0) {
    dl_batch_release(b, NULL);
    if (++taken >= epoch && (taken >= 2 * epoch || !gpu_decode_pending(l)))
      break;
  }
  if (rc != 0 && rc != DL_EOF)
    fprintf(stderr, "dlbench: the first loader: %s: %s\n", dl_errname(rc), dl_last_error());
  dl_close(l);
  return rc == 0 || rc == DL_EOF ? 0 : 1;
}

int main(int argc, char **argv) {
  args a;
  int status = parse_args(argc, argv, &a);
  if (status >= 0)
    return status;
  char *source = make_source(argc, argv, &a, &status);
  if (!source)
    return status;
  if (a.make_only) {
    printf("%s\n", source);
    free(source);
    return 0;
  }
  if (a.second_loader && (status = first_loader(source, a.opts))) {
    free(source);
    return status;
  }
  /* The device memory the loader takes: in use before it opens (CUDA started), after, and at the end. */
  outcome o = {.mem_before = -1, .mem_open = -1, .mem_end = -1};
#ifdef DL_WITH_CUDA
  if (strncmp(a.device, "cuda", 4) == 0)
    o.mem_before = gpu_used_mb(a.device);
#endif
  run r = {.a = &a, .first_ms = -1, .tty = isatty(2) && !a.json};
  r.t0 = r.last_print = now();
  double cpu0 = clock_s(CLOCK_PROCESS_CPUTIME_ID); /* what the loader costs the host's CPUs */
  dl_loader *l;
  int rc = dl_open(&l, source, a.opts);
  if (rc) {
    fprintf(stderr, "dlbench: %s: %s\n", dl_errname(rc), dl_last_error());
    free(source);
    return 1;
  }
#ifdef DL_WITH_CUDA
  if (o.mem_before >= 0)
    o.mem_open = gpu_used_mb(a.device);
  if ((a.step_ms > 0 || a.digest) && strncmp(a.device, "cuda", 4) == 0 &&
      gpu_step_open(&r.gs, a.device, a.step_ms, a.step_kernel_ms)) {
    fprintf(stderr, "dlbench: GPU consumer: %s\n", gpu_step_error());
    dl_close(l);
    free(source);
    return 1;
  }
#else
  if (a.step_ms > 0) {
    fprintf(stderr, "dlbench: --step-ms and --step-kernel-ms need a build with CUDA\n");
    dl_close(l);
    free(source);
    return 2;
  }
#endif
  r.all = XXH3_createState();
  r.one = XXH3_createState();
  XXH3_64bits_reset(r.all);
  if (a.first_after_ms > 0) /* the loader works meanwhile: nvJPEG's start, the first batches */
    nanosleep(&(struct timespec){a.first_after_ms / 1000, a.first_after_ms % 1000 * 1000000}, NULL);
  while (a.stop_after < 0 || r.batches < a.stop_after) {
    dl_batch *b;
    int e = dl_next_batch(l, &b);
    if (e == DL_EOF)
      break;
    if (e < 0) {
      fprintf(stderr, "dlbench: %s: %s\n", dl_errname(e), dl_last_error());
      rc = 1;
      break;
    }
    if ((rc = consume(&r, b)))
      break;
  }
  conclude(l, &r, &o, cpu0);
  if (a.digest && !a.json)
    printf("digest %016llx\n", (unsigned long long)XXH3_64bits_digest(r.all));
  if (a.stop_after >= 0 && !a.json)
    printf("state %s\n", o.token);
  (a.json ? report_json : report_text)(&r, &o);
  free(r.host_copy);
  free(r.batch_digests.p);
  free(r.batch_keys.p);
  free(source);
  XXH3_freeState(r.all);
  XXH3_freeState(r.one);
  dl_close(l);
  return rc;
}
