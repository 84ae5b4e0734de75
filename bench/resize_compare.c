/*
 * ringfeed's resampler against the well-kept libraries that could replace it, side by side on the
 * same work: RandomResizedCrop(224) rectangles (ringfeed's own draws, rounded to whole pixels so
 * that every library can take them) of the JPEGs in the given tar shards, decoded once up front.
 * One thread, from memory; each contender's images/s, and how far its pixels are from ringfeed's,
 * which the tests hold to PIL's and torchvision's antialiased resize (mean absolute difference per
 * image, the worst image, and the share of images over 1 level).
 * Usage: resize_compare [--images N] SHARD...   Prints a table, then one JSON object.
 */
#include "core.h"
#include "tar_jpegs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jpeglib.h>
#include <libswscale/swscale.h>
#include <libyuv.h>
#include <libyuv/scale_rgb.h>
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#define STBIR_ASSERT(x) ((void)0)
#include <stb/stb_image_resize.h>

enum { OUT = 224 };

typedef struct image {
  uint8_t *rgb;
  int w, h;
  int x, y, cw, ch; /* the crop */
} image;

static image *images;
static size_t nimages, cap, limit = 2000;

/* Decodes a JPEG member whole to RGB and draws its crop as the loader would. */
static void keep(unsigned char *p, size_t n) {
  if (nimages >= limit) {
    free(p);
    return;
  }
  struct jpeg_decompress_struct d;
  struct jpeg_error_mgr err;
  d.err = jpeg_std_error(&err);
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, p, (unsigned long)n);
  jpeg_read_header(&d, TRUE);
  d.out_color_space = JCS_RGB;
  jpeg_start_decompress(&d);
  image im = {.w = (int)d.output_width, .h = (int)d.output_height};
  im.rgb = malloc((size_t)im.w * im.h * 3);
  while (d.output_scanline < d.output_height) {
    JSAMPROW row = im.rgb + (size_t)d.output_scanline * im.w * 3;
    jpeg_read_scanlines(&d, &row, 1);
  }
  jpeg_finish_decompress(&d);
  jpeg_destroy_decompress(&d);
  free(p);
  dl__rect r;
  dl__err e = {0};
  if (dl__crop_rect(DL__CROP_RANDOM_RESIZED, im.w, im.h, OUT, OUT, 0x9e3779b97f4a7c15ull * (nimages + 1), &r, &e)) {
    free(im.rgb);
    return;
  }
  im.x = (int)floor(r.x), im.y = (int)floor(r.y);
  im.cw = (int)lround(r.w), im.ch = (int)lround(r.h);
  im.cw = im.cw < 1 ? 1 : im.x + im.cw > im.w ? im.w - im.x : im.cw;
  im.ch = im.ch < 1 ? 1 : im.y + im.ch > im.h ? im.h - im.y : im.ch;
  if (nimages == cap) {
    cap = cap ? cap * 2 : 1024;
    images = realloc(images, cap * sizeof *images);
  }
  images[nimages++] = im;
}

typedef struct contender {
  const char *name;
  void (*run)(const image *im, uint8_t *out, void *ctx);
} contender;

static void ours(const image *im, uint8_t *out, void *ctx) {
  dl__rect r = {(double)im->x, (double)im->y, (double)im->cw, (double)im->ch};
  dl__resize(im->rgb, im->w, im->h, (size_t)im->w * 3, 3, r, out, OUT, OUT, 0, 0, ctx);
}

static const uint8_t *crop_at(const image *im) { return im->rgb + ((size_t)im->y * im->w + im->x) * 3; }

static void yuv_box(const image *im, uint8_t *out, void *ctx) {
  (void)ctx;
  RGBScale(crop_at(im), im->w * 3, im->cw, im->ch, out, OUT * 3, OUT, OUT, kFilterBox);
}

static void yuv_bilinear(const image *im, uint8_t *out, void *ctx) {
  (void)ctx;
  RGBScale(crop_at(im), im->w * 3, im->cw, im->ch, out, OUT * 3, OUT, OUT, kFilterBilinear);
}

static void stb_triangle(const image *im, uint8_t *out, void *ctx) {
  (void)ctx;
  stbir_resize_uint8_generic(crop_at(im), im->cw, im->ch, im->w * 3, out, OUT, OUT, OUT * 3, 3, STBIR_ALPHA_CHANNEL_NONE,
                             0, STBIR_EDGE_CLAMP, STBIR_FILTER_TRIANGLE, STBIR_COLORSPACE_LINEAR, NULL);
}

/* A context per crop size, as a loader would need for crops that all differ. */
static void sws_bilinear(const image *im, uint8_t *out, void *ctx) {
  struct SwsContext **c = ctx;
  *c = sws_getCachedContext(*c, im->cw, im->ch, AV_PIX_FMT_RGB24, OUT, OUT, AV_PIX_FMT_RGB24, SWS_BILINEAR, NULL,
                            NULL, NULL);
  const uint8_t *src[4] = {crop_at(im)};
  int src_stride[4] = {im->w * 3};
  uint8_t *dst[4] = {out};
  int dst_stride[4] = {OUT * 3};
  sws_scale(*c, src, src_stride, 0, im->ch, dst, dst_stride);
}

int main(int argc, char **argv) {
  int first = 1;
  if (argc > 2 && !strcmp(argv[1], "--images")) {
    limit = strtoull(argv[2], NULL, 10);
    first = 3;
  }
  if (first >= argc) {
    fprintf(stderr, "usage: resize_compare [--images N] SHARD...\n");
    return 2;
  }
  for (int i = first; i < argc; i++)
    tar_jpegs(argv[i], tar_jpegs_malloc, keep);
  if (!nimages) {
    fprintf(stderr, "resize_compare: no JPEGs\n");
    return 1;
  }
  const contender all[] = {{"ringfeed (fixed point, antialiased triangle)", ours},
                           {"libyuv RGBScale kFilterBox", yuv_box},
                           {"libyuv RGBScale kFilterBilinear", yuv_bilinear},
                           {"stb_image_resize triangle", stb_triangle},
                           {"libswscale SWS_BILINEAR", sws_bilinear}};
  size_t n = sizeof all / sizeof *all, each = (size_t)OUT * OUT * 3;
  uint8_t *ref = malloc(each * nimages), *out = malloc(each);
  dl__resize_scratch scratch = {0};
  struct SwsContext *sws = NULL;
  printf("| resampler (%zu crops of RandomResizedCrop(224), 1 thread) | images/s | mean diff from ringfeed | worst "
         "image | images over 1 level |\n|---|---|---|---|---|\n",
         nimages);
  char json[2048];
  size_t jn = (size_t)snprintf(json, sizeof json, "{\"images\":%zu,\"contenders\":[", nimages);
  for (size_t c = 0; c < n; c++) {
    void *ctx = c == 0 ? (void *)&scratch : c == 4 ? (void *)&sws : NULL;
    /* Pixels first (and caches warm), then the timed passes. */
    double sum = 0, worst = 0;
    size_t over = 0;
    for (size_t i = 0; i < nimages; i++) {
      uint8_t *dst = c == 0 ? ref + i * each : out;
      all[c].run(&images[i], dst, ctx);
      double d = 0;
      for (size_t k = 0; c && k < each; k++)
        d += fabs((double)dst[k] - ref[i * each + k]);
      d /= (double)each;
      sum += d;
      worst = d > worst ? d : worst;
      over += d > 1.0;
    }
    double t0 = bench_now();
    size_t done = 0;
    while (bench_now() - t0 < 2.0)
      for (size_t i = 0; i < nimages; i++, done++)
        all[c].run(&images[i], out, ctx);
    double rate = (double)done / (bench_now() - t0);
    printf("| %s | %.0f | %.3f | %.3f | %zu |\n", all[c].name, rate, sum / (double)nimages, worst, over);
    jn += (size_t)snprintf(json + jn, sizeof json - jn, "%s{\"name\":\"%s\",\"images_per_s\":%.1f,\"mean_diff\":%.4f,"
                           "\"worst_image\":%.4f,\"over_1\":%zu}", c ? "," : "", all[c].name, rate, sum / (double)nimages,
                           worst, over);
  }
  printf("%s]}\n", json);
  sws_freeContext(sws);
  dl__resize_scratch_free(&scratch);
  for (size_t i = 0; i < nimages; i++)
    free(images[i].rgb);
  free(images);
  free(ref);
  free(out);
  return 0;
}
