/*
 * JPEG decoding on the GPU, the host's side: which JPEGs the GPU takes (decided by a worker from
 * the file's markers, so the choice is a function of the bytes and never of timing), the room their
 * bytes take in a slot's arena, and the region of each that nvJPEG decodes. Built with or without
 * CUDA.
 */
#include "gpu/gpu.h"
#include "decode/jpeg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where the bytes of sample S go in an arena: their length and the alignment of their start. */
static size_t arena_need(const dl_loader *l, const dl__sample *s, size_t *align) {
  *align = 64;
  if (l->ds.maps && l->ds.maps[s->file])
    return s->image_len; /* mapped: only the JPEG is copied */
  uint32_t a = l->ds.direct[s->file];
  if (!a)
    return (size_t)s->size;
  *align = a; /* O_DIRECT reads start and end on the alignment */
  return (size_t)((s->size + s->offset % a + a - 1) / a * a);
}

static bool candidate(const dl_loader *l, const dl__sample *s) {
  return s->codec == DL__CODEC_JPEG && !(s->flags & DL__SAMPLE_IMAGE_ZST) &&
         (int64_t)s->size <= l->o.max_member_bytes;
}

/* Hybrid: whether sample I of B is one of the workers' share. */
static bool cpu_share(const dl_batch *b, int i) {
  return b->cpu_n >= b->len || (b->cpu_n > 0 && b->on_cpu[i]);
}

uint8_t *dl__gpu_arena_take(dl_loader *l, dl_batch *b, int i, const dl__sample *s) {
  if (!b->arena || cpu_share(b, i) || !candidate(l, s))
    return NULL;
  size_t align, need = arena_need(l, s, &align);
  size_t at = (b->arena_used + align - 1) / align * align;
  if (at + need > l->arena_bytes)
    return NULL; /* full: this one is decoded on the CPU */
  b->arena_used = at + need;
  return b->arena + at;
}

/* Enough for a batch of the dataset's average JPEG with room to spare, and for the largest. */
size_t dl__gpu_arena_size(const dl_loader *l) {
  double sum = 0;
  size_t n = 0, largest = 0;
  for (size_t k = 0; k < l->ds.n; k++) {
    const dl__sample *s = &l->ds.samples[k];
    if (!candidate(l, s))
      continue;
    size_t align, need = arena_need(l, s, &align) + align;
    sum += (double)need;
    largest = need > largest ? need : largest;
    n++;
  }
  if (!n)
    return 0;
  double bytes = (double)l->o.batch_size * (sum / (double)n) * 1.25 + 2.0 * (double)largest;
  double cap = 1u << 30;
  return ((size_t)(bytes < cap ? bytes : cap) + 4095) / 4096 * 4096;
}

size_t dl__gpu_job_bytes(const int32_t roi[4], int scale, int channels) {
  size_t full = (size_t)roi[2] * (size_t)roi[3] * (size_t)channels;
  size_t scaled = scale > 1 ? (size_t)((roi[2] + scale - 1) / scale) * (size_t)((roi[3] + scale - 1) / scale) *
                                  (size_t)channels
                            : 0;
  return (full + 255) / 256 * 256 + (scaled + 255) / 256 * 256;
}

/* The part of the image nvJPEG decodes: the crop, the reach of the resampling filter around it,
 * widened to the 16-pixel grid of the largest MCU. A region that reaches an edge of the image off
 * that grid becomes the whole image: the engine mishandles such regions (an odd height left a
 * region undecoded on an H200), never whole images. */
static void roi_around(const dl__rect *r, int width, int height, int ow, int oh, int32_t roi[4]) {
  double mx = ceil(fmax(r->w / ow, 1.0)) + 2, my = ceil(fmax(r->h / oh, 1.0)) + 2;
  int x0 = (int)floor(r->x - mx), y0 = (int)floor(r->y - my);
  int x1 = (int)ceil(r->x + r->w + mx), y1 = (int)ceil(r->y + r->h + my);
  x0 = x0 < 0 ? 0 : x0 / 16 * 16;
  y0 = y0 < 0 ? 0 : y0 / 16 * 16;
  x1 = (x1 + 15) / 16 * 16;
  y1 = (y1 + 15) / 16 * 16;
  x1 = x1 > width ? width : x1;
  y1 = y1 > height ? height : y1;
  if ((x1 == width && width % 16) || (y1 == height && height % 16))
    x0 = y0 = 0, x1 = width, y1 = height;
  roi[0] = x0, roi[1] = y0, roi[2] = x1 - x0, roi[3] = y1 - y0;
}

bool dl__gpu_plan(const dl_loader *l, dl_batch *b, int i, int64_t index, uint8_t *arena_at, const uint8_t *image,
                  size_t len, uint64_t key) {
  dl__jpeg_info j;
  /* Whatever libjpeg might complain about stays with libjpeg, which names the problem; so do images
   * smaller than an MCU, whose edges decoders fill in differently. */
  if (dl__jpeg_probe(image, len, true, &j) || !j.ends || !j.tables_complete || j.precision != 8 || j.rgb ||
      j.cmyk || j.bogus_progression || (j.components != 1 && j.components != 3) || j.width < 16 || j.height < 16 ||
      (int64_t)j.width * j.height > l->o.max_pixels)
    return false;
  bool single = j.scans == 1 && !j.between_scans && j.first_scan_components == j.components;
  /* Damage inside the entropy-coded data of sound markers (the data ends before the last block:
   * libjpeg's "premature end of data segment") shows only to a reader of the codes; nvJPEG
   * decodes it without complaint. Every scan is read through on the CPU once a sample (jpeg_rows.c:
   * about 0.6 of a decode's time, about a whole one for a progressive file), and an image that
   * is not sound stays with the CPU path. gpu_check=0 trusts the data of single-scan files only:
   * after damaged scans of progressive and non-interleaved files, nvJPEG's CUDA decoder took the
   * process down when its state was destroyed (an H200, nvJPEG 13.0.1: twice in about 20 runs of
   * test_gpu_decode, both on closing the one loader that gave it such files unread). */
  /* A ringfeed shard's writer vouches only for single-scan files (the verdicts taken at open): one
   * that says so of another file is not believed, and the file is read at every GPU decode. */
  /* A sequential scan codes every block with at least a DC and an end-of-block code, two bits:
   * less data than that is damage a hardware decoder would fill in silently. */
  if (j.sof != 0xC2 && (int64_t)j.entropy_bytes * 4 < j.blocks)
    return false;
  bool engine_css = j.subsampling <= DL__CSS_440 || j.subsampling == DL__CSS_GRAY;
  int engine;
  if (l->gpu_hw && j.sof == 0xC0 && single && engine_css)
    engine = DL__GPU_ENGINE_HW;
  else if ((j.sof == 0xC0 || j.sof == 0xC1 || j.sof == 0xC2) && j.subsampling != DL__CSS_OTHER)
    engine = DL__GPU_ENGINE_CUDA;
  else
    return false;
  bool vouched = (size_t)index < l->ds.n && l->ds.samples[index].flags & DL__SAMPLE_SCAN_CLEAN;
  /* A scan no run has read yet, of a file for the engines, is read on the device beside its decode
   * (gpu/walk.cu): in a first epoch that read took the workers about half a decode an image. Only
   * the engines' files: a damaged single-scan file is one they decode without harm (gpu_check=0),
   * the CUDA decoder is not trusted with damage beyond that. */
  bool walk = l->o.gpu_check && single && l->gpu_walk && engine == DL__GPU_ENGINE_HW &&
              dl__jpeg_rows_verdict(l->jpeg_rows, (uint32_t)index) == DL__VERDICT_UNREAD;
  if ((l->o.gpu_check || !single) && !walk &&
      !dl__jpeg_rows_clean(vouched && !single ? NULL : l->jpeg_rows, (uint32_t)index, image, len, l->o.max_pixels))
    return false;
  dl__rect r;
  dl__err e = {0};
  if (dl__crop_rect(l->o.crop, j.width, j.height, l->o.width, l->o.height, key, &r, &e))
    return false; /* the CPU path reports it */
  dl__gpu_job *g = &b->jobs[i];
  int32_t roi[4] = {0, 0, j.width, j.height};
  /* Only the engine decodes a region; nvJPEG's CUDA batch decodes whole images. */
  if (engine == DL__GPU_ENGINE_HW)
    roi_around(&r, j.width, j.height, l->o.width, l->o.height, roi);
  int scale = dl__jpeg_scale(&r, l->o.width, l->o.height);
  if (dl__gpu_job_bytes(roi, scale, l->o.channels) > l->gpu_pool)
    return false;
  if (image < b->arena || image >= b->arena + l->arena_bytes) {
    memcpy(arena_at, image, len); /* from a mapped shard */
    image = arena_at;
  }
  g->index = index;
  g->at = (uint32_t)(image - b->arena);
  g->len = (uint32_t)len;
  g->width = j.width;
  g->height = j.height;
  memcpy(g->roi, roi, sizeof roi);
  g->rect[0] = (float)r.x, g->rect[1] = (float)r.y, g->rect[2] = (float)r.w, g->rect[3] = (float)r.h;
  g->key = key;
  g->scale = (uint8_t)scale;
  g->flip = dl__sample_flip(l, key);
  g->engine = (uint8_t)engine;
  g->walk = walk;
  return true;
}
