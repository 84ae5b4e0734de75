/* Bad options fail dl_open with DL_EOPTION and a message naming the key and value. */
#include "core.h"
#include "test.h"

#include <math.h>

static void expect_bad(const char *opts, const char *mention) {
  dl__options o;
  int r = dl__options_parse(&o, opts);
  if (r != DL_EOPTION)
    FAIL_AT("options \"%s\": expected DL_EOPTION, got %d", opts, r);
  ASSERT_CONTAINS(dl_last_error(), mention);
}

int main(void) {
  dl__options o;
  /* One loader's log=quiet is not the next one's default. */
  unsetenv("DL_LOG_LEVEL");
  ASSERT_EQ(dl__options_parse(&o, "log=quiet"), 0);
  dl__log_level = o.log_level;
  ASSERT_EQ(dl__options_parse(&o, NULL), 0);
  ASSERT_EQ(o.log_level, DL__LOG_WARN);
  setenv("DL_LOG_LEVEL", "4", 1);
  ASSERT_EQ(dl__options_parse(&o, NULL), 0);
  ASSERT_EQ(o.log_level, DL__LOG_DEBUG);
  unsetenv("DL_LOG_LEVEL");
  ASSERT_EQ(dl__options_parse(&o, NULL), 0);
  ASSERT_EQ(o.batch_size, 256);
  ASSERT_EQ(o.shuffle_block, 0);
  ASSERT_EQ(o.cache_limit, 0);
  ASSERT_EQ(dl__options_parse(&o, "shuffle_block=8 cache_dir=/var/cache/x cache_limit=50G"), 0);
  expect_bad("cache_limit=5G", "cache_limit needs cache_dir");
  ASSERT_EQ(o.shuffle_block, 8);
  ASSERT_EQ(o.cache_limit, 50ll << 30);
  ASSERT(!strcmp(o.cache_dir, "/var/cache/x"));
  /* A path with spaces, in double quotes; a quote anywhere else is the value's. */
  ASSERT_EQ(dl__options_parse(&o, "cache_dir=\"/mnt/My Drive/cache\"  ca_file=\"/a b/c\"d.pem batch_size=\"8\""), 0);
  ASSERT(!strcmp(o.cache_dir, "/mnt/My Drive/cache") && !strcmp(o.ca_file, "/a b/cd.pem") && o.batch_size == 8);
  ASSERT_EQ(dl__options_parse(&o, "ca_file=/x/a\"b"), 0);
  ASSERT(!strcmp(o.ca_file, "/x/a\"b"));
  expect_bad("cache_dir=\"/mnt/My Drive batch_size=8", "a quote left open");
  const char *sizes[][2] = {{"512M", "536870912"}, {"1KiB", "1024"}, {"3kb", "3072"}, {"1000", "1000"},
                            {"2T", "2199023255552"}};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    char text[64];
    snprintf(text, sizeof text, "cache_dir=c cache_limit=%s", sizes[i][0]);
    ASSERT_EQ(dl__options_parse(&o, text), 0);
    ASSERT_EQ(o.cache_limit, strtoll(sizes[i][1], NULL, 10));
  }
  /* workers, prefetch and memory_budget are auto (0) unless given; dl_open chooses. */
  ASSERT_EQ(dl__options_parse(&o, NULL), 0);
  ASSERT_EQ(o.workers, 0);
  ASSERT_EQ(o.prefetch, 0);
  ASSERT_EQ(o.memory_budget, 0);
  ASSERT_EQ(dl__options_parse(&o, "workers=3 prefetch=6 memory_budget=2G"), 0);
  ASSERT_EQ(o.workers, 3);
  ASSERT_EQ(o.prefetch, 6);
  ASSERT_EQ(o.memory_budget, 2ll << 30);
  /* nvJPEG's decoders are kept for the next loader unless told otherwise. */
  ASSERT_EQ(dl__options_parse(&o, NULL), 0);
  ASSERT_EQ(o.keep_gpu_decoders, 1);
  ASSERT_EQ(dl__options_parse(&o, "keep_gpu_decoders=0"), 0);
  ASSERT_EQ(o.keep_gpu_decoders, 0);
  ASSERT_EQ(dl__options_parse(&o, "workers=3 workers=auto prefetch=auto memory_budget=auto"), 0);
  ASSERT_EQ(o.workers, 0);
  ASSERT_EQ(o.prefetch, 0);
  ASSERT_EQ(o.memory_budget, 0);
  expect_bad("workers=0", "workers=0");
  expect_bad("prefetch=many", "prefetch=many");
  expect_bad("memory_budget=0", "must be above zero");
  expect_bad("memory_budget=lots", "memory_budget=lots");
  ASSERT_EQ(o.height, 224);
  ASSERT_EQ(o.crop, DL__CROP_RANDOM_RESIZED);
  ASSERT_EQ(dl__options_parse(&o, "  batch_size=32 image_size=160x128 crop=center flip=1 seed=42 "
                                  "epochs=0 rank=1 world_size=4 io=pread layout=NCHW channels=1  "),
            0);
  ASSERT_EQ(o.batch_size, 32);
  ASSERT_EQ(o.height, 160);
  ASSERT_EQ(o.width, 128);
  ASSERT_EQ(o.crop, DL__CROP_CENTER);
  ASSERT_EQ(o.flip, 1);
  ASSERT_EQ(o.seed, 42);
  ASSERT_EQ(o.epochs, 0);
  ASSERT_EQ(o.rank, 1);
  ASSERT_EQ(o.world_size, 4);
  ASSERT_EQ(o.io, DL__IO_PREAD);
  ASSERT_EQ(o.layout, DL__LAYOUT_NCHW);
  ASSERT_EQ(o.channels, 1);
  /* A zero-padded seed is decimal (not octal); hex only after 0x. */
  ASSERT_EQ(dl__options_parse(&o, "seed=010"), 0);
  ASSERT_EQ(o.seed, 10);
  ASSERT_EQ(dl__options_parse(&o, "seed=0x10"), 0);
  ASSERT_EQ(o.seed, 16);
  ASSERT_EQ(dl__options_parse(&o, "device=cuda:0,2,3 dtype=bfloat16 mean=0.5,0.5,0.5 std=1,0.25,-0.5"), 0);
  ASSERT_EQ(o.ndevices, 3);
  ASSERT_EQ(o.device_ids[2], 3);
  ASSERT_EQ(o.dtype, DL__DTYPE_BFLOAT16);
  ASSERT(o.mean[0] == 0.5f && o.std[0] == 1.0f && o.std[2] == -0.5f && !o.mean_std_255);
  /* DALI's and mmcv's 0..255 scale, told by values no 0..1 pixel statistics have. */
  ASSERT_EQ(dl__options_parse(&o, "device=cuda dtype=float32 mean=123.675,116.28,103.53 std=58.395,57.12,57.375"), 0);
  ASSERT(o.mean_std_255 && fabsf(o.mean[0] - 0.485f) < 1e-6f && fabsf(o.std[2] - 0.225f) < 1e-6f);
  ASSERT_EQ(dl__options_parse(&o, "device=cuda dtype=float32 mean=0,0,0 std=255,255,255"), 0);
  ASSERT(o.mean_std_255 && o.mean[1] == 0 && o.std[1] == 1.0f);
  ASSERT_EQ(dl__options_parse(&o, "device=cuda dtype=float32"), 0);
  ASSERT(!o.mean_std_255 && o.mean[0] == 0.485f && o.std[0] == 0.229f);

  expect_bad("bogus=1", "unknown option 'bogus'");
  ASSERT(!strstr(dl_last_error(), "did you mean")); /* nothing near enough */
  /* A mistyped key names the option it most likely meant: a letter left out, swapped, or a
   * '-' or capitals where the name has '_' and small letters. */
  expect_bad("imagesize=64", "unknown option 'imagesize' (did you mean image_size?)");
  expect_bad("shufle=0", "(did you mean shuffle?)");
  expect_bad("wrokers=2", "(did you mean workers?)");
  expect_bad("Batch-Size=8", "(did you mean batch_size?)");
  expect_bad("num_workers=2", "unknown option 'num_workers'");
  ASSERT(!strstr(dl_last_error(), "did you mean")); /* the Python binding names DataLoader's words */
  /* dl_option_exists says what dl_open would of a key it does not know (the binding's None). */
  ASSERT_EQ(dl_option_exists("image_size"), 1);
  ASSERT_EQ(dl_option_exists("imagesize"), 0);
  ASSERT_CONTAINS(dl_last_error(), "unknown option 'imagesize' (did you mean image_size?)");
  expect_bad("shuffle_block=-1", "shuffle_block=-1");
  expect_bad("cache_limit=0", "cache_limit=0");
  expect_bad("cache_limit=-5G", "cache_limit=-5G");
  expect_bad("cache_limit=5Q", "cache_limit=5Q");
  expect_bad("cache_limit=99999999999T", "too large");
  expect_bad("cache_dir=", "cache_dir=");
  expect_bad("batch_size=0", "batch_size=0");
  expect_bad("batch_size=12x", "batch_size=12x");
  expect_bad("workers=-3", "workers=-3");
  expect_bad("crop=random", "crop=random: expected one of random_resized center resize none");
  /* A choice as the user wrote it: case and '-' for '_' are free; a letter or two off is named. */
  expect_bad("crop=centre", "crop=centre: expected one of random_resized center resize none (did you mean center?)");
  expect_bad("io=urng", "(did you mean uring?)");
  expect_bad("layout=nwhc", "(did you mean NHWC?)"); /* two letters swapped, whatever their case */
  ASSERT_EQ(dl__options_parse(&o, "layout=nhwc crop=Center decode=CPU dtype=Float16"), 0);
  ASSERT_EQ(o.layout, DL__LAYOUT_NHWC);
  ASSERT_EQ(o.crop, DL__CROP_CENTER);
  ASSERT_EQ(o.decode, DL__DECODE_CPU);
  ASSERT_EQ(o.dtype, DL__DTYPE_FLOAT16);
  ASSERT_EQ(dl__options_parse(&o, "layout=channels-last"), 0);
  ASSERT_EQ(o.layout, DL__LAYOUT_CHANNELS_LAST);
  expect_bad("image_size=0x5", "image_size=0x5");
  expect_bad("image_size=abc", "image_size=abc");
  /* How options are written elsewhere (a tuple, a comma-separated list, spaces around '='): said so. */
  expect_bad("image_size=224,160", "image_size=224,160: expected N or HxW, such as 224x160");
  expect_bad("batch_size=64,image_size=224",
             "batch_size=64,image_size=224: options are separated by spaces, not by ','");
  expect_bad("batch_size=64; image_size=224", "batch_size=64;: options are separated by spaces, not by ';'");
  expect_bad("batch_size = 64", "option 'batch_size =': write key=value, with no spaces around '='");
  expect_bad("batch_size= 64", "option 'batch_size= 64': write key=value, with no spaces around '='");
  expect_bad("batch_size= workers=2", "option batch_size=: not an integer"); /* an empty value, then an option */
  expect_bad("mean=0.5,0.5 dtype=float32", "mean=0.5,0.5: expected three numbers"); /* its commas are its own */
  ASSERT_EQ(dl__options_parse(&o, "mean=0.5,0.5,0.5 std=0.2,0.2,0.2 dtype=float32"), 0);
  expect_bad("flip=maybe", "flip=maybe");
  expect_bad("gpu_check=2", "gpu_check=2");
  expect_bad("keep_gpu_decoders=always", "keep_gpu_decoders=always: expected 0 or 1");
  expect_bad("channels=2", "channels=2");
  expect_bad("device=gpu", "device=gpu");
  expect_bad("device=cuda:0,0", "listed twice");
  expect_bad("mean=1,2", "mean=1,2");
  /* Normalisation applies to float batches: on uint8 it would be dropped without a word. */
  expect_bad("mean=0.5,0.5,0.5", "mean and std normalise float batches");
  expect_bad("dtype=uint8 std=0.2,0.2,0.2", "with dtype=uint8 the pixels stay 0..255");
  ASSERT_EQ(dl__options_parse(&o, "dtype=float16 mean=0.5,0.5,0.5"), 0);
  /* Numbers are plain decimals: strtod would read hex (0x10 as 16), inf and nan. */
  expect_bad("mean=0x1p-1,0.5,0.5", "mean=0x1p-1,0.5,0.5: expected three numbers");
  expect_bad("std=1,nan,1", "expected three numbers");
  expect_bad("repeat=0x10", "repeat=0x10: expected a factor");
  expect_bad("repeat=1,inf", "expected a factor");
  expect_bad("gpu_share=0x0.8", "gpu_share=0x0.8: expected auto or a fraction");
  expect_bad("gpu_share=\" 0.5\"", "expected auto or a fraction");
  expect_bad("seed=-1", "seed=-1: expected a non-negative integer");
  expect_bad("seed=0x", "seed=0x: expected a non-negative integer");
  expect_bad("seed=18446744073709551616", "seed=18446744073709551616: above 2^64-1, the largest seed");
  ASSERT_EQ(dl__options_parse(&o, "seed=18446744073709551615"), 0);
  ASSERT_EQ(o.seed, UINT64_MAX);
  expect_bad("std=1,0,1", "std must not be zero");
  expect_bad("rank=4 world_size=4", "rank=4");
  expect_bad("batch_size", "not key=value");
  expect_bad("=3", "not key=value");
  /* Float batches on the CPU too: the workers normalise them. */
  ASSERT_EQ(dl__options_parse(&o, "dtype=bfloat16"), 0);
  ASSERT_EQ(o.dtype, DL__DTYPE_BFLOAT16);
  expect_bad("on_error=ignore", "on_error=ignore");
  expect_bad("io=aio", "io=aio");

  /* Through the public entry point too: the code, and no loader. */
  dl_loader *l = (dl_loader *)0x1;
  ASSERT_EQ(dl_open(&l, "/nonexistent.tar", "prefetch=x"), DL_EOPTION);
  ASSERT(l == NULL);
  ASSERT_CONTAINS(dl_last_error(), "prefetch=x");
  ASSERT_STR_EQ(dl_errname(DL_EOPTION), "DL_EOPTION");
  ASSERT_STR_EQ(dl_errname(-2), "ENOENT");
  ASSERT_STR_EQ(dl_strerror(DL_ECORRUPT), "corrupt input");
  ASSERT_STR_EQ(dl_errname(DL_EOF), "DL_EOF");
  ASSERT_EQ(dl_open(&l, "/nonexistent.tar", ""), -2);
  ASSERT_CONTAINS(dl_last_error(), "/nonexistent.tar");
  printf("options: ok\n");
  return 0;
}
