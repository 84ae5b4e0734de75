/*
 * The consumer's side: batches handed out in order, released in any order, their fields as
 * DLPack tensors, and kept alive past dl_close() while exported tensors still point into them.
 *
 * Lock order: l->mu only.
 */
#include "core.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

static bool exhausted_out(const dl__stream *s) { return s->sm.total >= 0 && s->next_out >= s->sm.total; }

int dl_next_batch_on(dl_loader *l, int dev, dl_batch **out) { return dl_next_batch_timed(l, dev, -1, out); }

/* Under l->mu: a consumer of device DEV waited WAITED seconds, for a batch it got (HANDED) or in
 * a slice of its wait. A CUDA consumer queues its work ahead of its GPU, so its thread waits here
 * even while its GPU is busy: that part of the waiting is counted apart, and pacing, the hybrid
 * split and the verdict go by the rest. */
static void count_wait(dl_loader *l, int dev, double waited, bool handed) {
  l->st.consumer_wait_s += waited;
  if (waited > 0 && l->cuda && dl__cuda_consumer_busy_locked(l, dev))
    l->st.consumer_wait_gpu_busy_s += waited;
  else if (handed && waited > 0.0005)
    l->st.starved++;
}

#define HELD_WARN_S 5.0

static bool before(const struct timespec *a, const struct timespec *b) {
  return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* Every slot a consumer could get its next batch from holds a batch handed out and not released,
 * B among them handed to another consumer thread, which alone can free it. If it never does (it
 * waits here too, or keeps B's tensors while it waits on something else), every consumer waits
 * for ever: after HELD_WARN_S seconds of this the loader says so, once. True while the consumer
 * should look again within a second. */
static bool held_elsewhere(dl_loader *l, dl__stream *s, const dl_batch *b) {
  double now = dl__now();
  if (!s->held_since)
    s->held_since = now;
  if (!s->held_told && now - s->held_since >= HELD_WARN_S) {
    s->held_told = true;
    dl__log(DL__LOG_WARN,
            "batch %" PRId64 " has waited %.0f s for a slot: all %d hold batches not released, batch %" PRId64
            " among them, handed to another thread: release it (in Python, drop that batch and its "
            "tensors), or raise %s",
            s->next_out, now - s->held_since, s->dslots ? l->o.device_slots : l->o.prefetch, b->k,
            s->dslots ? "device_slots" : "prefetch");
  }
  return !s->held_told;
}

/* Under l->mu, when the next batch has no slot: whether every slot is held by a consumer, and if
 * so the oldest batch held (*OLDEST) and the oldest held by another thread (*OTHER, NULL when this
 * thread holds them all). */
static bool all_held(const dl_batch *slots, int n, int64_t *oldest, const dl_batch **other) {
  *oldest = INT64_MAX;
  *other = NULL;
  for (int i = 0; i < n; i++) {
    const dl_batch *b = &slots[i];
    if (b->state != DL__SLOT_HELD)
      return false;
    *oldest = b->k < *oldest ? b->k : *oldest;
    if (!pthread_equal(b->holder, pthread_self()) && (!*other || b->k < (*other)->k))
      *other = b;
  }
  return true;
}

int dl_next_batch_timed(dl_loader *l, int dev, int timeout_ms, dl_batch **out) {
  if (!out) /* a batch taken with nowhere to put it could never be released */
    return dl__fail(-EINVAL, "dl_next_batch: no place for the batch (OUT is NULL)");
  *out = NULL;
  if (dl__forked(l))
    return DL_EFORKED;
  if (dev < 0 || dev >= l->nstreams)
    return dl__fail(DL_ENODEVICE, "device index %d: the loader has %d", dev, l->nstreams);
  dl__stream *s = &l->streams[dev];
  double t0 = dl__now();
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline); /* the clock of ready_cv */
  deadline.tv_sec += timeout_ms / 1000;
  deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
  if (deadline.tv_nsec >= 1000000000)
    deadline.tv_sec++, deadline.tv_nsec -= 1000000000;
  pthread_mutex_lock(&l->mu);
  l->consumers++;
  int r = 0;
  dl_batch *b = NULL;
  /* The slot is looked up again on every wake: another consumer thread may have taken the batch
   * this one was waiting for. */
  for (;;) {
    if (l->closing) {
      r = dl__fail(DL_ECLOSED, "the loader was closed while waiting for a batch");
      break;
    }
    if (exhausted_out(s)) {
      r = DL_EOF;
      break;
    }
    dl_batch *slots = s->dslots ? s->dslots : s->slots;
    int nslots = s->dslots ? l->o.device_slots : l->o.prefetch;
    b = dl__slot_of(slots, nslots, s->next_out);
    if (b && b->ready) {
      s->held_since = 0, s->held_told = false;
      break;
    }
    /* Every slot held by this very thread: waiting cannot end (it would have to release one
     * first). Some by another consumer thread: that one releases them in its own time
     * (held_elsewhere warns when it takes long). */
    const dl_batch *other;
    int64_t oldest;
    bool stuck = !b && all_held(slots, nslots, &oldest, &other);
    if (stuck && !other) {
      r = dl__fail(DL_EBUSY,
                   "batch %" PRId64 " cannot be filled: all %d slots hold batches held by the consumer, the "
                   "oldest batch %" PRId64 " (release batches sooner, or raise %s)",
                   s->next_out, nslots, oldest, s->dslots ? "device_slots" : "prefetch");
      break;
    }
    bool look = false;
    if (stuck)
      look = held_elsewhere(l, s, other);
    else
      s->held_since = 0, s->held_told = false;
    struct timespec until = deadline;
    if (look) { /* a second on, or the caller's deadline if that comes first */
      struct timespec soon;
      clock_gettime(CLOCK_REALTIME, &soon);
      soon.tv_sec += 1;
      if (timeout_ms < 0 || before(&soon, &deadline))
        until = soon;
    }
    int w = timeout_ms < 0 && !look ? pthread_cond_wait(&l->ready_cv, &l->mu)
                                    : pthread_cond_timedwait(&l->ready_cv, &l->mu, &until);
    if (w == ETIMEDOUT && timeout_ms >= 0 && !before(&until, &deadline)) {
      r = dl__fail(-ETIMEDOUT, "no batch within %d ms", timeout_ms);
      break;
    }
  }
  if (r) {
    if (r == -ETIMEDOUT) /* a consumer waiting in slices (the Python binding) still waited */
      count_wait(l, dev, dl__now() - t0, false);
    if (--l->consumers == 0 && l->closing)
      pthread_cond_broadcast(&l->ready_cv); /* dl_close waits for the last one to leave */
    pthread_mutex_unlock(&l->mu);
    return r;
  }
  b->state = DL__SLOT_HELD;
  b->holder = pthread_self();
  b->ready = false;
  b->refs = 1;
  s->next_out++;
  s->handed = s->next_out;
  l->st.batches++;
  double now = dl__now();
  count_wait(l, dev, now - t0, true);
  dl__pace_locked(l, now);
  l->st.last_batch_s = now - l->open_time;
  if (l->st.batches == 1) {
    l->st.first_batch_ms = (now - l->open_time) * 1000;
    l->st.first_wait_s = dl__consumer_idle_s(&l->st);
  }
  int err = b->err;
  if (err) {
    dl__fail(err, "%s", b->errmsg);
    b->refs = 0;
    dl__slot_free_locked(b);
  }
  if (--l->consumers == 0 && l->closing)
    pthread_cond_broadcast(&l->ready_cv);
  pthread_mutex_unlock(&l->mu);
  if (err)
    return err;
  *out = b;
  return 0;
}

int dl_next_batch(dl_loader *l, dl_batch **out) { return dl_next_batch_timed(l, 0, -1, out); }

int dl_batch_size(const dl_batch *b) { return b ? b->len : 0; }

const char *dl_batch_key(const dl_batch *b, int i) {
  return b && i >= 0 && i < b->len ? b->key[i] : NULL;
}

const char *const *dl_batch_keys(const dl_batch *b) { return b ? (const char *const *)b->key : NULL; }

int dl_batch_sample_error(const dl_batch *b, int i) {
  return b && i >= 0 && i < b->len ? b->sample_err[i] : -EINVAL;
}

int dl_batch_errors(const dl_batch *b) {
  int n = 0;
  for (int i = 0; b && i < b->len; i++)
    n += b->sample_err[i] != 0;
  return n;
}

int dl_batch_position(const dl_batch *b, int64_t *epoch, int64_t *index) {
  if (epoch)
    *epoch = b->epoch;
  if (index)
    *index = b->index;
  return 0;
}

int dl__batch_describe(const dl_batch *b, const char *name, DLDevice device, DLTensor *t) {
  dl_loader *l = b->l;
  dl_batch *m = (dl_batch *)b;
  memset(t, 0, sizeof *t);
  t->device = device;
  if (l->has_image && !strcmp(name, "image")) {
    static const DLDataType types[] = {{kDLUInt, 8, 1}, {kDLFloat, 32, 1}, {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}};
    t->data = b->image;
    t->ndim = 4;
    t->dtype = device.device_type == kDLCUDA || l->host_float ? types[l->o.dtype] : types[0];
    int64_t *sh = m->image_shape;
    sh[0] = b->len;
    if (l->o.layout == DL__LAYOUT_NHWC)
      sh[1] = l->o.height, sh[2] = l->o.width, sh[3] = l->o.channels;
    else
      sh[1] = l->o.channels, sh[2] = l->o.height, sh[3] = l->o.width;
    t->shape = sh;
    if (l->o.layout == DL__LAYOUT_CHANNELS_LAST) { /* the samples' bytes are NHWC: strides say so */
      int64_t *st = m->image_strides;
      st[0] = sh[1] * sh[2] * sh[3], st[1] = 1, st[2] = sh[3] * l->o.channels, st[3] = l->o.channels;
      t->strides = st;
    }
    return 0;
  }
  if (!strcmp(name, "label")) {
    t->data = b->label;
    t->ndim = 1;
    t->dtype = (DLDataType){kDLInt, 64, 1};
    m->label_shape[0] = b->len;
    t->shape = m->label_shape;
    return 0;
  }
  for (int f = 0; f < l->nfields; f++) {
    const dl__field *fd = &l->fields[f];
    size_t n = strlen(fd->name);
    if (!strcmp(name, fd->name)) {
      t->data = b->fields + fd->at;
      t->ndim = 1 + fd->ndim;
      t->dtype = fd->dtype;
      m->field_shape[f][0] = b->len;
      memcpy(&m->field_shape[f][1], fd->shape, sizeof(int64_t) * (size_t)fd->ndim);
      t->shape = m->field_shape[f];
      return 0;
    }
    if (l->o.pad && !strncmp(name, fd->name, n) && !strcmp(name + n, "_len")) {
      t->data = b->fields + fd->len_at;
      t->ndim = 1;
      t->dtype = (DLDataType){kDLInt, 64, 1};
      m->len_shape[0] = b->len;
      t->shape = m->len_shape;
      return 0;
    }
  }
  return dl__fail(DL_ENOFIELD, "no field '%s' (see dl_batch_field_name)", name);
}

int dl_batch_field(const dl_batch *b, const char *name, DLTensor *t) {
  if (!b || !name || !t)
    return dl__fail(-EINVAL, "dl_batch_field: %s is NULL", !b ? "the batch" : !name ? "the field name" : "OUT");
  if (b->is_device)
    return dl__cuda_field(b, name, t);
  return dl__batch_describe(b, name, (DLDevice){kDLCPU, 0}, t);
}

int dl_batch_bytes_count(const dl_batch *b) { return b ? b->l->nbfields : 0; }

const char *dl_batch_bytes_name(const dl_batch *b, int f) {
  return b && f >= 0 && f < b->l->nbfields ? b->l->bfields[f].name : NULL;
}

const char *dl_batch_bytes_kind(const dl_batch *b, int f) {
  if (!b || f < 0 || f >= b->l->nbfields)
    return NULL;
  const dl__bfield *bf = &b->l->bfields[f];
  switch (b->l->ds.bytes_kind[bf->ds_index]) {
  case DL__BYTES_TEXT: return "text";
  case DL__BYTES_JSON: return "json";
  case DL__BYTES_RAW: return "bytes";
  }
  const char *dot = strrchr(bf->name, '.');
  const char *ext = dot ? dot + 1 : bf->name;
  return !strcasecmp(ext, "txt") || !strcasecmp(ext, "text") ? "text" : !strcasecmp(ext, "json") ? "json" : "bytes";
}

const void *dl_batch_bytes(const dl_batch *b, const char *name, int i, size_t *len) {
  if (len)
    *len = 0;
  if (!b || !name || i < 0 || i >= b->len)
    return NULL;
  const dl_loader *l = b->l;
  for (int f = 0; f < l->nbfields; f++) {
    if (strcmp(l->bfields[f].name, name))
      continue;
    const dl__bytes_ref *r = &b->brefs[(size_t)i * l->nbfields + f];
    if (!r->present)
      return NULL;
    if (len)
      *len = r->len;
    return b->blobs[i].p + r->at;
  }
  return NULL;
}

int dl_batch_field_count(const dl_batch *b) {
  const dl_loader *l = b->l;
  return (l->has_image ? 1 : 0) + 1 + l->nfields * (l->o.pad ? 2 : 1);
}

const char *dl_batch_field_name(const dl_batch *b, int i) {
  const dl_loader *l = b->l;
  if (i < 0 || i >= dl_batch_field_count(b))
    return NULL;
  if (l->has_image && i-- == 0)
    return "image";
  if (i-- == 0)
    return "label";
  int per = l->o.pad ? 2 : 1;
  const dl__field *fd = &l->fields[i / per];
  if (i % per == 0)
    return fd->name;
  return l->len_names[i / per];
}

/* Visits every batch slot, host and device; stops when FN returns true. */
static bool any_slot(dl_loader *l, bool (*fn)(dl_batch *)) {
  for (int s = 0; s < l->nstreams; s++) {
    dl__stream *st = &l->streams[s];
    for (int i = 0; st->slots && i < l->o.prefetch; i++)
      if (fn(&st->slots[i]))
        return true;
    for (int i = 0; st->dslots && i < l->o.device_slots; i++)
      if (fn(&st->dslots[i]))
        return true;
  }
  return false;
}

static bool has_refs(dl_batch *b) { return b->refs > 0; }

/* The consumer's own hold ends at dl_close(); exported tensors keep their batch alive. */
static bool drop_hold(dl_batch *b) {
  if (b->state == DL__SLOT_HELD)
    b->refs = b->exports;
  return false;
}

/* Under l->mu: the consumer has not released B yet (its hold is the one reference that is not an
 * export's). */
static bool consumer_holds(const dl_batch *b) { return b->state == DL__SLOT_HELD && b->refs - b->exports >= 1; }

/* The same, taking the lock: for a call that reads the slot after (its slot may hold another batch
 * by now otherwise). */
static bool still_held(dl_batch *b) {
  pthread_mutex_lock(&b->l->mu);
  bool held = consumer_holds(b);
  pthread_mutex_unlock(&b->l->mu);
  return held;
}

static void unref_locked(dl_batch *b, bool *free_now) {
  dl_loader *l = b->l;
  if (--b->refs > 0)
    return;
  if (b->is_device)
    dl__cuda_release_locked(b);
  dl__slot_free_locked(b);
  *free_now = l->closed && !any_slot(l, has_refs);
}

void dl_batch_release(dl_batch *b, void *stream) {
  if (!b)
    return;
  dl_loader *l = b->l;
  bool free_now = false;
  if (getpid() != l->pid)
    return; /* the parent's batch: nothing of it is the child's to release */
  pthread_mutex_lock(&l->mu);
  /* Releasing a batch a second time would free its slot while the workers fill it again or the
   * next batch waits in it, and the consumer would wait for that batch for ever. */
  if (!consumer_holds(b)) {
    pthread_mutex_unlock(&l->mu);
    dl__log(DL__LOG_WARN, "dl_batch_release: this batch was released already; the second release does nothing");
    return;
  }
  b->release_stream = stream;
  unref_locked(b, &free_now);
  pthread_mutex_unlock(&l->mu);
  if (free_now)
    dl__loader_free(l);
}

typedef struct export {
  DLManagedTensor m;
  int64_t shape[4], strides[4];
} export;

static void export_deleter(DLManagedTensor *m) {
  dl_batch *b = m->manager_ctx;
  free(m);
  dl_loader *l = b->l;
  bool free_now = false;
  if (getpid() != l->pid)
    return; /* the parent's batch: nothing of it is the child's to release */
  pthread_mutex_lock(&l->mu);
  b->exports--;
  unref_locked(b, &free_now);
  pthread_mutex_unlock(&l->mu);
  if (free_now)
    dl__loader_free(l);
}

int dl_batch_export(dl_batch *b, const char *name, DLManagedTensor **out) {
  if (!out)
    return dl__fail(-EINVAL, "dl_batch_export: no place for the tensor (OUT is NULL)");
  export *e = calloc(1, sizeof *e);
  if (!e)
    return dl__fail(-ENOMEM, "out of memory");
  int r = dl_batch_field(b, name, &e->m.dl_tensor);
  if (r) {
    free(e);
    return r;
  }
  memcpy(e->shape, e->m.dl_tensor.shape, sizeof(int64_t) * (size_t)e->m.dl_tensor.ndim);
  e->m.dl_tensor.shape = e->shape;
  if (e->m.dl_tensor.strides) {
    memcpy(e->strides, e->m.dl_tensor.strides, sizeof(int64_t) * (size_t)e->m.dl_tensor.ndim);
    e->m.dl_tensor.strides = e->strides;
  }
  e->m.manager_ctx = b;
  e->m.deleter = export_deleter;
  pthread_mutex_lock(&b->l->mu);
  bool held = consumer_holds(b);
  if (held) {
    b->refs++;
    b->exports++;
  }
  pthread_mutex_unlock(&b->l->mu);
  if (!held) { /* its slot may be filling with another batch: a tensor of it would change under the user */
    free(e);
    return dl__fail(-EINVAL, "dl_batch_export: the batch was released already; export before releasing it");
  }
  *out = &e->m;
  return 0;
}

int dl_batch_copy(dl_batch *b, const char *name, void *dst, size_t cap, void *stream) {
  if (!dst)
    return dl__fail(-EINVAL, "dl_batch_copy: no place for the copy (DST is NULL)");
  DLTensor t;
  int r = dl_batch_field(b, name, &t);
  if (r)
    return r;
  size_t bytes = (size_t)t.dtype.bits / 8 * t.dtype.lanes;
  for (int d = 0; d < t.ndim; d++)
    bytes *= (size_t)t.shape[d];
  if (bytes > cap)
    return dl__fail(-EINVAL, "dl_batch_copy: field '%s' is %zu bytes, more than the %zu of DST", name, bytes,
                    cap);
  if (!still_held(b))
    return dl__fail(-EINVAL, "dl_batch_copy: the batch was released already; copy before releasing it");
  if (b->is_device)
    return dl__forked(b->l) ? DL_EFORKED : dl__cuda_copy(b, dst, t.data, bytes, stream);
  memcpy(dst, t.data, bytes);
  return 0;
}

/* Into the slot's buffer, which lives as long as the slot: the steady state allocates nothing. */
const char *dl_batch_keys_text(dl_batch *b, size_t *len) {
  if (!b) {
    dl__fail(-EINVAL, "dl_batch_keys_text: no batch");
    return NULL;
  }
  if (!still_held(b)) {
    dl__fail(-EINVAL, "dl_batch_keys_text: the batch was released already; read its keys before "
                      "releasing it");
    return NULL;
  }
  size_t at = 0;
  for (int i = 0; i < b->len; i++) {
    size_t n = strlen(b->key[i]) + 1;
    if (dl__buf_reserve(&b->key_text, at + n)) {
      dl__fail(-ENOMEM, "dl_batch_keys_text: no memory for the keys of %d samples", b->len);
      return NULL;
    }
    memcpy(b->key_text.p + at, b->key[i], n);
    at += n;
  }
  if (len)
    *len = at;
  return (const char *)b->key_text.p;
}

int dl_batch_wait(dl_batch *b, void *stream) {
  if (!b)
    return dl__fail(-EINVAL, "no batch");
  if (b->is_device && dl__forked(b->l))
    return DL_EFORKED;
  return b->is_device ? dl__cuda_wait(b, stream) : 0;
}


void dl_close(dl_loader *l) {
  /* In a child of fork() the loader's memory is a copy that goes with the process; its pinned and
   * device memory and its threads are the parent's. */
  if (!l || getpid() != l->pid)
    return;
  /* Consumers waiting on other threads leave first, with DL_ECLOSED. */
  pthread_mutex_lock(&l->mu);
  l->closing = 1;
  pthread_cond_broadcast(&l->ready_cv);
  while (l->consumers > 0)
    pthread_cond_wait(&l->ready_cv, &l->mu);
  pthread_mutex_unlock(&l->mu);
  dl__workers_stop(l);
  if (l->cuda)
    dl__cuda_stop(l);
  dl__check_verdicts_save(l);
  pthread_mutex_lock(&l->mu);
  l->closed = 1;
  any_slot(l, drop_hold);
  bool held = any_slot(l, has_refs);
  pthread_mutex_unlock(&l->mu);
  if (!held)
    dl__loader_free(l);
}

