/* Parses "key=value key=value" option strings; the same keys as the Python keywords. */
#include "internal.h"

#include <ctype.h>
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
  o->dtype = DL__DTYPE_UINT8;
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  memcpy(o->mean, mean, sizeof mean);
  memcpy(o->std, std, sizeof std);
  o->device_slots = 3;
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

static int parse_choice(const char *key, const char *v, const char *const *names, int n, int *out) {
  for (int i = 0; i < n; i++)
    if (names[i] && !strcmp(v, names[i])) {
      *out = i;
      return 0;
    }
  char why[256] = "expected one of";
  for (int i = 0; i < n; i++)
    if (names[i]) {
      strncat(why, " ", sizeof why - strlen(why) - 1);
      strncat(why, names[i], sizeof why - strlen(why) - 1);
    }
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

static int apply(dl__options *o, const char *key, const char *v) {
  static const char *const crops[] = {"random_resized", "center", "resize", "none"};
  static const char *const layouts[] = {"NHWC", "NCHW"};
  static const char *const dtypes[] = {"uint8", "float32", "float16", "bfloat16", "uint16", "uint32"};
  static const char *const on_errors[] = {"skip", "fail"};
  static const char *const ios[] = {"auto", "uring", "pread", "mmap"};
  static const char *const logs[] = {"quiet", "error", "warn", "info", "debug"};
  static const char *const decodes[] = {"auto", "cpu", "gpu", "hybrid"};
  int64_t x;
  int r = 0;
#define INT_OPT(name, field, lo, hi)                                                               \
  if (!strcmp(key, name)) {                                                                        \
    if ((r = parse_int(key, v, lo, hi, &x)))                                                       \
      return r;                                                                                    \
    o->field = x;                                                                                  \
    return 0;                                                                                      \
  }
  INT_OPT("batch_size", batch_size, 1, 1 << 20)
  if ((!strcmp(key, "workers") || !strcmp(key, "prefetch")) && !strcmp(v, "auto")) {
    *(key[0] == 'w' ? &o->workers : &o->prefetch) = 0;
    return 0;
  }
  INT_OPT("workers", workers, 1, 1024)
  INT_OPT("prefetch", prefetch, 1, 1024)
  INT_OPT("epochs", epochs, 0, INT64_MAX / 2)
  INT_OPT("start_epoch", start_epoch, 0, INT64_MAX / 4)
  INT_OPT("rank", rank, 0, 1 << 20)
  INT_OPT("world_size", world_size, 1, 1 << 20)
  INT_OPT("device_slots", device_slots, 1, 64)
  INT_OPT("io_depth", io_depth, 1, 4096)
  INT_OPT("max_pixels", max_pixels, 1, INT64_C(1) << 40)
  INT_OPT("max_member_bytes", max_member_bytes, 1, INT64_C(1) << 40)
  INT_OPT("seq_len", seq_len, 1, 1 << 24)
  INT_OPT("gpu_decode_mb", gpu_decode_mb, 16, 1 << 20)
  INT_OPT("retries", retries, 0, 100)
  INT_OPT("timeout_ms", timeout_ms, 1, 3600000)
  INT_OPT("shuffle_block", shuffle_block, 0, 1 << 24)
#undef INT_OPT
  if (!strcmp(key, "seed")) {
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
  if (!strcmp(key, "channels")) {
    if ((r = parse_int(key, v, 1, 3, &x)))
      return r;
    if (x == 2)
      return bad(key, v, "expected 1 or 3");
    o->channels = (int)x;
    return 0;
  }
  if (!strcmp(key, "image_size"))
    return parse_size(key, v, o);
  if (!strcmp(key, "crop"))
    return parse_choice(key, v, crops, 4, &o->crop);
  if (!strcmp(key, "layout"))
    return parse_choice(key, v, layouts, 2, &o->layout);
  if (!strcmp(key, "dtype"))
    return parse_choice(key, v, dtypes, 6, &o->dtype);
  if (!strcmp(key, "on_error"))
    return parse_choice(key, v, on_errors, 2, &o->on_error);
  if (!strcmp(key, "io"))
    return parse_choice(key, v, ios, 4, &o->io);
  if (!strcmp(key, "log"))
    return parse_choice(key, v, logs, 5, &o->log_level);
  if (!strcmp(key, "decode"))
    return parse_choice(key, v, decodes, 4, &o->decode);
  if (!strcmp(key, "gpu_share")) {
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
  if (!strcmp(key, "flip"))
    return parse_bool(key, v, &o->flip);
  if (!strcmp(key, "shuffle"))
    return parse_bool(key, v, &o->shuffle);
  if (!strcmp(key, "drop_last"))
    return parse_bool(key, v, &o->drop_last);
  if (!strcmp(key, "direct"))
    return parse_bool(key, v, &o->direct);
  if (!strcmp(key, "pad"))
    return parse_bool(key, v, &o->pad);
  if (!strcmp(key, "gpu_check"))
    return parse_bool(key, v, &o->gpu_check);
  if (!strcmp(key, "mean"))
    return parse_floats3(key, v, o->mean);
  if (!strcmp(key, "repeat"))
    return parse_repeat(key, v, o);
  if (!strcmp(key, "std")) {
    if ((r = parse_floats3(key, v, o->std)))
      return r;
    for (int i = 0; i < 3; i++)
      if (o->std[i] == 0)
        return bad(key, v, "std must not be zero");
    return 0;
  }
  if (!strcmp(key, "device"))
    return parse_device(key, v, o);
  if (!strcmp(key, "resume")) {
    if (strlen(v) >= sizeof o->resume)
      return bad(key, v, "token too long");
    strcpy(o->resume, v);
    return 0;
  }
  if (!strcmp(key, "s3_addressing")) {
    static const char *const modes[] = {"auto", "path", "virtual"};
    return parse_choice(key, v, modes, 3, &o->s3_addressing);
  }
  if (!strcmp(key, "memory_budget")) {
    if (!strcmp(v, "auto")) {
      o->memory_budget = 0;
      return 0;
    }
    if ((r = parse_bytes(key, v, &o->memory_budget)))
      return r;
    return o->memory_budget ? 0 : bad(key, v, "must be above zero");
  }
  if (!strcmp(key, "cache_limit")) {
    if ((r = parse_bytes(key, v, &o->cache_limit)))
      return r;
    return o->cache_limit ? 0 : bad(key, v, "must be above zero");
  }
  if (!strcmp(key, "cache_dir")) {
    if (!*v || strlen(v) >= sizeof o->cache_dir)
      return bad(key, v, !*v ? "expected a folder" : "path too long");
    strcpy(o->cache_dir, v);
    return 0;
  }
  if (!strcmp(key, "ca_file")) {
    if (strlen(v) >= sizeof o->ca_file)
      return bad(key, v, "path too long");
    strcpy(o->ca_file, v);
    return 0;
  }
  if (!strcmp(key, "fields")) {
    if (strlen(v) >= sizeof o->fields)
      return bad(key, v, "list too long");
    if (!*v || strstr(v, ",,") || *v == ',' || v[strlen(v) - 1] == ',')
      return bad(key, v, "expected field names separated by commas");
    strcpy(o->fields, v);
    return 0;
  }
  return dl__fail(DL_EOPTION, "unknown option '%s'", key);
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
    if (!eq || eq == word)
      return dl__fail(DL_EOPTION, "option '%s' is not key=value", word);
    *eq = 0;
    int r = apply(o, word, eq + 1);
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
  /* uint16/uint32 name a token source's elements; the image stays uint8 then. */
  if (o->dtype == DL__DTYPE_UINT16 || o->dtype == DL__DTYPE_UINT32) {
    o->token_dtype = o->dtype;
    o->dtype = DL__DTYPE_UINT8;
  }
  if (o->dtype != DL__DTYPE_UINT8 && o->ndevices == 0)
    return dl__fail(DL_EOPTION, "option dtype: float conversion runs on the GPU; use device=cuda");
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
