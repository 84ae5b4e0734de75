/* The blocking fallback: each submitted read runs at once; completions come back in order. */
#include "io/io.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct done {
  uint64_t tag;
  int64_t res;
} done;

typedef struct pread_state {
  done *q;
  unsigned cap, head, count;
} pread_state;

static int pr_init(dl__io *io, unsigned depth) {
  pread_state *s = calloc(1, sizeof *s);
  if (!s || !(s->q = calloc(depth, sizeof *s->q))) {
    free(s);
    return -ENOMEM;
  }
  s->cap = depth;
  io->state = s;
  return 0;
}

static void pr_fini(dl__io *io) {
  pread_state *s = io->state;
  if (s)
    free(s->q);
  free(s);
  io->state = NULL;
}

static int pr_submitv(dl__io *io, int fd, const struct iovec *iov, int n, uint64_t off, uint64_t tag) {
  pread_state *s = io->state;
  if (s->count == s->cap)
    return -EBUSY;
  if (n < 1 || n > DL__MAX_IOV)
    return -EINVAL;
  s->q[(s->head + s->count) % s->cap] = (done){tag, dl__preadv_full(fd, iov, n, off)};
  s->count++;
  return 0;
}

static int pr_submit(dl__io *io, int fd, void *buf, size_t len, uint64_t off, uint64_t tag) {
  pread_state *s = io->state;
  if (s->count == s->cap)
    return -EBUSY;
  s->q[(s->head + s->count) % s->cap] = (done){tag, dl__pread_full(fd, buf, len, off)};
  s->count++;
  return 0;
}

static int pr_wait(dl__io *io, uint64_t *tag, int64_t *res) {
  pread_state *s = io->state;
  if (!s->count)
    return -EAGAIN;
  *tag = s->q[s->head].tag;
  *res = s->q[s->head].res;
  s->head = (s->head + 1) % s->cap;
  s->count--;
  return 0;
}

/* Reads finish at submission, so waiting never blocks: peek is wait, and there is nothing to poll. */
const dl__io_ops dl__io_pread_ops = {"pread", pr_init, pr_fini, pr_submit, pr_wait, pr_wait, NULL, pr_submitv};
