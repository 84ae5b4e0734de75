/*
 * The prefetch ring: per output stream, P batch slots; batch k lives in slot k % P. Workers claim
 * samples in batch order but only for batches whose slot is free, so memory is fixed and the
 * consumer's pace is the backpressure. Batches complete out of order and are handed out in order.
 *
 * Lock order: l->mu only (no other lock is taken while it is held).
 */
#include "internal.h"
#include "gpu/gpu.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool exhausted(const dl__stream *s) { return s->sm.total >= 0 && s->claim_k >= s->sm.total; }

/* The slot for the stream's next claim if workers may fill it; starts the batch if needed. */
static dl_batch *open_slot(dl_loader *l, dl__stream *s) {
  if (exhausted(s))
    return NULL;
  dl_batch *b = &s->slots[s->claim_k % l->o.prefetch];
  if (b->state == DL__SLOT_FILLING && b->k == s->claim_k)
    return b;
  if (b->state != DL__SLOT_FREE)
    return NULL;
  b->state = DL__SLOT_FILLING;
  b->k = s->claim_k;
  dl__sampler_locate(&s->sm, s->claim_k, &b->epoch, &b->index, &(int64_t){0});
  b->len = dl__sampler_batch_len(&s->sm, s->claim_k);
  b->done = 0;
  b->ready = false;
  b->err = 0;
  b->err_i = INT_MAX;
  b->errmsg[0] = 0;
  b->arena_used = 0;
  /* Hybrid's split: how many samples the workers decode (the GPU may take the others). A batch
   * opened while nvJPEG was still starting (decode=auto) stays on the workers. */
  b->cpu_n = l->decode == DL__DECODE_HYBRID ? (int)lround(b->len * (1 - l->share))
             : l->decode == DL__DECODE_CPU  ? b->len
                                            : 0;
  return b;
}

int dl__ring_claim(dl_loader *l, dl__claim *c, bool block) {
  pthread_mutex_lock(&l->mu);
  for (;;) {
    if (l->stop) {
      pthread_mutex_unlock(&l->mu);
      return -1;
    }
    dl__stream *best = NULL;
    dl_batch *slot = NULL;
    bool any_left = false;
    for (int i = 0; i < l->nstreams; i++) {
      dl__stream *s = &l->streams[i];
      any_left |= !exhausted(s);
      if (best && s->claim_k >= best->claim_k)
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
      c->index = dl__sampler_sample(&best->sm, best->claim_k, best->claim_i, &c->epoch);
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
    pthread_cond_wait(&l->work_cv, &l->mu);
    atomic_fetch_add_explicit(&l->st.slot_wait_ns, (int64_t)((dl__now() - t0) * 1e9), memory_order_relaxed);
  }
}

void dl__ring_done(dl_loader *l, const dl__claim *c, const dl__err *e) {
  dl_batch *b = c->slot;
  pthread_mutex_lock(&l->mu);
  if (e && e->code && c->i < b->err_i && l->o.on_error == DL__ON_ERROR_FAIL) {
    b->err = e->code;
    b->err_i = c->i;
    memcpy(b->errmsg, e->msg, sizeof b->errmsg);
  }
  if (++b->done == b->len) {
    b->state = DL__SLOT_COMPLETE;
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
