/*
 * A worker: its own I/O ring, decoder contexts and scratch buffers, all living as long as the
 * loader, so the steady state allocates nothing. It keeps up to io_depth reads in flight and
 * decodes each sample as its read completes, straight into the sample's place in the batch slot.
 *
 * Lock order: l->mu only, briefly (the ring's claims and completions take it in ring.c).
 */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <zstd.h>

/* Hybrid decoding holds the workers at least this far below the process (see run()). */
#define HYBRID_NICE 4

typedef struct inflight {
  dl__claim c;
  const dl__sample *s;
  dl__buf buf;
  size_t skip;  /* bytes before the sample's own in BUF (O_DIRECT reads start aligned) */
  const uint8_t *data; /* the sample's bytes: in BUF after the read, or in the file's mapping */
  int own_fd; /* opened for this read (ImageFolder), else -1 */
  bool busy;
  /* Tensor payloads read straight into the slot (dl__fields_direct): which refs, and the pieces
   * of the read in record order, for the checksum. */
  uint32_t in_place;
  int niov;
  struct iovec iov[DL__MAX_IOV];
} inflight;

struct dl__worker {
  dl_loader *l;
  pthread_t thread;
  int id;
  dl__io io;
  dl__image_decoder img;
  inflight *slots;
  int depth;
  void *zctx; /* zstd decompression of tensor fields and compressed images */
  dl__hasher *hasher;
  dl__buf zbuf, zimage;
  dl__buf pixels; /* an image's uint8 values before they are normalised into a float host slot */
};

static int64_t ns_since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (int64_t)(t1.tv_sec - t0->tv_sec) * 1000000000 + (t1.tv_nsec - t0->tv_nsec);
}

/* The shared end of every sample: label, key, error report, and the ring's count. */
static void complete(struct dl__worker *w, inflight *f, dl__err *e) {
  dl_loader *l = w->l;
  const dl__sample *s = f->s;
  dl__claim *c = &f->c;
  dl_batch *b = c->slot;
  b->label[c->i] = s->label;
  b->key[c->i] = l->ds.pool + s->key;
  b->sample_err[c->i] = e->code;
  atomic_fetch_add_explicit(&l->st.samples, 1, memory_order_relaxed);
  if (e->code == DL_ECLOSED) {
    e->code = 0; /* cut short by dl_close: nobody will see the batch */
  } else if (e->code) {
    dl__sample_zero(l, b, c->i);
    dl__sample_failed(l, s, e);
  }
  if (f->own_fd >= 0)
    close(f->own_fd);
  f->own_fd = -1;
  f->busy = false;
  dl__ring_done(l, c, e);
}

void dl__sample_zero(const dl_loader *l, dl_batch *b, int i) {
  if (l->host_float) /* zeros as the GPU's conversion would make them */
    dl__normalize_zeros(l->o.height, l->o.width, l->o.channels, l->o.layout == DL__LAYOUT_NCHW, l->o.dtype, &l->affine,
                        b->image + (size_t)i * l->sample_bytes);
  else
    memset(b->image + (size_t)i * l->sample_bytes, 0, l->sample_bytes);
  for (int f = 0; f < l->nfields; f++) {
    const dl__field *fd = &l->fields[f];
    memset(b->fields + fd->at + (size_t)i * fd->sample_bytes, 0, fd->sample_bytes);
    if (l->o.pad)
      ((int64_t *)(b->fields + fd->len_at))[i] = 0;
  }
  for (int k = 0; k < l->nbfields; k++)
    b->brefs[(size_t)i * l->nbfields + k] = (dl__bytes_ref){0};
}

void dl__sample_failed(dl_loader *l, const dl__sample *s, dl__err *e) {
  atomic_fetch_add_explicit(&l->st.errors, 1, memory_order_relaxed);
  char msg[DL__MSG_MAX];
  snprintf(msg, sizeof msg, "shard %s member %s offset %llu: %s", l->ds.files[s->file], dl__sample_name(&l->ds, s),
           (unsigned long long)s->offset, e->msg);
  memcpy(e->msg, msg, sizeof e->msg);
  if (l->o.on_error == DL__ON_ERROR_SKIP)
    dl__log(DL__LOG_WARN, "%s (sample replaced by zeros)", e->msg);
  else
    dl__log(DL__LOG_ERROR, "%s", e->msg);
}

static void decode(struct dl__worker *w, inflight *f, bool verify, dl__err *e) {
  dl_loader *l = w->l;
  const dl__claim *c = &f->c;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if ((l->nfields || l->nbfields) &&
      dl__fields_fill(l, f->s, f->data, c->slot, c->i, &w->zctx, &w->zbuf, verify ? w->hasher : NULL, f->in_place,
                      e))
    return;
  if (!l->has_image) {
    atomic_fetch_add_explicit(&l->st.decode_ns, ns_since(&t0), memory_order_relaxed);
    return;
  }
  uint64_t key = dl__sample_key(l, c->epoch, c->draw);
  const uint8_t *image = f->data + f->s->image_at;
  size_t image_len = f->s->image_len;
  if (f->s->flags & DL__SAMPLE_IMAGE_ZST) {
    if (dl__zstd_inflate(&w->zctx, image, image_len, (size_t)l->o.max_member_bytes, &w->zimage, &image_len, e))
      return;
    image = w->zimage.p;
  }
  struct timespec tp = {0};
  if (c->arena) /* the workers' time on the GPU's samples, which hybrid's split counts as theirs */
    clock_gettime(CLOCK_MONOTONIC, &tp);
  if (c->arena && dl__gpu_plan(l, c->slot, c->i, c->index, c->arena, image, image_len, key)) {
    atomic_fetch_add_explicit(&l->st.gpu_planned, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->st.gpu_plan_ns, ns_since(&tp), memory_order_relaxed);
  } else {
    uint8_t *dst = c->slot->image + (size_t)c->i * l->sample_bytes;
    const dl__image_spec *sp = &l->image_spec;
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint8_t *to = dst;
    if (l->host_float && dl__buf_reserve(&w->pixels, (size_t)sp->width * (size_t)sp->height * (size_t)sp->channels))
      dl__err_set(e, -ENOMEM, "out of memory for an image's pixels");
    else if (l->host_float)
      to = w->pixels.p;
    if (!e->code && !dl__image_decode(&w->img, sp, image, image_len, f->s->codec, key, dl__sample_flip(l, key),
                                      (uint32_t)c->index, to, e) && l->host_float)
      dl__normalize(to, sp->height, sp->width, sp->channels, l->o.layout == DL__LAYOUT_NCHW, l->o.dtype, &l->affine,
                    dst);
    atomic_fetch_add_explicit(&l->st.cpu_decoded, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->st.cpu_decode_ns, ns_since(&t1), memory_order_relaxed);
  }
  atomic_fetch_add_explicit(&l->st.decode_ns, ns_since(&t0), memory_order_relaxed);
}

static bool l_has_image(const struct dl__worker *w) { return w->l->has_image; }

/* A read that completes while the loader closes: its batch is never delivered, so it is not
 * decoded (a 12-megapixel image takes a tenth of a second) nor reported. */
static bool abandon(struct dl__worker *w, inflight *f) {
  if (!atomic_load_explicit(&w->l->cancel, memory_order_relaxed))
    return false;
  if (f->own_fd >= 0)
    close(f->own_fd);
  f->own_fd = -1;
  f->busy = false;
  dl__ring_done(w->l, &f->c, NULL);
  return true;
}

/* The checksum of a record read in pieces, over the pieces in order. */
static bool pieces_match(struct dl__worker *w, const inflight *f, uint64_t checksum) {
  dl__hasher_reset(w->hasher);
  for (int k = 0; k < f->niov; k++)
    dl__hasher_update(w->hasher, f->iov[k].iov_base, f->iov[k].iov_len);
  return dl__hasher_digest(w->hasher) == checksum;
}

/* A record read in pieces whose .npy headers were not the length assumed (data after the array,
 * say): read again whole into the buffer, from which it is then copied. */
static int64_t read_whole(struct dl__worker *w, inflight *f) {
  const dl__sample *s = f->s;
  int fd = f->own_fd >= 0 ? f->own_fd : w->l->ds.fds[s->file];
  f->in_place = 0;
  f->niov = 0;
  f->data = f->buf.p;
  return dl__pread_full(fd, f->buf.p, (size_t)s->size, s->offset);
}

/* Checks and decodes a read of RES bytes (or -errno) of F's sample; E gets what went wrong. */
static void process(struct dl__worker *w, inflight *f, int64_t res, dl__err *err) {
  dl__err e = {0};
  const dl__sample *s = f->s;
  if (f->in_place && res >= (int64_t)s->size) {
    bool as_assumed = dl__fields_in_place_ok(w->l, s, f->data, f->in_place);
    if (!as_assumed)
      res = read_whole(w, f);
    atomic_fetch_add_explicit(as_assumed ? &w->l->st.placed : &w->l->st.placed_again, 1, memory_order_relaxed);
  }
  /* Local reads in a row with an I/O error: the storage is down (ring.c; remote reads are counted
   * where they are retried, io/http.c). */
  if (!w->l->remote && res < 0)
    atomic_fetch_add_explicit(&w->l->read_failures, 1, memory_order_relaxed);
  else if (!w->l->remote && atomic_load_explicit(&w->l->read_failures, memory_order_relaxed))
    atomic_store_explicit(&w->l->read_failures, 0, memory_order_relaxed);
  if (res >= 0)
    res = res > (int64_t)f->skip ? res - (int64_t)f->skip : 0;
  if (res < 0 && w->io.why[0]) /* the backend's own account (a URL and an HTTP status) */
    dl__err_set(&e, (int)res, "%s", w->io.why);
  else if (res < 0)
    dl__err_set(&e, (int)res, "read failed: %s", strerror((int)-res));
  else if ((uint64_t)res < s->size)
    dl__err_set(&e, DL_ECORRUPT, "file ends after %lld of the member's %llu bytes (truncated)",
                (long long)res, (unsigned long long)s->size);
  w->io.why[0] = 0;
  /* Tensor-only records are checked while their data is copied (read once); others first. */
  bool fused = (s->flags & DL__SAMPLE_CHECKSUM) && !l_has_image(w) && s->nrefs && w->hasher && !f->in_place;
  if (!e.code) {
    if ((s->flags & DL__SAMPLE_CHECKSUM) && !fused &&
        (f->in_place ? !pieces_match(w, f, s->checksum) : dl__rfs_checksum(f->data, s->size) != s->checksum))
      dl__err_set(&e, DL_ECORRUPT, "record checksum mismatch (damaged record)");
    else if (l_has_image(w) && (uint64_t)s->image_at + s->image_len > s->size)
      dl__err_set(&e, DL_ECORRUPT, "image field lies outside its record");
    else
      decode(w, f, fused, &e);
  }
  if (res > 0)
    atomic_fetch_add_explicit(&w->l->st.bytes_read, res, memory_order_relaxed);
  *err = e;
}

static void finish(struct dl__worker *w, inflight *f, int64_t res) {
  if (abandon(w, f))
    return;
  dl__err e;
  process(w, f, res, &e);
  complete(w, f, &e);
}

/* Decodes F's sample in place from its file's mapping; false when the file shrank meanwhile and
 * the sample must be read (its bytes may have been zeros where pages were cut off). */
static bool finish_mapped(struct dl__worker *w, inflight *f) {
  dl__dataset *ds = &w->l->ds;
  const dl__sample *s = f->s;
  uint64_t len = ds->map_len[s->file];
  f->data = ds->maps[s->file] + (s->offset < len ? s->offset : len);
  f->skip = 0;
  if (abandon(w, f))
    return true;
  dl__err e;
  dl__map_guard_enter(ds, s->file);
  process(w, f, s->offset >= len ? 0 : (int64_t)(len - s->offset < s->size ? len - s->offset : s->size), &e);
  if (dl__map_guard_leave(ds, s->file)) {
    if (f->c.slot->jobs)
      f->c.slot->jobs[f->c.i].len = 0;
    return false;
  }
  complete(w, f, &e);
  return true;
}

/* Starts the read for claim C; returns false when the sample was finished at once (an error). */
static bool start(struct dl__worker *w, const dl__claim *c) {
  dl_loader *l = w->l;
  int tag = 0;
  while (w->slots[tag].busy)
    tag++; /* the caller keeps fewer than depth reads in flight */
  inflight *f = &w->slots[tag];
  f->busy = true;
  f->c = *c;
  f->s = &l->ds.samples[c->index];
  f->own_fd = -1;
  f->in_place = 0;
  f->niov = 0;
  const dl__sample *s = f->s;
  dl__err e = {0};
  if (c->slot->jobs)
    c->slot->jobs[c->i].len = 0; /* on the CPU unless the GPU takes it once read */
  char exts[96];
  if (s->codec == DL__CODEC_NONE && l->has_image) {
    dl__err_set(&e, DL_ENOFIELD, "sample has no image member (%s)", dl__codec_exts(exts, sizeof exts, NULL));
  } else if ((int64_t)s->size > l->o.max_member_bytes) {
    dl__err_set(&e, DL_ELIMIT, "member is %llu bytes, above max_member_bytes=%lld",
                (unsigned long long)s->size, (long long)l->o.max_member_bytes);
  } else if (dl__map_usable(&l->ds, s->file) && finish_mapped(w, f)) {
    /* Mapped: the bytes were read in place, and a file shorter than its index was a short read. */
    return false;
  } else {
    /* O_DIRECT reads start and end on the alignment; the sample's bytes sit F->skip in. */
    uint32_t align = l->ds.direct[s->file];
    uint64_t off = align ? s->offset / align * align : s->offset;
    f->skip = (size_t)(s->offset - off);
    size_t len = (size_t)s->size + f->skip;
    if (align)
      len = (len + align - 1) / align * align;
    /* A JPEG the GPU may decode is read straight into the slot's pinned arena. */
    int r = c->arena ? 0
            : align  ? dl__buf_reserve_aligned(&f->buf, len, align)
                     : dl__buf_reserve(&f->buf, len ? len : 1);
    uint8_t *into = c->arena ? c->arena : f->buf.p;
    int fd = l->remote ? (int)s->file : l->ds.fds[s->file];
    if (!r && fd < 0 && (fd = f->own_fd = dl__open_regular(l->ds.files[s->file], "file", NULL)) < 0) {
      f->own_fd = -1;
      dl__err_set(&e, fd, "%s", dl_last_error());
      complete(w, f, &e);
      return false;
    }
    f->data = into + f->skip;
    /* Tensor payloads go straight to their place in the slot: the kernel's copy is the only one
     * (a worker's copy from its buffer halved what io_uring delivered, against a mapping's one). */
    if (!r && !c->arena && !align && w->io.ops->submitv)
      f->niov = dl__fields_direct(l, s, c->slot, c->i, into, f->iov, &f->in_place);
    if (!r)
      r = f->niov ? w->io.ops->submitv(&w->io, fd, f->iov, f->niov, off, (uint64_t)tag)
                  : w->io.ops->submit(&w->io, fd, into, len, off, (uint64_t)tag);
    if (r == 0)
      return true;
    dl__err_set(&e, r, "read failed: %s", strerror(-r));
  }
  complete(w, f, &e);
  return false;
}

/* Raises this thread's nice by BY (an unprivileged thread cannot lower it back). */
static void lower_priority(int by) {
  errno = 0;
  int nice = getpriority(PRIO_PROCESS, (id_t)gettid());
  if (errno == 0 && by > 0)
    setpriority(PRIO_PROCESS, (id_t)gettid(), nice + by > 19 ? 19 : nice + by);
}

static void *run(void *arg) {
  struct dl__worker *w = arg;
  dl_loader *l = w->l;
  char name[16]; /* what top -H, gdb and /proc show for the thread */
  snprintf(name, sizeof name, "rf-worker-%d", w->id);
  pthread_setname_np(pthread_self(), name);
  /* worker_nice: for a training loop whose host thread shares the cores with the workers. (On an
   * H200 host it changed nothing measurable for ResNet-50: fed / held 0.9845 at 10, 0.9835 at 0.) */
  lower_priority(l->o.worker_nice);
  bool yielded = l->o.worker_nice >= HYBRID_NICE;
  int inflight_n = 0;
  bool draining = false;
  /* Remote reads are topped up in runs of a quarter of the depth: reads submitted together can
   * share a request when their samples are neighbours (shuffle=0, evaluation). */
  int refill_below = l->remote && w->depth > 3 ? w->depth - w->depth / 4 + 1 : w->depth;
  for (;;) {
    bool refill = inflight_n < refill_below;
    while (refill && !draining && inflight_n < w->depth) {
      dl__claim c;
      int r = dl__ring_claim(l, &c, inflight_n == 0, w->id);
      if (r < 0)
        draining = true;
      if (r <= 0)
        break;
      /* Hybrid (from its first batch: decode=auto starts nvJPEG later): the workers yield to the
       * copy thread and nvJPEG's host work, which keep the JPEG engines busy; an engine left
       * waiting costs more than a core does (on an H200 the engines' time per image was a third
       * longer in hybrid runs, every core decoding, than with the workers idle). Nice 10 did no
       * better on an H100 host: the same median rate and two slow runs in twelve either way. */
      if (c.hybrid && !yielded) {
        lower_priority(HYBRID_NICE - l->o.worker_nice);
        yielded = true;
      }
      if (!start(w, &c))
        continue;
      inflight_n++;
      /* A read the page cache served may be complete already: its sample is processed now, while
       * its bytes are still in this core's cache, not after reads queued behind it evicted them
       * (1 MiB records straight into the slot: 7.5 instead of 5.8 GB/s on 2 cores). */
      uint64_t tag;
      int64_t res;
      while (w->io.ops->peek && inflight_n && w->io.ops->peek(&w->io, &tag, &res) == 0 && tag < (uint64_t)w->depth) {
        inflight_n--;
        finish(w, &w->slots[tag], res);
      }
    }
    if (inflight_n == 0) {
      if (draining)
        break;
      continue;
    }
    uint64_t tag;
    int64_t res;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int r = w->io.ops->wait(&w->io, &tag, &res);
    atomic_fetch_add_explicit(&l->st.read_wait_ns, ns_since(&t0), memory_order_relaxed);
    if (r < 0 || tag >= (uint64_t)w->depth) {
      dl__log(DL__LOG_ERROR, "worker %d: I/O wait failed: %s", w->id, strerror(-r));
      break;
    }
    inflight_n--;
    finish(w, &w->slots[tag], res);
  }
  return NULL;
}

static void worker_free(struct dl__worker *w) {
  if (w->io.ops)
    w->io.ops->fini(&w->io);
  dl__image_decoder_free(&w->img);
  for (int i = 0; w->slots && i < w->depth; i++)
    dl__buf_free(&w->slots[i].buf);
  free(w->slots);
  dl__buf_free(&w->zbuf);
  dl__hasher_free(w->hasher);
  dl__buf_free(&w->zimage);
  dl__buf_free(&w->pixels);
  ZSTD_freeDCtx(w->zctx);
}

int dl__workers_start(dl_loader *l) {
  l->workers = calloc((size_t)l->o.workers, sizeof *l->workers);
  if (!l->workers)
    return dl__fail(-ENOMEM, "out of memory starting workers");
  /* Where a worker's start goes: 8-27 ms for 16 on an H200 host, 7-13 of it their io_uring rings.
   * Rings set up by the workers themselves, all at once, took as long (the slowest 5-15 ms): the
   * kernel sets them up one at a time either way. */
  double t0 = dl__now(), rings = 0;
  for (int i = 0; i < l->o.workers; i++) {
    struct dl__worker *w = &l->workers[i];
    w->l = l;
    w->id = i;
    w->depth = l->o.io_depth;
    w->slots = calloc((size_t)w->depth, sizeof *w->slots);
    if (!w->slots || !(w->hasher = dl__hasher_new()) || dl__image_decoder_init(&w->img))
      return dl__fail(-ENOMEM, "out of memory starting worker %d", i);
    w->img.rows = l->jpeg_rows;
    w->io.ops = l->io_ops;
    w->io.env = &l->io_env;
    double t = dl__now();
    int r = l->io_ops->init(&w->io, (unsigned)w->depth);
    rings += dl__now() - t;
    if (r) {
      w->io.ops = NULL;
      return dl__fail(r, "worker %d: %s setup failed: %s", i, l->io_ops->name, strerror(-r));
    }
  }
  double t_threads = dl__now();
  for (int i = 0; i < l->o.workers; i++) {
    int r = pthread_create(&l->workers[i].thread, NULL, run, &l->workers[i]);
    if (r) {
      pthread_mutex_lock(&l->mu);
      l->stop = 1;
      pthread_cond_broadcast(&l->work_cv);
      pthread_mutex_unlock(&l->mu);
      for (int j = 0; j < i; j++)
        pthread_join(l->workers[j].thread, NULL);
      l->nworkers = 0;
      return dl__fail(-r, "could not start worker %d: %s", i, strerror(r));
    }
    l->nworkers = i + 1;
  }
  double t1 = dl__now();
  dl__log(DL__LOG_DEBUG, "%d workers started in %.1f ms: %s set up in %.1f, buffers and decoders %.1f, threads %.1f",
          l->o.workers, (t1 - t0) * 1e3, l->io_ops->name, rings * 1e3, (t_threads - t0 - rings) * 1e3,
          (t1 - t_threads) * 1e3);
  return 0;
}

void dl__workers_stop(dl_loader *l) {
  atomic_store_explicit(&l->cancel, 1, memory_order_relaxed); /* decodes in progress give up */
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_broadcast(&l->work_cv);
  pthread_mutex_unlock(&l->mu);
  for (int i = 0; i < l->nworkers; i++)
    pthread_join(l->workers[i].thread, NULL);
  l->nworkers = 0;
  for (int i = 0; l->workers && i < l->o.workers; i++)
    worker_free(&l->workers[i]);
  free(l->workers);
  l->workers = NULL;
}
