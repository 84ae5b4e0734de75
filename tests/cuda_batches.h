// What the GPU tests share: CUDA checks, and every batch of a run copied to the host (device
// batches through a stream of the test's own, waited for and released as a consumer would).
#ifndef RINGFEED_TEST_CUDA_BATCHES_H
#define RINGFEED_TEST_CUDA_BATCHES_H

#include "ringfeed.h"
#include "test.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#define CHECK_CUDA(x)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess)                                                                         \
      FAIL_AT("%s: %s", #x, cudaGetErrorString(e_));                                               \
  } while (0)

#define MAX_BATCHES 64

static size_t tensor_bytes(const DLTensor *t) {
  size_t n = (size_t)t->dtype.bits / 8;
  for (int d = 0; d < t->ndim; d++)
    n *= (size_t)t->shape[d];
  return n;
}

// Host copies of every batch of a run: images (as delivered), labels, keys and sample errors.
typedef struct stream_copy {
  int batches;
  unsigned char *image[MAX_BATCHES];
  int64_t *label[MAX_BATCHES];
  int *err[MAX_BATCHES];
  char **key[MAX_BATCHES];
  size_t bytes[MAX_BATCHES];
  int len[MAX_BATCHES];
  char stats[8192]; // the loader's stats at the end
} stream_copy;

// The first STOP batches of a run (every batch with STOP < 0), then the token that resumes after
// them into TOKEN when it is given.
static void collect_part(const char *source, const char *opts, int stop, char *token, size_t cap,
                         stream_copy *out) {
  memset(out, 0, sizeof *out);
  dl_loader *l;
  OPEN_OK(l, source, opts);
  dl_batch *b;
  int r = DL_EOF;
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  while ((stop < 0 || out->batches < stop) && (r = dl_next_batch(l, &b)) == 0) {
    ASSERT_LT(out->batches, MAX_BATCHES);
    DLTensor img, lab;
    ASSERT_EQ(dl_batch_field(b, "image", &img), 0);
    ASSERT_EQ(dl_batch_field(b, "label", &lab), 0);
    int k = out->batches++, n = dl_batch_size(b);
    out->bytes[k] = tensor_bytes(&img);
    out->len[k] = n;
    out->image[k] = (unsigned char *)malloc(out->bytes[k]);
    out->label[k] = (int64_t *)malloc((size_t)n * 8);
    out->err[k] = (int *)malloc((size_t)n * sizeof(int));
    out->key[k] = (char **)malloc((size_t)n * sizeof(char *));
    for (int i = 0; i < n; i++) {
      out->err[k][i] = dl_batch_sample_error(b, i);
      out->key[k][i] = strdup(dl_batch_key(b, i));
    }
    if (img.device.device_type == kDLCUDA) {
      ASSERT_EQ(dl_batch_wait(b, s), 0);
      CHECK_CUDA(cudaMemcpyAsync(out->image[k], img.data, out->bytes[k], cudaMemcpyDeviceToHost, s));
      CHECK_CUDA(cudaMemcpyAsync(out->label[k], lab.data, (size_t)n * 8, cudaMemcpyDeviceToHost, s));
      dl_batch_release(b, s);
      CHECK_CUDA(cudaStreamSynchronize(s));
    } else {
      memcpy(out->image[k], img.data, out->bytes[k]);
      memcpy(out->label[k], lab.data, (size_t)n * 8);
      dl_batch_release(b, NULL);
    }
  }
  if (r != DL_EOF && r != 0)
    FAIL_AT("%s: %s", dl_errname(r), dl_last_error());
  ASSERT_GT(dl_stats_json(l, out->stats, sizeof out->stats), 0);
  if (token)
    ASSERT_GT(dl_state_save(l, token, cap), 0);
  CHECK_CUDA(cudaStreamDestroy(s));
  dl_close(l);
}

static void collect_from(const char *source, const char *opts, stream_copy *out) {
  collect_part(source, opts, -1, NULL, 0, out);
}

static void free_copy(stream_copy *c) {
  for (int i = 0; i < c->batches; i++) {
    free(c->image[i]);
    free(c->label[i]);
    free(c->err[i]);
    for (int j = 0; j < c->len[i]; j++)
      free(c->key[i][j]);
    free(c->key[i]);
  }
}

// A number from the stats JSON ("gpu_decoded" and so on).
static double stat_of(const stream_copy *c, const char *name) {
  char pattern[80];
  snprintf(pattern, sizeof pattern, "\"%s\":", name);
  const char *p = strstr(c->stats, pattern);
  return p ? atof(p + strlen(pattern)) : -1;
}

// Element I of a float32 (dtype 1), float16 (2) or bfloat16 (3) buffer.
static double float_at(const unsigned char *p, int dtype, size_t i) {
  if (dtype == 1)
    return ((const float *)p)[i];
  uint16_t v = ((const uint16_t *)p)[i];
  if (dtype == 2) {
    __half_raw r;
    r.x = v;
    return (double)__half2float(__half(r));
  }
  uint32_t f = (uint32_t)v << 16;
  float x;
  memcpy(&x, &f, 4);
  return x;
}

// Every float dtype in both layouts (BASE plus dtype= and layout=) against REF, the same run's
// uint8 NHWC batches of SIZE x SIZE, normalised in float64 with ImageNet's mean and std.
static void check_conversions(const char *source, const stream_copy *ref, const char *base, int size,
                              const char *what) {
  const double mean[3] = {0.485, 0.456, 0.406}, std_[3] = {0.229, 0.224, 0.225};
  const char *dtypes[] = {"", "float32", "float16", "bfloat16"};
  const double tol[] = {0, 1e-6, 1e-3, 8e-3};
  for (int dt = 1; dt <= 3; dt++)
    for (int nchw = 0; nchw < 2; nchw++) {
      char opts[512];
      snprintf(opts, sizeof opts, "%s dtype=%s layout=%s", base, dtypes[dt], nchw ? "NCHW" : "NHWC");
      stream_copy d;
      collect_from(source, opts, &d);
      ASSERT_EQ(d.batches, ref->batches);
      double err2 = 0, ref2 = 0;
      for (int k = 0; k < ref->batches; k++) {
        ASSERT_EQ(d.bytes[k], ref->bytes[k] * (dt == 1 ? 4 : 2));
        for (int b = 0; b < ref->len[k]; b++)
          for (int y = 0; y < size; y++)
            for (int x = 0; x < size; x++)
              for (int c = 0; c < 3; c++) {
                size_t in = (((size_t)b * size + y) * size + x) * 3 + c;
                size_t out = nchw ? (((size_t)b * 3 + c) * size + y) * size + x : in;
                double want = (ref->image[k][in] / 255.0 - mean[c]) / std_[c], got = float_at(d.image[k], dt, out);
                ASSERT(got == got);
                err2 += (got - want) * (got - want);
                ref2 += want * want;
              }
      }
      double rel = sqrt(err2 / ref2);
      printf("%s %-8s %s: relative error %.2e (limit %.0e)\n", what, dtypes[dt], nchw ? "NCHW" : "NHWC", rel,
             tol[dt]);
      ASSERT(rel <= tol[dt]);
      free_copy(&d);
    }
}

#endif
