/* Parses "key=value key=value" option strings; the same keys as the Python keywords. */
#include "options.h"

#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void set_defaults(dl__options *o) {
  memset(o, 0, sizeof *o);
  o->batch_size = 256;
  o->workers = 0;  /* auto: chosen at open from the CPUs this process may use */
  o->prefetch = 0; /* auto: chosen at open from the slots' size and memory_budget */
  o->height = o->width = 224;
  o->crop = DL__CROP_RANDOM_RESIZED;
  o->channels = 3;
  o->layout = DL__LAYOUT_NHWC;
  o->shuffle = 1;
  o->epochs = 1;
  o->world_size = 1;
  const char *ranks = getenv("LOCAL_WORLD_SIZE"), *rank = getenv("LOCAL_RANK");
  o->host_ranks = ranks && atoi(ranks) > 0 ? atoi(ranks) : 1;
  o->host_rank = rank && atoi(rank) > 0 && atoi(rank) < o->host_ranks ? atoi(rank) : 0;
  o->dtype = DL__DTYPE_UINT8;
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  memcpy(o->mean, mean, sizeof mean);
  memcpy(o->std, std, sizeof std);
  o->device_slots = 3;
  o->worker_nice = 0;
  o->on_error = DL__ON_ERROR_SKIP;
  o->io = DL__IO_AUTO;
  o->io_depth = 0; /* 16 for local files, 64 for remote ones (dl_open), unless given */
  o->max_pixels = 64ll << 20;
  o->max_member_bytes = 256ll << 20;
  /* DL_LOG_LEVEL, else warn: not whatever the last loader asked for (log=quiet there would
   * silence every loader opened after it). */
  const char *env = getenv("DL_LOG_LEVEL");
  o->log_level = env && *env >= '0' && *env <= '4' && !env[1] ? *env - '0' : DL__LOG_WARN;
  o->decode = DL__DECODE_AUTO;
  o->gpu_decode_mb = 256;
  o->gpu_share = -1;
  o->gpu_check = 1;
  o->keep_gpu_decoders = 1;
  o->retries = 5;
  o->timeout_ms = 30000;
}

static int bad(const char *key, const char *value, const char *why) {
  return dl__fail(DL_EOPTION, "option %s=%s: %s", key, value, why);
}

static int parse_int(const char *key, const char *v, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end)
    return bad(key, v, "not an integer");
  if (x < lo || x > hi)
    return dl__fail(DL_EOPTION, "option %s=%s: out of range [%lld, %lld]", key, v, (long long)lo,
                    (long long)hi);
  *out = x;
  return 0;
}

/* A byte count: digits with an optional K, M, G or T (powers of 1024, "iB" or "B" may follow). */
static int parse_bytes(const char *key, const char *v, int64_t *out) {
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || end == v || *v == '-' || *v == '+')
    return bad(key, v, "expected a size such as 50G, 512M or 1000000");
  int shift = 0;
  const char *units = "KMGT", *u = *end ? strchr(units, *end & ~0x20) : NULL;
  if (u) {
    shift = 10 * (int)(u - units + 1);
    end++;
    if ((*end == 'i' || *end == 'I') && (end[1] == 'B' || end[1] == 'b'))
      end += 2;
    else if (*end == 'B' || *end == 'b')
      end++;
  }
  if (*end)
    return bad(key, v, "expected a size such as 50G, 512M or 1000000");
  if (x > (unsigned long long)INT64_MAX >> shift)
    return bad(key, v, "too large");
  *out = (int64_t)(x << shift);
  return 0;
}

static int parse_bool(const char *key, const char *v, int *out) {
  if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "True")) {
    *out = 1;
    return 0;
  }
  if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "False")) {
    *out = 0;
    return 0;
  }
  return bad(key, v, "expected 0 or 1");
}

/* One of NAMES, as the user wrote it: case, and '-' for '_', do not matter (layout=nhwc,
 * channels-last); a value a letter or two off is refused with the one it likely meant. */
static int parse_choice(const char *key, const char *v, const char *const *names, int n, int *out) {
  int near = -1, least = DL__NEAR_EDITS;
  for (int i = 0; i < n; i++)
    if (names[i] && dl__nearer(v, names[i], &least))
      near = i;
  if (near >= 0 && least == 0) {
    *out = near;
    return 0;
  }
  char why[256] = "expected one of";
  for (int i = 0; i < n; i++)
    if (names[i]) {
      strncat(why, " ", sizeof why - strlen(why) - 1);
      strncat(why, names[i], sizeof why - strlen(why) - 1);
    }
  if (near >= 0)
    snprintf(why + strlen(why), sizeof why - strlen(why), " (did you mean %s?)", names[near]);
  return bad(key, v, why);
}

/* Whether strtod/strtof read only a plain decimal number from P up to END: not hex (0x10 is 16 to
 * strtod), inf or nan, nor spaces before it. */
static bool decimal(const char *p, const char *end) {
  return end > p && end <= p + strspn(p, "0123456789.eE+-");
}

static int parse_floats3(const char *key, const char *v, float out[3]) {
  const char *p = v;
  for (int i = 0; i < 3; i++) {
    char *end;
    errno = 0;
    float x = strtof(p, &end);
    if (errno || !decimal(p, end) || !(x == x))
      return bad(key, v, "expected three numbers a,b,c");
    out[i] = x;
    if (i < 2 && *end != ',')
      return bad(key, v, "expected three numbers a,b,c");
    p = end + (i < 2);
    if (i == 2 && *end)
      return bad(key, v, "expected three numbers a,b,c");
  }
  return 0;
}

/* repeat=R1,R2,...: one factor per "::" part of the source, each 0..1000. */
static int parse_repeat(const char *key, const char *v, dl__options *o) {
  const char *p = v;
  o->nrepeat = 0;
  for (;;) {
    char *end;
    errno = 0;
    double x = strtod(p, &end);
    if (errno || !decimal(p, end) || !(x >= 0 && x <= 1000) || (*end && *end != ','))
      return bad(key, v, "expected a factor from 0 to 1000 for each '::' part of the source, such as 0.5,2");
    if (o->nrepeat == DL__MAX_PARTS)
      return bad(key, v, "more than 256 factors");
    o->repeat[o->nrepeat++] = x;
    if (!*end)
      return 0;
    p = end + 1;
  }
}

static int parse_size(const char *key, const char *v, dl__options *o) {
  int64_t h, w;
  const char *x = strchr(v, 'x');
  if (!x)
    x = strchr(v, 'X');
  if (!x && strpbrk(v, ",*")) /* 224,160 as a tuple is written: one 'x' between them here */
    return bad(key, v, "expected N or HxW, such as 224x160");
  if (!x) {
    if (parse_int(key, v, 1, 16384, &h))
      return DL_EOPTION;
    o->height = o->width = (int)h;
    return 0;
  }
  char hs[32];
  size_t n = (size_t)(x - v);
  if (n == 0 || n >= sizeof hs)
    return bad(key, v, "expected N or HxW");
  memcpy(hs, v, n);
  hs[n] = 0;
  if (parse_int(key, hs, 1, 16384, &h) || parse_int(key, x + 1, 1, 16384, &w))
    return dl__fail(DL_EOPTION, "option %s=%s: expected N or HxW, each 1..16384", key, v);
  o->height = (int)h;
  o->width = (int)w;
  return 0;
}

static int parse_device(const char *key, const char *v, dl__options *o) {
  if (!strcmp(v, "cpu")) {
    o->ndevices = 0;
    return 0;
  }
  if (strncmp(v, "cuda", 4))
    return bad(key, v, "expected cpu, cuda, cuda:N or cuda:N,M,...");
  if (v[4] == 0) {
    const char *lr = getenv("LOCAL_RANK");
    int64_t id = 0;
    if (lr && *lr && parse_int("LOCAL_RANK", lr, 0, 1023, &id))
      return DL_EOPTION;
    o->ndevices = 1;
    o->device_ids[0] = (int)id;
    return 0;
  }
  if (v[4] != ':')
    return bad(key, v, "expected cpu, cuda, cuda:N or cuda:N,M,...");
  const char *p = v + 5;
  o->ndevices = 0;
  for (;;) {
    char *end;
    errno = 0;
    long id = strtol(p, &end, 10);
    if (errno || end == p || id < 0 || id > 1023 || (*end && *end != ','))
      return bad(key, v, "expected cpu, cuda, cuda:N or cuda:N,M,...");
    if (o->ndevices == DL__MAX_DEVICES)
      return bad(key, v, "too many devices");
    for (int i = 0; i < o->ndevices; i++)
      if (o->device_ids[i] == id)
        return bad(key, v, "a device is listed twice");
    o->device_ids[o->ndevices++] = (int)id;
    if (!*end)
      break;
    p = end + 1;
  }
  return 0;
}

/* The special parsers' signature: the table's PARSE (key, value, the options). */
static int parse_seed(const char *key, const char *v, dl__options *o) {
  char *end;
  errno = 0;
  /* Decimal, or hex after 0x; not octal: a zero-padded seed ("010") is ten, as in Python. */
  bool hex = v[0] == '0' && (v[1] == 'x' || v[1] == 'X');
  unsigned long long s = strtoull(v, &end, hex ? 16 : 10);
  if (errno == ERANGE)
    return bad(key, v, "above 2^64-1, the largest seed");
  if (errno || end == v || *end || v[0] == '-' || v[0] == '+' || v[0] == ' ')
    return bad(key, v, "expected a non-negative integer");
  o->seed = s;
  return 0;
}

static int parse_channels(const char *key, const char *v, dl__options *o) {
  int64_t x;
  int r = parse_int(key, v, 1, 3, &x);
  if (r)
    return r;
  if (x == 2)
    return bad(key, v, "expected 1 or 3");
  o->channels = (int)x;
  return 0;
}

static int parse_gpu_share(const char *key, const char *v, dl__options *o) {
  if (!strcmp(v, "auto")) {
    o->gpu_share = -1;
    return 0;
  }
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || !decimal(v, end) || *end || !(x >= 0 && x <= 1))
    return bad(key, v, "expected auto or a fraction from 0 to 1");
  o->gpu_share = x;
  return 0;
}

static int parse_mean(const char *key, const char *v, dl__options *o) {
  o->mean_std_given = true;
  return parse_floats3(key, v, o->mean);
}

static int parse_std(const char *key, const char *v, dl__options *o) {
  o->mean_std_given = true;
  int r = parse_floats3(key, v, o->std);
  if (r)
    return r;
  for (int i = 0; i < 3; i++)
    if (o->std[i] == 0)
      return bad(key, v, "std must not be zero");
  return 0;
}

static int parse_memory_budget(const char *key, const char *v, dl__options *o) {
  if (!strcmp(v, "auto")) {
    o->memory_budget = 0;
    return 0;
  }
  int r = parse_bytes(key, v, &o->memory_budget);
  return r ? r : o->memory_budget ? 0 : bad(key, v, "must be above zero");
}

static int parse_cache_limit(const char *key, const char *v, dl__options *o) {
  int r = parse_bytes(key, v, &o->cache_limit);
  return r ? r : o->cache_limit ? 0 : bad(key, v, "must be above zero");
}

static int parse_fields(const char *key, const char *v, dl__options *o) {
  if (strlen(v) >= sizeof o->fields)
    return bad(key, v, "list too long");
  if (!*v || strstr(v, ",,") || *v == ',' || v[strlen(v) - 1] == ',')
    return bad(key, v, "expected field names separated by commas");
  strcpy(o->fields, v);
  return 0;
}

enum { INT, BOOL, CHOICE, TEXT, SPECIAL };

/* "auto" for a count or size the loader chooses at open: 0 in the field. */
#define AUTO_ZERO 1
/* A text that may not be empty. */
#define NOT_EMPTY 2

typedef struct option {
  const char *name;
  int type;
  int64_t lo, hi;                /* INT: the range */
  size_t at, size;               /* the field: offsetof and sizeof in dl__options */
  const char *const *choices;    /* CHOICE: the values, NULL-terminated, by index */
  int (*parse)(const char *key, const char *v, dl__options *o); /* SPECIAL */
  int flags;                     /* AUTO_ZERO, NOT_EMPTY */
  const char *why_long;          /* TEXT: what a value too long is */
  const char *help;              /* what it is, its values and default: the docs' option list */
} option;

#define FIELD(f) .at = offsetof(dl__options, f), .size = sizeof(((dl__options *)0)->f)
#define NAMES(...) (const char *const[]){__VA_ARGS__, NULL}

static const option options[] = {
    {"batch_size", INT, 1, 1 << 20, FIELD(batch_size), .help = "samples per batch (256)"},
    {"workers", INT, 1, 1024, FIELD(workers), .flags = AUTO_ZERO,
     .help = "decoding threads: a number, or auto (the default: the CPUs this process may use, shared by the host's "
             "ranks, less one for each GPU that decodes JPEGs)"},
    {"prefetch", INT, 1, 1024, FIELD(prefetch), .flags = AUTO_ZERO,
     .help = "host batch slots: a number, or auto (the default: 4, fewer when memory_budget does not hold them)"},
    {"epochs", INT, 0, INT64_MAX / 2, FIELD(epochs), .help = "epochs of the run; 0 runs forever (1)"},
    {"start_epoch", INT, 0, INT64_MAX / 4, FIELD(start_epoch), .help = "the run's first epoch (0)"},
    {"rank", INT, 0, 1 << 20, FIELD(rank), .help = "this process's share of every epoch (0)"},
    {"world_size", INT, 1, 1 << 20, FIELD(world_size), .help = "processes sharing every epoch (1)"},
    {"device_slots", INT, 1, 64, FIELD(device_slots), .help = "device batch slots per GPU (3)"},
    {"worker_nice", INT, 0, 19, FIELD(worker_nice),
     .help = "how much lower the workers' CPU priority is than the process's (a nice increment): the training "
             "loop's thread and the copy thread win a contested core, the workers still take every idle one (0; hybrid "
             "decoding holds them at 4 at least)"},
    {"io_depth", INT, 1, 4096, FIELD(io_depth), .help = "reads in flight per worker (16 local, 64 remote)"},
    {"max_pixels", INT, 1, INT64_C(1) << 40, FIELD(max_pixels), .help = "largest image, in pixels (64 Mi)"},
    {"max_member_bytes", INT, 1, INT64_C(1) << 40, FIELD(max_member_bytes),
     .help = "largest sample record or member, in bytes (256 MiB)"},
    {"seq_len", INT, 1, 1 << 24, FIELD(seq_len), .help = "tokens a sample of a token source (none)"},
    {"gpu_decode_mb", INT, 16, 1 << 20, FIELD(gpu_decode_mb), .help = "device memory per GPU for decoded JPEGs (256)"},
    {"retries", INT, 0, 100, FIELD(retries), .help = "remote sources: attempts after a failed request's first (5)"},
    {"timeout_ms", INT, 1, 3600000, FIELD(timeout_ms),
     .help = "remote sources: a connection or a body that stops coming fails after this long (30000)"},
    {"shuffle_block", INT, 0, 1 << 24, FIELD(shuffle_block),
     .help = "0: shuffle the whole dataset; K: shuffle shards, then samples within blocks of K shards (0)"},
    {"seed", SPECIAL, .parse = parse_seed, .help = "the seed of order and augmentation, decimal or 0x hex (0)"},
    {"channels", SPECIAL, .parse = parse_channels, .help = "3 (RGB) or 1 (grey) (3)"},
    {"image_size", SPECIAL, .parse = parse_size, .help = "output size, N or HxW (224)"},
    {"crop", CHOICE, FIELD(crop), .choices = NAMES("random_resized", "center", "resize", "none"),
     .help = "random_resized, center, resize or none (random_resized)"},
    {"layout", CHOICE, FIELD(layout), .choices = NAMES("NHWC", "NCHW", "channels_last"),
     .help = "NHWC, NCHW, or channels_last: NCHW's shape over NHWC memory, what a PyTorch model in channels_last reads without a copy (NHWC)"},
    {"dtype", CHOICE, FIELD(dtype),
     .choices = NAMES("uint8", "float32", "float16", "bfloat16", "uint16", "uint32"),
     .help = "uint8, or float32, float16, bfloat16 normalised with mean and std; uint16 or uint32 for a token "
             "source (uint8)"},
    {"on_error", CHOICE, FIELD(on_error), .choices = NAMES("skip", "fail"),
     .help = "skip (a bad sample becomes zeros, named and counted) or fail (skip)"},
    {"io", CHOICE, FIELD(io), .choices = NAMES("auto", "uring", "pread", "mmap"),
     .help = "how local files are read: auto, uring, pread or mmap (auto)"},
    {"log", CHOICE, FIELD(log_level), .choices = NAMES("quiet", "error", "warn", "info", "debug"),
     .help = "how much the loader says on stderr (warn, or DL_LOG_LEVEL 0-4)"},
    {"decode", CHOICE, FIELD(decode), .choices = NAMES("auto", "cpu", "gpu", "hybrid"),
     .help = "where JPEGs are decoded: auto, cpu, gpu or hybrid (auto)"},
    {"s3_addressing", CHOICE, FIELD(s3_addressing), .choices = NAMES("auto", "path", "virtual"),
     .help = "S3 URLs as endpoint/bucket/key or bucket.host/key (auto)"},
    {"gpu_share", SPECIAL, .parse = parse_gpu_share,
     .help = "hybrid's GPU share of each batch: auto, or fixed from 0 to 1 (auto)"},
    {"flip", BOOL, FIELD(flip), .help = "random horizontal flips, 0 or 1 (0)"},
    {"shuffle", BOOL, FIELD(shuffle), .help = "shuffle every epoch, 0 or 1 (1)"},
    {"drop_last", BOOL, FIELD(drop_last), .help = "leave out an epoch's last, short batch, 0 or 1 (0)"},
    {"direct", BOOL, FIELD(direct), .help = "O_DIRECT reads of ringfeed shards, 0 or 1 (0)"},
    {"pad", BOOL, FIELD(pad), .help = "tensor fields padded to the dataset's largest, with NAME_len, 0 or 1 (0)"},
    {"gpu_check", BOOL, FIELD(gpu_check),
     .help = "read a JPEG's data through before its first GPU decode is delivered, 0 or 1 (1)"},
    {"keep_gpu_decoders", BOOL, FIELD(keep_gpu_decoders),
     .help = "after close, nvJPEG's decoders (their gpu_decode_mb and nvJPEG's buffers) stay in the process for "
             "its next loader of the same batch size, which then decodes on the GPU from its first batch, 0 or 1 "
             "(1)"},
    {"mean", SPECIAL, .parse = parse_mean,
     .help = "three means, pixels as 0..1 (ImageNet's 0.485,0.456,0.406); float dtypes only"},
    {"std", SPECIAL, .parse = parse_std,
     .help = "three deviations, pixels as 0..1 (ImageNet's 0.229,0.224,0.225); float dtypes only"},
    {"repeat", SPECIAL, .parse = parse_repeat,
     .help = "times each '::' part of the source is seen an epoch, such as 0.5,2 (each once)"},
    {"device", SPECIAL, .parse = parse_device, .help = "cpu, cuda, cuda:N or cuda:N,M,... (cpu)"},
    {"resume", TEXT, FIELD(resume), .why_long = "token too long", .help = "a saved state's token (none)"},
    {"memory_budget", SPECIAL, .parse = parse_memory_budget,
     .help = "bytes the batch slots may take, such as 8G, or auto (an eighth of the host's memory)"},
    {"cache_limit", SPECIAL, .parse = parse_cache_limit, .help = "bytes cache_dir may hold, such as 50G (its disk)"},
    {"cache_dir", TEXT, FIELD(cache_dir), .flags = NOT_EMPTY, .why_long = "path too long",
     .help = "a folder that keeps remote shards and uncompressed copies (none)"},
    {"ca_file", TEXT, FIELD(ca_file), .why_long = "path too long",
     .help = "remote sources: a CA bundle for TLS (the system's)"},
    {"fields", SPECIAL, .parse = parse_fields, .help = "the only fields delivered, a,b,... (all)"},
};

/* The option a mistyped KEY most likely meant (imagesize, batch-size, shufle), or NULL. */
static const char *nearest_option(const char *key) {
  const char *near = NULL;
  int least = DL__NEAR_EDITS;
  for (size_t i = 0; i < DL__ARRAY_LEN(options); i++)
    if (dl__nearer(key, options[i].name, &least))
      near = options[i].name;
  return near;
}

static int unknown(const char *key) {
  const char *near = nearest_option(key);
  return near ? dl__fail(DL_EOPTION, "unknown option '%s' (did you mean %s?)", key, near)
              : dl__fail(DL_EOPTION, "unknown option '%s'", key);
}

static int apply(dl__options *o, const char *key, const char *v) {
  for (size_t i = 0; i < DL__ARRAY_LEN(options); i++) {
    const option *op = &options[i];
    if (strcmp(key, op->name))
      continue;
    void *field = (char *)o + op->at;
    if ((op->flags & AUTO_ZERO) && !strcmp(v, "auto")) {
      *(int *)field = 0;
      return 0;
    }
    int64_t x;
    int r = 0, n = 0;
    switch (op->type) {
    case INT:
      if ((r = parse_int(key, v, op->lo, op->hi, &x)))
        return r;
      if (op->size == sizeof(int64_t))
        *(int64_t *)field = x;
      else
        *(int *)field = (int)x;
      return 0;
    case BOOL:
      return parse_bool(key, v, (int *)field);
    case CHOICE:
      while (op->choices[n])
        n++;
      return parse_choice(key, v, op->choices, n, (int *)field);
    case TEXT:
      if ((op->flags & NOT_EMPTY) && !*v)
        return bad(key, v, "expected a folder");
      if (strlen(v) >= op->size)
        return bad(key, v, op->why_long);
      strcpy(field, v);
      return 0;
    default:
      return op->parse(key, v, o);
    }
  }
  return unknown(key);
}

int dl_option_exists(const char *key) {
  for (size_t i = 0; key && i < DL__ARRAY_LEN(options); i++)
    if (!strcmp(key, options[i].name))
      return 1;
  if (key)
    unknown(key); /* what dl_open would say of it, for the caller to say too */
  return 0;
}

void dl__options_doc(FILE *out, bool markdown) {
  if (markdown)
    fprintf(out, "# Options\n\nThe loader's options: `key=value` words separated by spaces for `dl_open` (C: "
            "`\"batch_size=64 image_size=224\"`), the same keywords for "
            "`ringfeed.Loader` (Python), `--option key=value` for `dlbench`. An unknown key or a bad value fails "
            "the open with `DL_EOPTION` and a message naming it (a mistyped key, with the option it likely "
            "meant: `imagesize` gives `did you mean image_size?`; a mistyped value too: `crop=centre` gives `did "
            "you mean center?`). A value of a list is read without regard to case, and `-` for `_` "
            "(`layout=nhwc`, `channels-last`). This page is made from the options' table "
            "in `lib/options.c` (`dlbench --list-options=md`); a test checks that it is.\n\n"
            "| option | what, values (default) |\n|---|---|\n");
  for (size_t i = 0; i < DL__ARRAY_LEN(options); i++)
    fprintf(out, markdown ? "| `%s` | %s |\n" : "  %-17s %s\n", options[i].name, options[i].help);
}

int dl__options_parse(dl__options *o, const char *text) {
  set_defaults(o);
  const char *p = text ? text : "";
  for (;;) {
    while (isspace((unsigned char)*p))
      p++;
    if (!*p)
      break;
    /* A word runs to the next space; a value in double quotes (a path with spaces) to its quote. */
    const char *start = p, *value = NULL; /* VALUE: just after the word's first '=' */
    char word[512];
    size_t n = 0;
    bool quoted = false;
    for (; *p && (quoted || !isspace((unsigned char)*p)); p++) {
      if (*p == '"' && (quoted || p == value)) {
        quoted = !quoted;
        continue;
      }
      if (*p == '=' && !value)
        value = p + 1;
      if (n + 1 >= sizeof word)
        return dl__fail(DL_EOPTION, "option '%.40s...' is too long", start);
      word[n++] = *p;
    }
    word[n] = 0;
    if (quoted)
      return dl__fail(DL_EOPTION, "option '%.*s': a quote left open", (int)(p - start), start);
    char *eq = strchr(word, '=');
    const char *next = p + strspn(p, " \t\n");
    size_t next_len = strcspn(next, " \t\n");
    if (!eq && *next == '=') /* "batch_size = 64" */
      return dl__fail(DL_EOPTION, "option '%s =': write key=value, with no spaces around '='", word);
    if (!eq || eq == word)
      return dl__fail(DL_EOPTION, "option '%s' is not key=value", word);
    *eq = 0;
    int r = apply(o, word, eq + 1);
    /* "batch_size= 64": an empty value refused, and the next word no option but its value */
    if (r && !eq[1] && next_len && !memchr(next, '=', next_len))
      return dl__fail(DL_EOPTION, "option '%s= %.*s': write key=value, with no spaces around '='", word,
                      (int)next_len, next);
    /* "batch_size=64,image_size=224": one option to the parser, whose value then fails */
    const char *sep = r ? strpbrk(eq + 1, ",;") : NULL;
    if (sep && (strchr(sep, '=') || (*sep == ';' && !sep[1])))
      return dl__fail(DL_EOPTION, "option %s=%s: options are separated by spaces, not by '%c'", word, eq + 1, *sep);
    if (r)
      return r;
  }
  if (o->rank >= o->world_size)
    return dl__fail(DL_EOPTION, "option rank=%d: must be below world_size=%d", o->rank,
                    o->world_size);
  if (o->cache_limit && !o->cache_dir[0])
    return dl__fail(DL_EOPTION, "option cache_limit needs cache_dir (the folder to keep shards in)");
  if (o->start_epoch && o->resume[0])
    return dl__fail(DL_EOPTION, "options start_epoch and resume: the token already says where the run "
                                "starts; give one of them");
  /* A uint8 batch holds the pixels as decoded: a mean or std given for it would be dropped, and the
   * model fed 0..255 where its user asked for normalised values. */
  if (o->mean_std_given && o->dtype == DL__DTYPE_UINT8)
    return dl__fail(DL_EOPTION, "options mean and std normalise float batches (dtype=float32, float16 or "
                                "bfloat16); with dtype=uint8 the pixels stay 0..255");
  /* uint16/uint32 name a token source's elements; the image stays uint8 then. */
  if (o->dtype == DL__DTYPE_UINT16 || o->dtype == DL__DTYPE_UINT32) {
    o->token_dtype = o->dtype;
    o->dtype = DL__DTYPE_UINT8;
  }
  /* mean and std are on torchvision's scale, pixels as 0..1, where no mean is above 1 and no
   * standard deviation above 0.5. Larger values are on the 0..255 scale DALI's and mmcv's
   * normalisations take (mean=123.675,116.28,103.53 std=58.395,57.12,57.375, or mean=0,0,0
   * std=255,255,255 for pixels as 0..1): read both that way rather than scale pixels to nonsense. */
  for (int i = 0; i < 3; i++)
    o->mean_std_255 |= fabsf(o->mean[i]) > 1 || fabsf(o->std[i]) > 1;
  for (int i = 0; i < 3 && o->mean_std_255; i++) {
    o->mean[i] /= 255;
    o->std[i] /= 255;
  }
  return 0;
}
