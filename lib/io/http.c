/*
 * The workers' reads of remote shards: each worker keeps up to io_depth ranged GETs in flight on
 * one curl multi handle (its connections reused, HTTP/2 streams multiplexed where the server
 * offers them). Reads a worker submits together that lie close in one shard (samples of a batch
 * in shard order, with the tar headers between them) go out as one request whose body is spread
 * over their buffers. A request that fails in a way worth retrying goes back in after a backoff
 * with jitter; one that still fails completes each of its reads with an error the worker reports
 * for its sample, with the message in io->why. A closing loader cancels what is in flight at once.
 * With a shard cache, a read of a shard whose copy is on local disk goes to the local backend
 * (io_uring) instead; the worker waits on both at once (the ring's descriptor polled with curl's).
 */
#include "io/io.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define MAX_GAP (64u << 10)     /* bytes between two reads that one request still spans */
#define MAX_SPAN (32ull << 20)  /* bytes one request spans at most */

enum { IDLE, PENDING, SENT, LOCAL, DONE }; /* a read's state */

typedef struct http_state http_state;

typedef struct op {
  uint8_t state;
  uint32_t file;
  uint64_t tag;
  uint8_t *buf;
  size_t len;
  uint64_t off;
  unsigned next;  /* the next read of its request, or of the done list (depth: none) */
  int64_t result; /* once DONE: bytes, or an error code with its message in why */
  char why[DL__MSG_MAX];
} op;

/* One HTTP request for reads FIRST, FIRST->next, ... of one shard, in offset order. */
typedef struct req {
  http_state *s;
  CURL *h;
  bool busy, queued; /* in use; in the multi handle (else waiting for its retry) */
  dl__target t;
  unsigned first;
  uint64_t off, end; /* the byte range asked for */
  uint64_t got;      /* bytes of the body so far */
  int64_t range_from; /* where the answer's Content-Range starts, or -1 */
  int attempt;
  int64_t retry_at_ms;
  uint8_t err[512];  /* the start of an error answer (S3 says why in it) */
  char msg[DL__MSG_MAX];
} req;

struct http_state {
  CURLM *m;
  op *ops;
  req *reqs;
  unsigned depth;
  unsigned done_head, done_tail; /* completed reads not handed back yet, through next */
  unsigned *order;               /* pending reads, sorted by shard and offset */
  uint64_t rng;
  dl__io local; /* reads of cached copies, tagged with their op's index */
};

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void http_fini(dl__io *io) {
  http_state *s = io->state;
  if (!s)
    return;
  if (s->local.ops)
    s->local.ops->fini(&s->local);
  for (unsigned i = 0; s->reqs && i < s->depth; i++)
    if (s->reqs[i].h) {
      if (s->reqs[i].queued)
        curl_multi_remove_handle(s->m, s->reqs[i].h);
      curl_easy_cleanup(s->reqs[i].h);
    }
  if (s->m)
    curl_multi_cleanup(s->m);
  free(s->ops);
  free(s->reqs);
  free(s->order);
  free(s);
  io->state = NULL;
}

static int http_init(dl__io *io, unsigned depth) {
  int r = dl__http_global_init();
  if (r)
    return r;
  http_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  io->state = s;
  s->depth = depth;
  s->done_head = s->done_tail = depth;
  s->rng = (uint64_t)(uintptr_t)s;
  s->ops = calloc(depth, sizeof *s->ops);
  s->reqs = calloc(depth, sizeof *s->reqs);
  s->order = calloc(depth, sizeof *s->order);
  s->m = curl_multi_init();
  if (!s->ops || !s->reqs || !s->order || !s->m) {
    http_fini(io);
    return -ENOMEM;
  }
  curl_multi_setopt(s->m, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
  for (unsigned i = 0; i < depth; i++) {
    s->reqs[i].s = s;
    if (!(s->reqs[i].h = curl_easy_init())) {
      http_fini(io);
      return -ENOMEM;
    }
  }
  if (io->env->cache) {
    s->local.env = io->env;
    r = dl__shard_cache_io(io->env->cache)->init(&s->local, depth);
    if (r) {
      http_fini(io);
      return r;
    }
    s->local.ops = dl__shard_cache_io(io->env->cache);
  }
  return 0;
}

/* The body, spread over the request's reads (bytes between them dropped). */
static size_t on_body(char *p, size_t size, size_t n, void *arg) {
  req *r = arg;
  size_t len = size * n, take = len;
  bool more = r->got + len > r->end - r->off; /* a 200 with the whole object: what was asked, then stop */
  if (more)
    take = (size_t)(r->end - r->off - r->got);
  long status = 0;
  curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200 && status != 206) { /* an error answer: kept for its reason */
    size_t keep = r->got < sizeof r->err ? sizeof r->err - (size_t)r->got : 0;
    memcpy(r->err + r->got, p, take < keep ? take : keep);
    r->got += take;
    return more ? 0 : len;
  }
  uint64_t from = r->off + r->got, to = from + take;
  for (unsigned i = r->first; i < r->s->depth; i = r->s->ops[i].next) {
    op *o = &r->s->ops[i];
    uint64_t a = o->off > from ? o->off : from, b = o->off + o->len < to ? o->off + o->len : to;
    if (a < b)
      memcpy(o->buf + (a - o->off), p + (a - from), (size_t)(b - a));
  }
  r->got += take;
  return more ? 0 : len;
}

static size_t on_header(char *p, size_t size, size_t n, void *arg) {
  req *r = arg;
  size_t len = size * n;
  if (len >= 5 && !strncasecmp(p, "HTTP/", 5)) /* a new response (after a redirect) */
    r->range_from = -1;
  else if (len >= 14 && !strncasecmp(p, "Content-Range:", 14))
    r->range_from = dl__http_range_from(p, len);
  return len;
}

static int queue(dl__io *io, req *r) {
  http_state *s = io->state;
  char range[64];
  snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)r->off, (unsigned long long)(r->end - 1));
  dl__http_configure(r->h, io->env->o, &r->t);
  curl_easy_setopt(r->h, CURLOPT_RANGE, range); /* copied */
  curl_easy_setopt(r->h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(r->h, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(r->h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(r->h, CURLOPT_HEADERDATA, r);
  curl_easy_setopt(r->h, CURLOPT_PRIVATE, r);
  r->got = 0;
  r->range_from = -1;
  if (curl_multi_add_handle(s->m, r->h) != CURLM_OK)
    return -ENOMEM;
  r->queued = true;
  atomic_fetch_add_explicit(&io->env->counts->requests, 1, memory_order_relaxed);
  return 0;
}

/* Read I is complete with RESULT (and WHY, when it is an error): into the done list. */
static void done(http_state *s, unsigned i, int64_t result, const char *why) {
  op *o = &s->ops[i];
  o->state = DONE;
  o->result = result;
  if (result < 0)
    snprintf(o->why, sizeof o->why, "%s", why);
  o->next = s->depth;
  if (s->done_head == s->depth)
    s->done_head = i;
  else
    s->ops[s->done_tail].next = i;
  s->done_tail = i;
}

/* Ends request R: each of its reads with RESULT (the bytes of each when 0), then R is free. */
static void finish(http_state *s, req *r, int64_t result) {
  if (r->queued)
    curl_multi_remove_handle(s->m, r->h);
  r->queued = false;
  r->busy = false;
  for (unsigned i = r->first, next; i < s->depth; i = next) {
    next = s->ops[i].next;
    done(s, i, result ? result : (int64_t)s->ops[i].len, r->msg);
  }
}

static int http_submit(dl__io *io, int fd, void *buf, size_t len, uint64_t off, uint64_t tag) {
  http_state *s = io->state;
  op *o = NULL;
  for (unsigned i = 0; i < s->depth && !o; i++)
    if (s->ops[i].state == IDLE)
      o = &s->ops[i];
  if (!o)
    return -EBUSY;
  *o = (op){.state = PENDING, .file = (uint32_t)fd, .tag = tag, .buf = buf, .len = len, .off = off,
            .next = s->depth};
  if (!len) {
    done(s, (unsigned)(o - s->ops), 0, NULL); /* nothing to ask the server */
    return 0;
  }
  int cached = io->env->cache ? dl__shard_cache_take(io->env->cache, (uint32_t)fd) : -1;
  if (cached >= 0) {
    o->state = LOCAL;
    int r = s->local.ops->submit(&s->local, cached, buf, len, off, (uint64_t)(o - s->ops));
    if (r) {
      dl__shard_cache_put(io->env->cache, o->file);
      o->state = IDLE;
    } else {
      atomic_fetch_add_explicit(&io->env->counts->cache_hits, 1, memory_order_relaxed);
    }
    return r;
  }
  return 0; /* sent by the next wait, with the reads next to it */
}

static int by_place(const void *a, const void *b, void *arg) {
  const op *ops = arg, *x = &ops[*(const unsigned *)a], *y = &ops[*(const unsigned *)b];
  if (x->file != y->file)
    return x->file < y->file ? -1 : 1;
  return (x->off > y->off) - (x->off < y->off);
}

/* Pending reads into requests: neighbours in one shard share one. */
static int send_pending(dl__io *io) {
  http_state *s = io->state;
  unsigned *order = s->order, n = 0;
  for (unsigned i = 0; i < s->depth; i++)
    if (s->ops[i].state == PENDING)
      order[n++] = i;
  if (!n)
    return 0;
  qsort_r(order, n, sizeof *order, by_place, s->ops);
  const dl__dataset *ds = io->env->ds;
  for (unsigned k = 0; k < n;) {
    req *r = NULL;
    for (unsigned i = 0; i < s->depth && !r; i++)
      if (!s->reqs[i].busy)
        r = &s->reqs[i];
    if (!r)
      return -EBUSY; /* cannot be: there are as many requests as reads */
    op *o = &s->ops[order[k]];
    const dl__remote_file *rf = &ds->remote[o->file];
    *r = (req){.s = s, .h = r->h, .busy = true, .t = {ds->files[o->file], rf->url, ds->s3, rf->headers},
               .first = order[k], .off = o->off, .end = o->off + o->len};
    op *last = o;
    o->state = SENT;
    for (k++; k < n; k++) {
      op *p = &s->ops[order[k]];
      uint64_t end = p->off + p->len > r->end ? p->off + p->len : r->end;
      if (p->file != o->file || p->off > r->end + MAX_GAP || end - r->off > MAX_SPAN)
        break;
      last->next = order[k];
      last = p;
      p->state = SENT;
      r->end = end;
    }
    last->next = s->depth;
    if (queue(io, r)) {
      snprintf(r->msg, sizeof r->msg, "%s: out of memory starting a request", r->t.name);
      finish(s, r, -ENOMEM);
    }
  }
  return 0;
}

/* Hands back the oldest completed read. */
static int pop_done(dl__io *io, uint64_t *tag, int64_t *res) {
  http_state *s = io->state;
  op *o = &s->ops[s->done_head];
  s->done_head = o->next;
  if (s->done_head == s->depth)
    s->done_tail = s->depth;
  *tag = o->tag;
  *res = o->result;
  if (o->result < 0)
    snprintf(io->why, sizeof io->why, "%s", o->why);
  o->state = IDLE;
  return 0;
}

/* A read of a cached copy that completed. */
static int local_done(dl__io *io, uint64_t index, int64_t got, uint64_t *tag, int64_t *res) {
  http_state *s = io->state;
  op *o = &s->ops[index];
  dl__shard_cache_put(io->env->cache, o->file);
  o->state = IDLE;
  *tag = o->tag;
  *res = got;
  if (got < 0)
    snprintf(io->why, sizeof io->why, "%s (cached copy): read failed: %s", io->env->ds->files[o->file],
             strerror((int)-got));
  return 0;
}

/* What came of request R, whose transfer ended with C. */
static void ended(dl__io *io, req *r, CURLcode c, int64_t *next_retry) {
  http_state *s = io->state;
  const dl__io_env *env = io->env;
  dl__http_outcome out;
  int64_t expect = (int64_t)(r->end - r->off);
  bool again = dl__http_outcome_of(r->h, c == CURLE_WRITE_ERROR ? CURLE_OK : c, &r->t, expect, (int64_t)r->got,
                                   r->err, (int64_t)r->off, r->range_from, &out);
  if (!out.code && out.status != 206 && !(out.status == 200 && r->off == 0)) {
    snprintf(r->msg, sizeof r->msg, "%s: %s (HTTP %ld)", r->t.name, DL__NO_RANGES, out.status);
    /* The server's way, not the sample's: it counts toward the run's stop, as a failed retry does. */
    atomic_fetch_add_explicit(env->read_failures, 1, memory_order_relaxed);
    finish(s, r, DL_EREMOTE);
    return;
  }
  if (!out.code) {
    atomic_store_explicit(env->read_failures, 0, memory_order_relaxed);
    finish(s, r, 0);
    return;
  }
  if (!again || r->attempt >= env->o->retries) {
    if (again) /* retried to the end: the server's failure, not the sample's */
      atomic_fetch_add_explicit(env->read_failures, 1, memory_order_relaxed);
    snprintf(r->msg, sizeof r->msg, "%s%s", out.msg, r->attempt ? " (after retries)" : "");
    finish(s, r, out.code);
    return;
  }
  curl_multi_remove_handle(s->m, r->h);
  r->queued = false;
  r->attempt++;
  curl_off_t after = 0;
  curl_easy_getinfo(r->h, CURLINFO_RETRY_AFTER, &after);
  long wait = after > 0 ? (long)(after < 30 ? after : 30) * 1000 : dl__http_backoff_ms(r->attempt, &s->rng);
  r->retry_at_ms = now_ms() + wait;
  atomic_fetch_add_explicit(&env->counts->retries, 1, memory_order_relaxed);
  dl__log(DL__LOG_INFO, "%s; retrying in %ld ms", out.msg, wait);
  if (r->retry_at_ms < *next_retry)
    *next_retry = r->retry_at_ms;
}

static int http_wait(dl__io *io, uint64_t *tag, int64_t *res) {
  http_state *s = io->state;
  send_pending(io);
  for (;;) {
    if (s->done_head != s->depth)
      return pop_done(io, tag, res);
    unsigned remote = 0, local = 0;
    for (unsigned i = 0; i < s->depth; i++) {
      remote += s->ops[i].state == SENT;
      local += s->ops[i].state == LOCAL;
    }
    if (!remote && !local)
      return -EAGAIN;
    if (local) {
      uint64_t index;
      int64_t got;
      int r = remote ? s->local.ops->peek(&s->local, &index, &got) : s->local.ops->wait(&s->local, &index, &got);
      if (r == 0)
        return local_done(io, index, got, tag, res);
      if (r != -EAGAIN)
        return r;
    }
    /* Closing: what is in flight is dropped. */
    if (atomic_load_explicit(io->env->cancel, memory_order_relaxed)) {
      for (unsigned i = 0; i < s->depth; i++)
        if (s->reqs[i].busy) {
          snprintf(s->reqs[i].msg, sizeof s->reqs[i].msg, "the loader was closed");
          finish(s, &s->reqs[i], DL_ECLOSED);
        }
      continue;
    }
    int64_t now = now_ms(), next_retry = INT64_MAX;
    for (unsigned i = 0; i < s->depth; i++) {
      req *r = &s->reqs[i];
      if (!r->busy || r->queued)
        continue;
      if (r->retry_at_ms <= now) {
        if (queue(io, r)) {
          snprintf(r->msg, sizeof r->msg, "%s: out of memory queueing a retry", r->t.name);
          finish(s, r, -ENOMEM);
        }
      } else if (r->retry_at_ms < next_retry) {
        next_retry = r->retry_at_ms;
      }
    }
    int running = 0;
    curl_multi_perform(s->m, &running);
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(s->m, &left)))
      if (msg->msg == CURLMSG_DONE) {
        req *r = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        ended(io, r, msg->data.result, &next_retry);
      }
    if (s->done_head != s->depth)
      continue;
    /* Wake for data, for a cached read, for the next retry, or every 50 ms to see a close. */
    int64_t until = next_retry == INT64_MAX ? 50 : next_retry - now_ms();
    struct curl_waitfd ring = {.fd = local && s->local.ops->poll_fd ? s->local.ops->poll_fd(&s->local) : -1,
                               .events = CURL_WAIT_POLLIN};
    if (local && ring.fd < 0)
      continue; /* the local backend has nothing to poll: its reads are done at submission */
    curl_multi_poll(s->m, ring.fd >= 0 ? &ring : NULL, ring.fd >= 0, (int)(until < 0 ? 0 : until > 50 ? 50 : until),
                    NULL);
  }
}

const dl__io_ops dl__io_http_ops = {"http", http_init, http_fini, http_submit, http_wait, NULL, NULL, NULL};
