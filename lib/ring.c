/*
 * The prefetch ring: per output stream, P batch slots; a batch starts in whichever slot is free.
 * Workers claim samples in batch order but only for a batch that has a slot, so memory is fixed and
 * the consumer's pace is the backpressure. Batches complete out of order and are handed out in order.
 *
 * Lock order: l->mu only (no other lock is taken while it is held).
 */
#include "core.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool exhausted(const dl__stream *s) { return s->sm.total >= 0 && s->claim_k >= s->sm.total; }

dl_batch *dl__slot_of(dl_batch *slots, int n, int64_t k) {
  for (int i = 0; i < n; i++)
    if (slots[i].k == k && slots[i].state != DL__SLOT_FREE)
      return &slots[i];
  return NULL;
}

/* In turn rather than the lowest free: a device slot's last consumer may still be reading it on
 * its stream (the copy into it waits for that), and the one freed longest ago has surely finished;
 * the starter pins host slots in index order too. */
dl_batch *dl__slot_free_after(dl_batch *slots, int n, const dl_batch *last) {
  int from = last ? (int)(last - slots) + 1 : 0;
  for (int j = 0; j < n; j++) {
    dl_batch *b = &slots[(from + j) % n];
    if (b->state == DL__SLOT_FREE)
      return b;
  }
  return NULL;
}

/* The slot for the stream's next claim if workers may fill it; starts the batch in a free slot if
 * needed. */
static dl_batch *open_slot(dl_loader *l, dl__stream *s) {
  if (exhausted(s))
    return NULL;
  dl_batch *b = s->filling;
  if (b && b->state == DL__SLOT_FILLING && b->k == s->claim_k)
    return b;
  if (!(b = dl__slot_free_after(s->slots, l->o.prefetch, s->filling)))
    return NULL;
  s->filling = b;
  b->state = DL__SLOT_FILLING;
  b->k = s->claim_k;
  dl__sampler_locate(&s->sm, s->claim_k, &b->epoch, &b->index, &(int64_t){0});
  /* The index within the whole epoch: a resumed epoch's batches come after those handed out
   * before the token was saved, and its last is the epoch's last (nb - 1) as in any epoch. */
  if (b->epoch == s->sm.start_epoch)
    b->index += s->sm.nb - s->sm.nb_first;
  b->len = dl__sampler_batch_len(&s->sm, s->claim_k);
  b->done = 0;
  b->ready = false;
  b->err = 0;
  b->err_i = INT_MAX;
  b->errmsg[0] = 0;
  b->arena_used = 0;
  /* Hybrid's split: how many samples the workers decode (the GPU may take the others), and which.
   * A batch opened while nvJPEG was still starting (decode=auto) stays on the workers. */
  b->cpu_n = dl__split_cpu_n(l, b->len);
  if (b->on_cpu && b->cpu_n > 0 && b->cpu_n < b->len) /* no arena (no JPEG the GPU may take): no choice */
    dl__gpu_split_batch(l, &s->sm, b);
  return b;
}

int dl__ring_claim(dl_loader *l, dl__claim *c, bool block, int worker) {
  pthread_mutex_lock(&l->mu);
  for (;;) {
    if (l->stop) {
      pthread_mutex_unlock(&l->mu);
      return -1;
    }
    /* A worker set aside (workers=auto) claims nothing: it waits, while there is work left, to be
     * given back. */
    bool parked = l->pace.on && worker >= l->pace.active;
    dl__stream *best = NULL;
    dl_batch *slot = NULL;
    bool any_left = false;
    for (int i = 0; i < l->nstreams; i++) {
      dl__stream *s = &l->streams[i];
      any_left |= !exhausted(s);
      if (parked || (best && s->claim_k >= best->claim_k))
        continue;
      dl_batch *b = open_slot(l, s);
      if (b) {
        best = s;
        slot = b;
      }
    }
    if (best) {
      c->slot = slot;
      c->i = best->claim_i;
      c->index = dl__sampler_sample(&best->sm, best->claim_k, best->claim_i, &c->epoch, &c->draw);
      c->arena = dl__gpu_arena_take(l, slot, c->i, &l->ds.samples[c->index]);
      c->hybrid = l->decode == DL__DECODE_HYBRID;
      if (++best->claim_i == slot->len) {
        best->claim_i = 0;
        best->claim_k++;
      }
      pthread_mutex_unlock(&l->mu);
      return 1;
    }
    if (!any_left || !block) {
      pthread_mutex_unlock(&l->mu);
      return any_left ? 0 : -1;
    }
    double t0 = dl__now();
    if (!parked)
      l->pace.waiting++, l->pace.since += t0;
    pthread_cond_wait(&l->work_cv, &l->mu);
    if (!parked)
      l->pace.waiting--, l->pace.since -= t0;
    atomic_fetch_add_explicit(parked ? &l->st.parked_ns : &l->st.slot_wait_ns, (int64_t)((dl__now() - t0) * 1e9),
                              memory_order_relaxed);
  }
}

void dl__ring_done(dl_loader *l, const dl__claim *c, const dl__err *e) {
  dl_batch *b = c->slot;
  pthread_mutex_lock(&l->mu);
  /* Storage that is down fails the run even with on_error=skip: batches of zeros are no training.
   * A read's failure is an errno (above the DL_E codes, which start at DL_ECORRUPT) or a remote
   * one; a sample's own (corrupt, unsupported, over a limit) is not. */
  bool read_error = e && (e->code == DL_EREMOTE || (e->code < 0 && e->code > DL_ECORRUPT));
  int failures = read_error ? atomic_load_explicit(&l->read_failures, memory_order_relaxed) : 0;
  bool down = failures >= DL__STORAGE_DOWN && l->o.on_error != DL__ON_ERROR_FAIL;
  if (e && e->code && c->i < b->err_i && (l->o.on_error == DL__ON_ERROR_FAIL || down)) {
    b->err = e->code;
    b->err_i = c->i;
    if (down) {
      /* Remote failures count after their retries, or at once where retrying cannot help (a server
       * that ignores byte ranges): the first part of the message says which. */
      const char *what = l->remote ? "requests in a row failed: the server is down or cannot serve them"
                                   : "reads in a row failed: the storage is down";
      snprintf(b->errmsg, sizeof b->errmsg, "%.700s; %d %s, and on_error=skip covers bad samples, not "
               "storage that serves none", e->msg, failures, what);
    } else {
      memcpy(b->errmsg, e->msg, sizeof b->errmsg);
    }
  }
  if (++b->done == b->len) {
    b->state = DL__SLOT_COMPLETE;
    if (!l->st.first_filled_ms)
      l->st.first_filled_ms = (dl__now() - l->open_time) * 1e3;
    if (!l->cuda)
      b->ready = true;
    pthread_cond_broadcast(&l->ready_cv);
  }
  pthread_mutex_unlock(&l->mu);
}

/* Called with l->mu held: the slot returns to the workers (or to the copy stage). */
void dl__slot_free_locked(dl_batch *b) {
  dl_loader *l = b->l;
  b->state = DL__SLOT_FREE;
  b->ready = false;
  pthread_cond_broadcast(b->is_device ? &l->ready_cv : &l->work_cv);
}

/*
 * workers=auto while running. Over each window (8 batches, 50 ms at least), the consumer's waits
 * and the workers' wait for a free slot (in workers: 2.0 is two workers' worth of idling) decide:
 * - the consumer waited for a batch (more than 0.5 ms while its GPU had nothing left: st.starved) or
 *   more than 0.5% of the window: half the workers set aside come back;
 * - it waited for none and the workers idled more than one and a half workers' worth: up to half
 *   of that idling is set aside, never below one and a half times the workers' worth at work, and
 *   not in the four windows after workers came back, nor over a window the consumer spent mostly in
 *   one pause.
 * The headroom is what keeps the consumer from waiting: a training loop whose host thread is near
 * its limit loses each wait in full (the rule before this one set workers aside to within a few
 * percent of the consumer's rate and gave them back only once it had waited 2% of a window).
 * Which worker decodes which sample never changes a batch's bytes, so this is invisible but for
 * the CPUs it frees.
 */
void dl__pace_locked(dl_loader *l, double now) {
  dl__pace *p = &l->pace;
  if (!p->on)
    return;
  /* The workers' waits for slots, those still going on included up to NOW: a wait counts in the
   * window it passes in, not in the one it ends in (a wait through a consumer's pause ended in the
   * window after it, which then read as fifteen workers' worth of surplus: one worker was left, and a
   * ResNet-50 fed after 3 s pauses took three steps of 390 ms in every fourth block). */
  double slot = (double)atomic_load_explicit(&l->st.slot_wait_ns, memory_order_relaxed) * 1e-9 +
                p->waiting * now - p->since;
  if (l->st.batches <= 3 || !p->t) { /* the first batches carry the start-up */
    if (l->st.batches >= 3)
      p->t = p->last = now, p->gap = 0, p->wait = dl__consumer_idle_s(&l->st), p->batches = l->st.batches,
      p->slot = slot, p->starved = l->st.starved;
    return;
  }
  p->gap = now - p->last > p->gap ? now - p->last : p->gap;
  p->last = now;
  double span = now - p->t;
  if (l->st.batches - p->batches < 8 || span < 0.05)
    return;
  /* A consumer that paused (an evaluation, a checkpoint) left the workers waiting for slots, which
   * is no sign of too many: set aside then, they were missing when it came back (a ResNet-50 fed
   * in 50-step blocks after 2.7 s pauses: single steps of 420-465 ms). */
  bool paused = p->gap > span / 2;
  p->gap = 0;
  double waited = (dl__consumer_idle_s(&l->st) - p->wait) / span, idle = (slot - p->slot) / span;
  int64_t window = l->st.batches - p->batches, starved = l->st.starved - p->starved;
  p->t = now, p->wait = dl__consumer_idle_s(&l->st), p->batches = l->st.batches, p->slot = slot;
  p->starved = l->st.starved;
  int was = p->active;
  double busy = p->active - idle; /* workers' worth decoding and reading */
  int floor = (int)ceil(1.5 * (busy > 0 ? busy : 0));
  floor = floor < 1 ? 1 : floor;
  if ((starved > 0 || waited > 0.005) && p->active < l->nworkers) {
    p->active += (l->nworkers - p->active + 1) / 2;
    p->calm = 4;
    snprintf(p->why, sizeof p->why, "%d of %d workers: the consumer waited for %" PRId64 " of the last %" PRId64
             " batches (%.1f%% of their time)", p->active, l->nworkers, starved, window, 100 * waited);
    pthread_cond_broadcast(&l->work_cv);
  } else if (p->calm > 0) {
    p->calm--;
  } else if (starved == 0 && !paused && idle > 1.5 && p->active > floor) {
    int aside = (int)(idle / 2) > 1 ? (int)(idle / 2) : 1;
    p->active = p->active - aside > floor ? p->active - aside : floor;
    snprintf(p->why, sizeof p->why, "%d of %d workers: the consumer kept up (waited %.2f%%) while the workers "
             "waited for free slots %.1f workers' worth of the time", p->active, l->nworkers, 100 * waited, idle);
  }
  if (p->active != was)
    dl__log(DL__LOG_DEBUG, "workers=auto: %s", p->why);
}

/* The shard cache's look ahead (io/shard_cache.c): a number that moves with every claim, and the
 * files of the samples from the claims on, stream by stream, LIMIT samples in all. */
static int64_t claims_position(void *arg) {
  dl_loader *l = arg;
  int64_t position = 0;
  pthread_mutex_lock(&l->mu);
  for (int s = 0; s < l->nstreams; s++)
    position += l->streams[s].claim_k * 4096 + l->streams[s].claim_i;
  pthread_mutex_unlock(&l->mu);
  return position;
}

static void claims_files(void *arg, int64_t limit, void (*each)(void *ctx, uint32_t file), void *ctx) {
  dl_loader *l = arg;
  int64_t claim[DL__MAX_DEVICES], seen = 0;
  int claim_i[DL__MAX_DEVICES];
  pthread_mutex_lock(&l->mu);
  for (int s = 0; s < l->nstreams; s++) {
    claim[s] = l->streams[s].claim_k;
    claim_i[s] = l->streams[s].claim_i;
  }
  pthread_mutex_unlock(&l->mu);
  for (int st = 0; st < l->nstreams; st++) {
    const dl__sampler *sm = &l->streams[st].sm;
    for (int64_t k = claim[st]; seen < limit && (sm->total < 0 || k < sm->total); k++) {
      int len = dl__sampler_batch_len(sm, k);
      for (int i = k == claim[st] ? claim_i[st] : 0; i < len; i++, seen++) {
        int64_t epoch;
        each(ctx, l->ds.samples[dl__sampler_sample(sm, k, i, &epoch, NULL)].file);
      }
    }
  }
}

dl__upcoming dl__ring_upcoming(dl_loader *l) { return (dl__upcoming){claims_position, claims_files, l}; }
