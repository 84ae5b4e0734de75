/*
 * nvJPEG's batched decode alone, the ceiling of ringfeed's decode=gpu: every JPEG member of the
 * given tar shards, from pinned host memory, decoded in batches into device memory by one or more
 * host threads (each with its own handle, state and stream), with nothing else running. The knobs
 * are the choices the loader makes, so each one's cost shows beside the plain decode:
 *   --backend hw|cuda       the JPEG engines, or nvJPEG's CUDA (GPU hybrid) decoder
 *   --roi                   decode only the region around a RandomResizedCrop(224) crop (engine only)
 *   --band top|bottom       decode only the top or the bottom half of each image's rows (engine
 *                           only): whether a region's place in the image costs the engine, as it
 *                           costs libjpeg (decode_ceiling --band)
 *   --flags none|strict|interp   interp (the default): interpolated chroma upsampling, what the
 *                           loader asks for; strict: strict bitstream checking, which it no longer
 *                           asks for; none: neither
 *   --pipelined             nvJPEG's own default for the engine: further images buffered between
 *                           calls, which the loader turns off (a busy GPU held each call back)
 *   --format rgbi|rgb|yuv   interleaved RGB (the loader's), RGB planes, or the planes as coded (no
 *                           conversion)
 *   --busy                  beside kernels that keep every SM busy, as training does
 *                           (bench/busy_gpu.cu): what a busy GPU costs the decode
 *   --prealloc WxH          the engine's buffers sized once, for a batch of W x H images
 *                           (nvjpegDecodeBatchedPreAllocate), as the loader does at open
 *   --threads T --batch B --seconds S
 * Prints one JSON object: images_per_s, host_ms_per_call (time the calling thread spends inside
 * nvJPEG per batch), and the settings.
 */
#include "gpu/nvjpeg.h"
#include "core.h"
#include "tar_jpegs.h"
#include "busy_gpu.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct jpeg {
  unsigned char *p;
  size_t n;
  int w, h;
  int roi[4];
} jpeg;

static jpeg *jpegs;
static size_t njpegs, cap;
static int batch = 256, threads = 1, roi, band, busy, pre_w, pre_h, pipelined;
static nvjpegOutputFormat_t format = NVJPEG_OUTPUT_RGBI;
static unsigned flags = NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION;
static const char *flag_name = "interp";
static nvjpegBackend_t backend = NVJPEG_BACKEND_HARDWARE;
static double seconds = 4;
static const dl__nvjpeg *nv;
static pthread_barrier_t started; /* every lane set up: the clock starts */
static double t_start;

static void die(const char *what, int code) {
  fprintf(stderr, "nvjpeg_ceiling: %s failed (%d)\n", what, code);
  exit(1);
}

/* The crop RandomResizedCrop(224) draws for image I, widened to the 16-pixel grid as the loader
 * widens it; a region touching an edge off the grid becomes the whole image, as in the loader. */
static void region(jpeg *j, size_t i) {
  dl__rect r;
  dl__err e = {0};
  j->roi[0] = j->roi[1] = 0, j->roi[2] = j->w, j->roi[3] = j->h;
  if (band) { /* a half of the rows on the 16-pixel grid, both halves of one size, off every edge but the top */
    int w16 = j->w / 16 * 16, half = j->h / 32 * 16;
    j->roi[1] = band == 1 ? 0 : half, j->roi[2] = w16, j->roi[3] = half;
    return;
  }
  if (dl__crop_rect(DL__CROP_RANDOM_RESIZED, j->w, j->h, 224, 224, (uint64_t)i * 0x9E3779B97F4A7C15ull, &r, &e))
    return;
  int x0 = (int)r.x / 16 * 16, y0 = (int)r.y / 16 * 16;
  int x1 = ((int)(r.x + r.w) + 17) / 16 * 16, y1 = ((int)(r.y + r.h) + 17) / 16 * 16;
  x1 = x1 > j->w ? j->w : x1;
  y1 = y1 > j->h ? j->h : y1;
  if ((x1 == j->w && j->w % 16) || (y1 == j->h && j->h % 16))
    return;
  j->roi[0] = x0, j->roi[1] = y0, j->roi[2] = x1 - x0, j->roi[3] = y1 - y0;
}

static unsigned char *pinned(size_t n) {
  unsigned char *p = NULL;
  return cudaHostAlloc((void **)&p, n ? n : 1, cudaHostAllocPortable) == cudaSuccess ? p : NULL;
}

/* Baseline JPEGs only: the engine's kind. */
static void keep(unsigned char *p, size_t n) {
  dl__jpeg_info info;
  if (dl__jpeg_probe(p, n, false, &info) || info.sof != 0xC0) {
    cudaFreeHost(p);
    return;
  }
  if (njpegs == cap) {
    cap = cap ? cap * 2 : 1024;
    jpegs = realloc(jpegs, cap * sizeof *jpegs);
  }
  jpeg *j = &jpegs[njpegs];
  *j = (jpeg){.p = p, .n = n, .w = info.width, .h = info.height};
  region(j, njpegs);
  njpegs++;
}

typedef struct lane {
  pthread_t t;
  int index;
  long images, calls;
  double host_s;
} lane;

static void *run(void *arg) {
  lane *ln = arg;
  nvjpegHandle_t h;
  nvjpegJpegState_t st;
  cudaStream_t s;
  int r;
  unsigned all = flags | (pipelined ? 0 : NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE);
  if ((r = nv->CreateEx(backend, NULL, NULL, all, &h)) || (r = nv->JpegStateCreate(h, &st)) ||
      (r = nv->DecodeBatchedInitialize(h, st, batch, 1, format)))
    die("setting up nvJPEG", r);
  if (pre_w && (r = nv->DecodeBatchedPreAllocate(h, st, batch, pre_w, pre_h, NVJPEG_CSS_444, format)))
    die("nvjpegDecodeBatchedPreAllocate", r);
  int least, greatest; /* the loader's stream has the greatest priority, and so has this one */
  if ((r = cudaDeviceGetStreamPriorityRange(&least, &greatest)) ||
      (r = cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest)))
    die("cudaStreamCreate", r);
  size_t most = 0;
  for (size_t i = 0; i < njpegs; i++)
    most = (size_t)jpegs[i].w * jpegs[i].h * 3 > most ? (size_t)jpegs[i].w * jpegs[i].h * 3 : most;
  unsigned char *out;
  if ((r = cudaMalloc((void **)&out, most * (size_t)batch)))
    die("cudaMalloc", r);
  const unsigned char **data = calloc((size_t)batch, sizeof *data);
  size_t *lens = calloc((size_t)batch, sizeof *lens);
  nvjpegImage_t *img = calloc((size_t)batch, sizeof *img);
  nvjpegDecodeParams_t *params = calloc((size_t)batch, sizeof *params);
  for (int i = 0; roi && i < batch; i++)
    if ((r = nv->DecodeParamsCreate(h, &params[i])))
      die("nvjpegDecodeParamsCreate", r);
  size_t next = (size_t)ln->index * (size_t)batch;
  if (pthread_barrier_wait(&started) == PTHREAD_BARRIER_SERIAL_THREAD)
    t_start = bench_now();
  pthread_barrier_wait(&started);
  double end = t_start + seconds;
  while (bench_now() < end) {
    for (int i = 0; i < batch; i++, next++) {
      jpeg *j = &jpegs[next % njpegs];
      int w = roi ? j->roi[2] : j->w;
      data[i] = j->p;
      lens[i] = j->n;
      /* Planes: each as large as the image, whatever its sampling. */
      for (int c = 0; c < (format == NVJPEG_OUTPUT_RGBI ? 1 : 3); c++) {
        img[i].channel[c] = out + (size_t)i * most + (size_t)c * (most / 3);
        img[i].pitch[c] = format == NVJPEG_OUTPUT_RGBI ? (size_t)w * 3 : (size_t)w;
      }
      bool whole = j->roi[2] == j->w && j->roi[3] == j->h;
      if (roi)
        nv->DecodeParamsSetROI(params[i], whole ? 0 : j->roi[0], whole ? 0 : j->roi[1], whole ? -1 : j->roi[2],
                               whole ? -1 : j->roi[3]);
    }
    next += (size_t)(threads - 1) * (size_t)batch; /* the lanes take turns through the set */
    double c0 = bench_now();
    r = roi ? nv->DecodeBatchedEx(h, st, data, lens, img, params, s) : nv->DecodeBatched(h, st, data, lens, img, s);
    ln->host_s += bench_now() - c0;
    if (r)
      die("nvjpegDecodeBatched", r);
    ln->images += batch;
    ln->calls++;
  }
  cudaStreamSynchronize(s);
  return NULL;
}

int main(int argc, char **argv) {
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(a, "--roi"))
      roi = 1;
    else if (!strcmp(a, "--band") && (!strcmp(v, "top") || !strcmp(v, "bottom")))
      roi = 1, band = !strcmp(v, "top") ? 1 : 2, i++;
    else if (!strcmp(a, "--busy"))
      busy = 1;
    else if (!strcmp(a, "--pipelined"))
      pipelined = 1;
    else if (!strcmp(a, "--format") && (!strcmp(v, "rgbi") || !strcmp(v, "rgb") || !strcmp(v, "yuv")))
      format = !strcmp(v, "yuv") ? NVJPEG_OUTPUT_YUV : !strcmp(v, "rgb") ? NVJPEG_OUTPUT_RGB : NVJPEG_OUTPUT_RGBI, i++;
    else if (!strcmp(a, "--batch"))
      batch = atoi(v), i++;
    else if (!strcmp(a, "--prealloc") && sscanf(v, "%dx%d", &pre_w, &pre_h) == 2 && pre_w > 0 && pre_h > 0)
      i++;
    else if (!strcmp(a, "--threads"))
      threads = atoi(v), i++;
    else if (!strcmp(a, "--seconds"))
      seconds = atof(v), i++;
    else if (!strcmp(a, "--backend"))
      backend = !strcmp(v, "cuda") ? NVJPEG_BACKEND_GPU_HYBRID : NVJPEG_BACKEND_HARDWARE, i++;
    else if (!strcmp(a, "--flags") && (!strcmp(v, "none") || !strcmp(v, "strict") || !strcmp(v, "interp"))) {
      flag_name = v, i++;
      flags = !strcmp(v, "none")     ? 0
              : !strcmp(v, "strict") ? NVJPEG_FLAGS_BITSTREAM_STRICT
                                     : NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION;
    } else {
      fprintf(stderr, "usage: nvjpeg_ceiling [--backend hw|cuda] [--roi] [--band top|bottom] [--flags none|strict|interp] [--format rgbi|rgb|yuv] "
                      "[--pipelined] [--busy] [--prealloc WxH] [--threads T] "
                      "[--batch B] [--seconds S] SHARD...\n");
      return 2;
    }
  }
  char why[300];
  if (!(nv = dl__nvjpeg_load(why, sizeof why))) {
    fprintf(stderr, "nvjpeg_ceiling: %s\n", why);
    return 77;
  }
  for (; i < argc; i++)
    tar_jpegs(argv[i], pinned, keep);
  if (njpegs < (size_t)batch) {
    fprintf(stderr, "nvjpeg_ceiling: %zu baseline JPEGs, fewer than a batch\n", njpegs);
    return 1;
  }
  if (busy && busy_gpu_start()) {
    fprintf(stderr, "nvjpeg_ceiling: no GPU to keep busy\n");
    return 1;
  }
  lane *lanes = calloc((size_t)threads, sizeof *lanes);
  pthread_barrier_init(&started, NULL, (unsigned)threads);
  for (int k = 0; k < threads; k++) {
    lanes[k].index = k;
    pthread_create(&lanes[k].t, NULL, run, &lanes[k]);
  }
  long images = 0, calls = 0;
  double host = 0;
  for (int k = 0; k < threads; k++) {
    pthread_join(lanes[k].t, NULL);
    images += lanes[k].images;
    calls += lanes[k].calls;
    host += lanes[k].host_s;
  }
  double wall = bench_now() - t_start;
  const char *busy_failed = busy ? busy_gpu_stop() : NULL;
  if (busy_failed) {
    fprintf(stderr, "nvjpeg_ceiling: keeping the GPU busy failed: %s\n", busy_failed);
    return 1;
  }
  printf("{\"backend\":\"%s\",\"roi\":%s,\"band\":\"%s\",\"format\":\"%s\",\"busy\":%s,\"flags\":\"%s\",\"pipelined\":%s,\"threads\":%d,\"batch\":%d,"
         "\"prealloc\":\"%dx%d\",\"images\":%ld,\"seconds\":%.3f,\"images_per_s\":%.1f,\"host_ms_per_call\":%.3f,\"nvjpeg\":\"%s\"}\n",
         backend == NVJPEG_BACKEND_HARDWARE ? "hw" : "cuda", roi ? "true" : "false",
         band == 1 ? "top" : band == 2 ? "bottom" : "all",
         format == NVJPEG_OUTPUT_YUV ? "yuv" : format == NVJPEG_OUTPUT_RGB ? "rgb" : "rgbi", busy ? "true" : "false", flag_name,
         pipelined ? "true" : "false", threads,
         batch, pre_w, pre_h, images, wall, images / wall, calls ? host / calls * 1e3 : 0.0, nv->version);
  return 0;
}
