/*
 * io_uring reads: each worker owns a ring (no shared state, no locks on the I/O path) and keeps
 * up to its depth of reads in flight. Short reads (a file shorter than its index says) are
 * continued until the file ends, then reported as the bytes read.
 */
#include "io/io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DL_WITH_IO_URING
#include <liburing.h>

typedef struct op {
  int fd;
  char *buf;
  size_t len, got;
  uint64_t off, tag;
  bool busy;
  int nv;                          /* a scattered read: its pieces (0: one, BUF) */
  struct iovec v[DL__MAX_IOV];
  struct iovec rest[DL__MAX_IOV];  /* what a short read left, handed to the kernel */
} op;

typedef struct uring_state {
  struct io_uring ring;
  op *ops;
  unsigned depth, pending;
} uring_state;

static int ur_init(dl__io *io, unsigned depth) {
  uring_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->ops = calloc(depth, sizeof *s->ops);
  if (!s->ops) {
    free(s);
    return -ENOMEM;
  }
  int r = io_uring_queue_init(depth, &s->ring, 0);
  if (r < 0) {
    free(s->ops);
    free(s);
    return r;
  }
  s->depth = depth;
  io->state = s;
  return 0;
}

static void ur_fini(dl__io *io) {
  uring_state *s = io->state;
  if (!s)
    return;
  io_uring_queue_exit(&s->ring);
  free(s->ops);
  free(s);
  io->state = NULL;
}

static int queue(uring_state *s, op *o) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
  if (!sqe)
    return -EBUSY;
  if (o->nv) { /* the pieces past the bytes already read: a short read resumes where it stopped */
    int n = dl__iov_after(o->v, o->nv, o->got, o->rest);
    io_uring_prep_readv(sqe, o->fd, o->rest, (unsigned)n, o->off + o->got);
  } else {
    io_uring_prep_read(sqe, o->fd, o->buf + o->got, (unsigned)(o->len - o->got), o->off + o->got);
  }
  io_uring_sqe_set_data(sqe, o);
  s->pending++;
  return 0;
}

static op *free_op(uring_state *s) {
  for (unsigned i = 0; i < s->depth; i++)
    if (!s->ops[i].busy)
      return &s->ops[i];
  return NULL;
}

static int ur_submit(dl__io *io, int fd, void *buf, size_t len, uint64_t off, uint64_t tag) {
  uring_state *s = io->state;
  op *o = free_op(s);
  if (!o || len > UINT32_MAX)
    return o ? -EINVAL : -EBUSY;
  o->fd = fd, o->buf = buf, o->len = len, o->got = 0, o->off = off, o->tag = tag, o->busy = true, o->nv = 0;
  int r = queue(s, o);
  if (r)
    o->busy = false;
  return r;
}

static int ur_submitv(dl__io *io, int fd, const struct iovec *iov, int n, uint64_t off, uint64_t tag) {
  uring_state *s = io->state;
  op *o = free_op(s);
  if (!o || n < 1 || n > DL__MAX_IOV)
    return o ? -EINVAL : -EBUSY;
  size_t len = 0;
  for (int k = 0; k < n; k++)
    len += iov[k].iov_len;
  o->fd = fd, o->buf = NULL, o->len = len, o->got = 0, o->off = off, o->tag = tag, o->busy = true, o->nv = n;
  memcpy(o->v, iov, sizeof *iov * (size_t)n);
  int r = queue(s, o);
  if (r)
    o->busy = false;
  return r;
}

/* The next completion; without BLOCK, -EAGAIN when none is there yet. */
static int reap(dl__io *io, uint64_t *tag, int64_t *res, bool block) {
  uring_state *s = io->state;
  for (;;) {
    if (s->pending) {
      int r = io_uring_submit(&s->ring);
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY)
        return r;
      if (r > 0)
        s->pending -= (unsigned)r < s->pending ? (unsigned)r : s->pending;
    }
    struct io_uring_cqe *cqe;
    int r = block ? io_uring_wait_cqe(&s->ring, &cqe) : io_uring_peek_cqe(&s->ring, &cqe);
    if (r == -EINTR)
      continue;
    if (r < 0)
      return r;
    op *o = io_uring_cqe_get_data(cqe);
    int cres = (int)dl__io_fault(cqe->res);
    io_uring_cqe_seen(&s->ring, cqe);
    if (cres == -EAGAIN || cres == -EINTR) {
      if (queue(s, o) == 0)
        continue;
    } else if (cres > 0 && o->got + (size_t)cres < o->len) {
      o->got += (size_t)cres;
      if (queue(s, o) == 0)
        continue;
    } else if (cres > 0) {
      o->got += (size_t)cres;
    }
    *tag = o->tag;
    *res = cres < 0 ? cres : (int64_t)o->got;
    o->busy = false;
    return 0;
  }
}

static int ur_wait(dl__io *io, uint64_t *tag, int64_t *res) { return reap(io, tag, res, true); }
static int ur_peek(dl__io *io, uint64_t *tag, int64_t *res) { return reap(io, tag, res, false); }
/* The ring's descriptor polls readable while completions wait in it (once reads are submitted). */
static int ur_poll_fd(dl__io *io) {
  uring_state *s = io->state;
  if (s->pending) {
    int r = io_uring_submit(&s->ring);
    if (r > 0)
      s->pending -= (unsigned)r < s->pending ? (unsigned)r : s->pending;
  }
  return s->ring.ring_fd;
}

const dl__io_ops dl__io_uring_ops = {"io_uring", ur_init, ur_fini, ur_submit, ur_wait, ur_peek, ur_poll_fd, ur_submitv};

#else

static int ur_init(dl__io *io, unsigned depth) {
  (void)io;
  (void)depth;
  return -ENOSYS;
}
static void ur_fini(dl__io *io) { (void)io; }
static int ur_submit(dl__io *io, int fd, void *buf, size_t len, uint64_t off, uint64_t tag) {
  (void)io, (void)fd, (void)buf, (void)len, (void)off, (void)tag;
  return -ENOSYS;
}
static int ur_wait(dl__io *io, uint64_t *tag, int64_t *res) {
  (void)io, (void)tag, (void)res;
  return -ENOSYS;
}
const dl__io_ops dl__io_uring_ops = {"io_uring", ur_init, ur_fini, ur_submit, ur_wait, ur_wait, NULL, NULL};

#endif
