/*
 * JPEG decoding on the GPU, the host's side: where JPEGs are decoded (chosen once at open), which
 * JPEGs the GPU takes (decided by a worker from the file's markers, so the choice is a function of
 * the bytes and never of timing), and hybrid's split of each batch between the workers and the
 * GPU. Built with or without CUDA.
 *
 * Lock order: l->mu only.
 */
#include "gpu/gpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const decode_names[] = {"auto", "cpu", "gpu", "hybrid"};

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

/* Whether sample I of B is one of an even spread of the workers' share over the batch. */
static bool evenly_spread(const dl_batch *b, int i) {
  return b->cpu_n && (int64_t)(i + 1) * b->cpu_n / b->len > (int64_t)i * b->cpu_n / b->len;
}

static int by_cpu_cost(const void *pa, const void *pb) {
  const dl__split_rank *a = pa, *b = pb;
  if (a->cost != b->cost)
    return a->cost < b->cost ? -1 : 1;
  if (a->spread != b->spread)
    return a->spread < b->spread ? -1 : 1;
  return a->i < b->i ? -1 : a->i > b->i;
}

/* A CPU decode reads an image's rows down to its crop's bottom and no further (one core of the
 * 2-core build machine, the q90 synthetic set: top halves of the images decoded at 1,650 images/s,
 * bottom halves at 1,025, whole images at 866; bench/decode_ceiling --band), and of the rows
 * above the crop it only walks those whose starts the sample's record does not know yet
 * (jpeg_rows.c), a row in 0.68-0.76 of a decode's time on the q90 and q96 sets. In a run's first
 * epoch no start is known. After it, a sample's are known where gpu_check read its scan (not
 * where the verdict was kept from an earlier run) or a CPU decode walked above its crop: the
 * rows above count half. Simulated over random-resized crops, the 30% a batch's workers take
 * cost 0.49 / 0.60 / 0.65 of whole decodes where all / 30% / none of the starts are known,
 * against 0.55 / 0.62 / 0.65 for the 30% that end highest (the ranking before). The records
 * themselves are not asked: when a decode learnt them depends on the workers' timing, and the
 * split is a function of the draws and the share alone (the same bytes with any worker count). */
double dl__split_cost(const dl_loader *l, bool later_epoch, uint64_t key) {
  double top, bottom;
  dl__crop_rows_hint(l->o.crop, l->o.width, l->o.height, key, &top, &bottom);
  if (!l->jpeg_rows)
    return bottom;
  return bottom - top + (later_epoch ? 0.5 : 0.7) * top;
}

/* The workers take the samples that cost them least, while the JPEG engines take about as long
 * for any crop of an image. Hybrid on H200 hosts, by the crop's bottom against an even spread:
 * a worker's time per image 13% lower, 2-4% more images/s. Where every
 * sample ties (centre crops, plain resizes) the share stays spread evenly over the batch, not put
 * first: a worker claims a run of neighbouring samples at a time, and a run of CPU samples alone
 * left a few workers decoding the whole share while the rest waited (on an H200 the split batch
 * then took longer than either side's part). */
void dl__gpu_split_batch(dl_loader *l, const dl__sampler *sm, dl_batch *b) {
  dl__split_rank *r = l->split.rank;
  for (int i = 0; i < b->len; i++) {
    int64_t epoch, draw;
    dl__sampler_sample(sm, b->k, i, &epoch, &draw);
    uint64_t key = dl__sample_key(l, epoch, draw);
    double cost = dl__split_cost(l, epoch > sm->start_epoch, key);
    r[i] = (dl__split_rank){(float)cost, (uint8_t)!evenly_spread(b, i), i};
  }
  qsort(r, (size_t)b->len, sizeof *r, by_cpu_cost);
  memset(b->on_cpu, 0, (size_t)b->len);
  for (int j = 0; j < b->cpu_n; j++)
    b->on_cpu[r[j].i] = 1;
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

/* Hybrid's first split, a guess from the measured rates of engines and cores; it adapts from there. */
static double first_share(const dl_loader *l) {
  return l->o.gpu_share >= 0 ? l->o.gpu_share : l->gpu_hw ? 0.75 : 0.5;
}

int dl__decode_choose(dl_loader *l) {
  int want = l->o.decode;
  const char *asked = decode_names[want];
  char why[200] = "";
  l->decode = DL__DECODE_CPU;
  if (want == DL__DECODE_CPU) {
    snprintf(l->decode_reason, sizeof l->decode_reason, "decode=cpu");
  } else if (!l->has_image) {
    snprintf(l->decode_reason, sizeof l->decode_reason, "the dataset has no images");
  } else if (!l->o.ndevices) {
    if (want != DL__DECODE_AUTO)
      return dl__fail(DL_ENODEVICE, "option decode=%s: JPEGs are decoded on the GPU given by device=cuda:N, "
                                    "and this loader has device=cpu", asked);
    snprintf(l->decode_reason, sizeof l->decode_reason, "device=cpu");
  } else if (want == DL__DECODE_AUTO && dl__gpu_decoders_available(why, sizeof why)) {
    /* nvJPEG takes about a second to start (0.9 s on an H200, more than the first batches take on
     * the CPU): the GPU stage starts it in the background and the workers decode every JPEG until
     * it is ready. Only auto: decode=gpu|hybrid fail at open when it cannot start. */
    l->decode_starting = true;
    snprintf(l->decode_reason, sizeof l->decode_reason,
             "decode=auto: nvJPEG is starting; the workers decode every JPEG until it is ready");
  } else if (dl__gpu_decoders_open(l, why, sizeof why)) {
    if (want != DL__DECODE_AUTO)
      return dl__fail(DL_ENODEVICE, "option decode=%s: %s", asked, why);
    snprintf(l->decode_reason, sizeof l->decode_reason, "no GPU decoder: %s", why);
  } else {
    l->decode = want == DL__DECODE_GPU ? DL__DECODE_GPU : DL__DECODE_HYBRID;
    snprintf(l->decode_reason, sizeof l->decode_reason, "%s", why);
  }
  dl__log(DL__LOG_INFO, "decoding JPEGs: %s (%s)", decode_names[l->decode], l->decode_reason);
  if (l->decode == DL__DECODE_CPU && !l->decode_starting)
    return 0;
  l->arena_bytes = dl__gpu_arena_size(l);
  l->share = l->decode == DL__DECODE_GPU ? 1 : first_share(l);
  return 0;
}

void dl__decode_started_locked(dl_loader *l, bool ok, const char *why) {
  l->decode_starting = false;
  if (ok) {
    l->decode = DL__DECODE_HYBRID;
    l->share = first_share(l);
    snprintf(l->decode_reason, sizeof l->decode_reason, "%s", why);
  } else {
    snprintf(l->decode_reason, sizeof l->decode_reason, "no GPU decoder: %s", why);
  }
  dl__log(DL__LOG_INFO, "decoding JPEGs: %s (%s)", decode_names[l->decode], l->decode_reason);
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
   * three quarters of a decode's time, about a whole one for a progressive file), and an image that
   * is not sound stays with the CPU path. gpu_check=0 trusts the data of single-scan files only:
   * after damaged scans of progressive and non-interleaved files, nvJPEG's CUDA decoder took the
   * process down when its state was destroyed (an H200, nvJPEG 13.0.1: twice in about 20 runs of
   * test_gpu_decode, both on closing the one loader that gave it such files unread). */
  if ((l->o.gpu_check || !single) &&
      !dl__jpeg_rows_clean(l->jpeg_rows, (uint32_t)index, image, len, l->o.max_pixels))
    return false;
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
  return true;
}

/* Whether a stream's batches would still come within 0.8 of the consumer's period at GPU share X,
 * by the measured rates: the longer of the two sides' parts of a batch. A drift toward the CPU
 * goes no further than that. The copy stage's wait for the consumer is measured batch by batch,
 * and a few batches in a row with long waits drifted the split below what the workers could
 * keep up with: beside an H200 consumer stepping at 1.2x hybrid's batch time (q90, 10 epochs) it
 * moved 16 times and ended at 0.5625 against a measured balance of 0.69, the copy thread waiting
 * 4.3 ms a batch for the workers, and the GPU idled 0.047, seven steps in a row waiting 6-8 ms.
 * There the workers' part at 0.5625 comes to 11.6 ms by their measured rate, over 0.8 of the
 * 11.2 ms step. The 0.2 left over is for the workers' time per image, measured on the crops the
 * split gives them (those that end highest, cheaper than the ones a larger CPU share adds), and
 * for the steps' own jitter. */
static bool keeps_ahead(const dl_loader *l, const dl__split *s, double x) {
  if (!(s->gpu_ms > 0 && s->cpu_ms > 0 && s->period > 0))
    return true; /* nothing measured to go by */
  /* Every worker: those workers=auto sets aside come back as soon as the consumer waits (counted
   * as set aside, a training run's seven of sixteen would keep the GPU decoding for good). */
  double per_stream = (double)l->o.workers / l->nstreams, B = l->o.batch_size;
  double gpu = x * B * s->gpu_ms, cpu = (1 - x) * B * s->cpu_ms / per_stream;
  return fmax(gpu, cpu) <= 0.8 * s->period;
}

/* With gpu_share=S fixed the rates are still measured, for the stats: where the split would go. */
void dl__gpu_share_update(dl_loader *l, int gpu_samples, double gpu_ms) {
  pthread_mutex_lock(&l->mu);
  if (l->decode != DL__DECODE_HYBRID) {
    pthread_mutex_unlock(&l->mu);
    return;
  }
  dl__split *s = &l->split;
  int64_t cpu_n = atomic_load(&l->st.cpu_decoded), cpu_ns = atomic_load(&l->st.cpu_decode_ns);
  int64_t dn = cpu_n - s->cpu_decoded, dns = cpu_ns - s->cpu_ns;
  bool starved = l->st.starved > s->starved;
  /* The copy threads' share of the time since the last update spent waiting for the consumer's
   * GPU to give a slot back: how far ahead of the consumer the loader runs. */
  int64_t rw = atomic_load(&l->st.release_wait_ns);
  double now = dl__now(), span = s->t > 0 ? now - s->t : 0;
  double ahead = span > 0 ? (double)(rw - s->release_wait_ns) * 1e-9 / span / l->nstreams : 0;
  s->cpu_decoded = cpu_n, s->cpu_ns = cpu_ns, s->starved = l->st.starved, s->release_wait_ns = rw, s->t = now;
  /* In ms, over 0.1 s at least, not from one update to the next: a copy thread hands back every
   * finished slot at once, microseconds apart. Updates of all streams come in turn: one stream's
   * batches are nstreams apart. */
  if (s->win_t <= 0)
    s->win_t = now;
  else
    s->win_n++;
  if (s->win_n && now - s->win_t >= 0.1) {
    s->period = (now - s->win_t) * 1e3 / (double)s->win_n * l->nstreams;
    s->win_t = now, s->win_n = 0;
  }
  /* The first batches carry the decoders' start-up. */
  if (++s->updates > 2) {
    /* The per-image rates say where both sides would finish a batch together. */
    if (gpu_samples > 0)
      s->gpu_ms = s->gpu_ms > 0 ? 0.8 * s->gpu_ms + 0.2 * gpu_ms / gpu_samples : gpu_ms / gpu_samples;
    if (dn > 0)
      s->cpu_ms = s->cpu_ms > 0 ? 0.8 * s->cpu_ms + 0.2 * (double)dns / 1e6 / (double)dn : (double)dns / 1e6 / (double)dn;
    if (s->gpu_ms > 0 && s->cpu_ms > 0) {
      double gpu_rate = 1 / s->gpu_ms, cpu_rate = (l->pace.on ? l->pace.active : l->o.workers) / s->cpu_ms / l->nstreams;
      s->balanced = gpu_rate / (gpu_rate + cpu_rate);
    }
    /* The split moves toward that balance while the consumer waits for batches. Both sides
     * share the host's cores, so each side's rate is measured where the split is: at a larger
     * GPU share the workers idle more and the thread feeding nvJPEG runs faster (an H200 host,
     * q90: 23.3 thousand images/s on the GPU side at share 0.7, 17.9 at 0.59). Which side waited
     * for the other, the rule before, settled at such a local balance (0.59, 26,000 images/s
     * where a fixed 0.7 gave 30,700). A consumer that never waits leaves the split drifting to
     * the CPU while the copy stage waits for the consumer's GPU over a quarter of the time (the
     * loader is well ahead): the GPU's time is then better left to training, as far as the
     * loader would stay ahead (keeps_ahead). Short of that it holds, rather than drift until the
     * consumer waits. */
    if (l->o.gpu_share >= 0)
      s->votes = 0;
    else if (!starved)
      s->votes = ahead > 0.25 ? s->votes - 1 : 0;
    else if (s->balanced > l->share + 1.0 / 64)
      s->votes++;
    else if (s->balanced > 0 && s->balanced < l->share - 1.0 / 64)
      s->votes--;
    else
      s->votes = 0;
    /* Steps of 1/32 of a batch, after three votes the same way: nvJPEG sets up again for every new
     * batch size, so the split does not flicker. A loader over twice as fast as its consumer (the
     * copy stage waiting over half the time) leaves the GPU in steps of 1/8: a model's GPU is not
     * to be shared for long (ResNet-50 on an H200, 55 ms steps: at 1/32 a 300-step run decoded 18%
     * of its images on the GPU on the way to share 0, and trained 1.7% slower than decode=cpu). */
    if (s->votes >= 3 || s->votes <= -3) {
      double step = s->votes > 0 ? 1.0 / 32 : !starved && ahead > 0.5 ? -1.0 / 8 : -1.0 / 32, was = l->share;
      if (step < 0 && !starved) { /* a drift, not a move toward the balance: only while it keeps ahead */
        if (step < -1.0 / 32 && !keeps_ahead(l, s, l->share + step))
          step = -1.0 / 32;
        if (step == -1.0 / 32 && !keeps_ahead(l, s, l->share + step))
          step = 0;
      }
      s->votes = 0;
      if (step == 0) {
        s->holds++;
      } else {
        l->share = fmin(1, fmax(0, round((l->share + step) * 32) / 32));
        s->moves++;
      }
      dl__log(DL__LOG_DEBUG, "hybrid split: GPU share %.3f -> %.3f (balanced %.3f from %.3f ms an image on the GPU, "
              "%.3f on a worker; the consumer %s, %.2f ms a batch; the copy stage waited for it %.0f%% of the time)",
              was, l->share, s->balanced, s->gpu_ms, s->cpu_ms, starved ? "waited" : "kept up", s->period, 100 * ahead);
    }
  }
  pthread_mutex_unlock(&l->mu);
}
