/*
 * The decode option's policy, in one place: where JPEGs are decoded (chosen once at open, and by
 * decode=auto again once nvJPEG has started), what the rest of the loader sets aside for it, and
 * hybrid's split of each batch between the workers and the GPU, which adapts to the measured rates
 * of both sides. Built with or without CUDA.
 *
 * Lock order: l->mu only.
 */
#include "gpu/gpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const decode_names[] = {"auto", "cpu", "gpu", "hybrid"};

bool dl__decode_may_use_gpu(const dl_loader *l) { return l->o.ndevices && l->o.decode != DL__DECODE_CPU; }

bool dl__decode_feeds_gpu(const dl_loader *l) { return l->decode != DL__DECODE_CPU || l->decode_starting; }

/* A batch opened while nvJPEG was still starting (decode=auto) stays on the workers. */
int dl__split_cpu_n(const dl_loader *l, int len) {
  return l->decode == DL__DECODE_HYBRID ? (int)lround(len * (1 - l->share)) : l->decode == DL__DECODE_CPU ? len : 0;
}

/* Hybrid's first split, a guess from the measured rates of engines and cores; it adapts from there. */
static double first_share(const dl_loader *l) {
  return l->o.gpu_share >= 0 ? l->o.gpu_share : l->gpu_hw ? 0.75 : 0.5;
}

int dl__decode_choose(dl_loader *l) {
  int want = l->o.decode;
  const char *asked = decode_names[want];
  char why[sizeof l->decode_reason] = "";
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
  } else if (want == DL__DECODE_AUTO && dl__gpu_decoders_take_kept(l, why, sizeof why) == 0) {
    l->decode = DL__DECODE_HYBRID; /* an earlier loader's decoders: no start to wait for */
    snprintf(l->decode_reason, sizeof l->decode_reason, "%s", why);
  } else if (want == DL__DECODE_AUTO && dl__gpu_decoders_available(why, sizeof why)) {
    /* nvJPEG takes 0.45-0.65 s to start (an H100, more than the first batches take on the CPU):
     * the GPU stage starts it in the background and the workers decode every JPEG until it is
     * ready. Only auto: decode=gpu|hybrid fail at open when it cannot start. */
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
const char *dl__split_limit(double x, int b, double gpu_ms, double cpu_ms, double walk_ms, double workers,
                            double *gpu_part, double *cpu_part) {
  if (!(gpu_ms > 0 && cpu_ms > 0 && workers > 0))
    return NULL;
  *gpu_part = x * b * gpu_ms;
  *cpu_part = ((1 - x) * cpu_ms + x * walk_ms) * b / workers;
  double longer = fmax(*gpu_part, *cpu_part);
  if (fabs(*gpu_part - *cpu_part) <= 0.1 * longer)
    return "neither";
  return *gpu_part > *cpu_part ? "gpu" : "cpu";
}

/* The GPU's share at which both sides finish a batch together: (1 - x) CPU_MS + x WALK_MS = x GPU_MS
 * WORKERS, the workers' time on a batch against the GPU's. The walk is the workers' cost of an
 * image the GPU takes: its markers read, and in a run's first epoch the scan of one the device does
 * not read (gpu_check, about 0.55 of a decode; gpu/walk.cu reads the engines' files). Left out, the first epoch's balance put on the workers more than they could do
 * beside their walks; with it, a walk as slow as the GPU side's whole cost per worker gives the
 * GPU every image (an H100 host, a first run over 20,000 q90 images: 5 epochs at 0.77 and 0.89 of
 * gpu_check=0's rate, against 0.75 and 0.75 with the walks left out). */
static double balance(double gpu_ms, double cpu_ms, double walk_ms, double workers) {
  double d = cpu_ms - walk_ms + gpu_ms * workers;
  return d > cpu_ms ? cpu_ms / d : 1;
}

static bool keeps_ahead(const dl_loader *l, const dl__split *s, double x) {
  /* Every worker: those workers=auto sets aside come back as soon as the consumer waits (counted
   * as set aside, a training run's seven of sixteen would keep the GPU decoding for good). */
  double gpu, cpu;
  if (!(s->period > 0) ||
      !dl__split_limit(x, l->o.batch_size, s->gpu_ms, s->cpu_ms, s->walk_ms, (double)l->o.workers / l->nstreams, &gpu,
                       &cpu))
    return true; /* nothing measured to go by */
  return fmax(gpu, cpu) <= 0.8 * s->period;
}

/* The split's move toward BALANCED from SHARE (UP: the votes' way): half the gap, in 32nds of a
 * batch, one at least. Each side's rate is measured where the split is and moves with it, so a
 * move goes half way and the next votes measure again. Steps of one 32nd could not follow a
 * dataset's first run, whose walks (gpu_check) move the balance to 1 and, once they end, back: on
 * an H100 host over 20,000 q90 images the share took 24 batches to climb from 0.75 to 1 and 36 to
 * come back to 0.63, and a first epoch of 23 batches ended before the split got there. */
static double toward(double share, double balanced, bool up) {
  double gap = balanced - share;
  if (!(up ? gap > 0 : gap < 0))
    return up ? 1.0 / 32 : -1.0 / 32;
  double n = fmax(1, round(fabs(gap) * 16));
  return (up ? n : -n) / 32;
}

/* With gpu_share=S fixed the rates are still measured, for the stats: where the split would go. */
void dl__gpu_share_update(dl_loader *l, int gpu_samples, double gpu_ms) {
  pthread_mutex_lock(&l->mu);
  if (l->decode != DL__DECODE_HYBRID) {
    pthread_mutex_unlock(&l->mu);
    return;
  }
  dl__split *s = &l->split;
  int64_t cpu_n = atomic_load_explicit(&l->st.cpu_decoded, memory_order_relaxed);
  int64_t cpu_ns = atomic_load_explicit(&l->st.cpu_decode_ns, memory_order_relaxed);
  int64_t dn = cpu_n - s->cpu_decoded, dns = cpu_ns - s->cpu_ns;
  int64_t planned = atomic_load_explicit(&l->st.gpu_planned, memory_order_relaxed);
  int64_t plan_ns = atomic_load_explicit(&l->st.gpu_plan_ns, memory_order_relaxed);
  int64_t pn = planned - s->planned, pns = plan_ns - s->plan_ns;
  bool starved = l->st.starved > s->starved;
  /* The copy threads' share of the time since the last update spent waiting for the consumer to
   * give a slot back (its GPU still reading it, or its thread holding them all): how far ahead of
   * the consumer the loader runs. */
  int64_t rw = atomic_load_explicit(&l->st.release_wait_ns, memory_order_relaxed);
  double now = dl__now(), span = s->t > 0 ? now - s->t : 0;
  double ahead = span > 0 ? (double)(rw - s->release_wait_ns) * 1e-9 / span / l->nstreams : 0;
  s->cpu_decoded = cpu_n, s->cpu_ns = cpu_ns, s->planned = planned, s->plan_ns = plan_ns;
  s->starved = l->st.starved, s->release_wait_ns = rw, s->t = now;
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
    if (pn > 0)
      s->walk_ms = s->walk_ms > 0 ? 0.8 * s->walk_ms + 0.2 * (double)pns / 1e6 / (double)pn : (double)pns / 1e6 / (double)pn;
    if (s->gpu_ms > 0 && s->cpu_ms > 0) {
      double workers = (double)(l->pace.on ? l->pace.active : l->o.workers) / l->nstreams;
      s->balanced = balance(s->gpu_ms, s->cpu_ms, s->walk_ms, workers);
    }
    /* The split moves toward that balance while the consumer waits for batches. Both sides
     * share the host's cores, so each side's rate is measured where the split is: at a larger
     * GPU share the workers idle more and the thread feeding nvJPEG runs faster (an H200 host,
     * q90: 23.3 thousand images/s on the GPU side at share 0.7, 17.9 at 0.59). Which side waited
     * for the other, the rule before, settled at such a local balance (0.59, 26,000 images/s
     * where a fixed 0.7 gave 30,700). A consumer that never waits leaves the split drifting to
     * the CPU while the copy stage waits for the consumer over a quarter of the time (the
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
    /* Moves after three votes the same way: nvJPEG sets up again for every new batch size, so the
     * split does not flicker. Toward the balance while the consumer waits, half the way there in
     * 32nds of a batch, one at least (see toward). A loader over twice as fast as its consumer (the
     * copy stage waiting over half the time) leaves the GPU in steps of 1/8: a model's GPU is not
     * to be shared for long (ResNet-50 on an H200, 55 ms steps: at 1/32 a 300-step run decoded 18%
     * of its images on the GPU on the way to share 0, and trained 1.7% slower than decode=cpu). */
    if (s->votes >= 3 || s->votes <= -3) {
      double step = starved ? toward(l->share, s->balanced, s->votes > 0)
                    : s->votes > 0 ? 1.0 / 32
                    : ahead > 0.5  ? -1.0 / 8
                                   : -1.0 / 32,
             was = l->share;
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
              "%.3f on a worker and %.3f for each of the GPU's; the consumer %s, %.2f ms a batch; the copy stage "
              "waited for it %.0f%% of the time)",
              was, l->share, s->balanced, s->gpu_ms, s->cpu_ms, s->walk_ms, starved ? "waited" : "kept up", s->period,
              100 * ahead);
    }
  }
  pthread_mutex_unlock(&l->mu);
}
