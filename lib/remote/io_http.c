/*
 * The workers' reads of remote shards: each worker keeps up to io_depth ranged GETs in flight on
 * one curl multi handle (its connections reused, HTTP/2 streams multiplexed where the server
 * offers them). A request that fails in a way worth retrying goes back in after a backoff with
 * jitter; one that still fails completes with an error the worker reports for its sample, with the
 * message in io->why. A closing loader cancels what is in flight at once.
 * With a shard cache, a read of a shard whose copy is on local disk goes to the local backend
 * (io_uring) instead; the worker waits on both at once (the ring's descriptor polled with curl's).
 */
#include "remote/remote.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct op {
  CURL *h;
  bool busy, queued; /* in use; in the multi handle (else waiting for its retry) */
  bool empty;        /* a read of no bytes: nothing to ask the server */
  bool local;        /* read from the shard cache's copy (by s->local) */
  uint32_t file;
  uint64_t tag;
  dl__target t;
  uint8_t *buf;
  size_t len, got;
  uint64_t off;
  int attempt;
  int64_t retry_at_ms;
} op;

typedef struct http_state {
  CURLM *m;
  op *ops;
  unsigned depth;
  uint64_t rng;
  dl__io local; /* reads of cached copies, tagged with their op's index */
} http_state;

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
  for (unsigned i = 0; i < s->depth; i++)
    if (s->ops[i].h) {
      if (s->ops[i].queued)
        curl_multi_remove_handle(s->m, s->ops[i].h);
      curl_easy_cleanup(s->ops[i].h);
    }
  if (s->m)
    curl_multi_cleanup(s->m);
  free(s->ops);
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
  s->rng = (uint64_t)(uintptr_t)s;
  s->ops = calloc(depth, sizeof *s->ops);
  s->m = curl_multi_init();
  if (!s->ops || !s->m) {
    http_fini(io);
    return -ENOMEM;
  }
  curl_multi_setopt(s->m, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
  if (io->l->cache) {
    s->local.l = io->l;
    int r = dl__cache_io(io->l->cache)->init(&s->local, depth);
    if (r) {
      http_fini(io);
      return r;
    }
    s->local.ops = dl__cache_io(io->l->cache);
  }
  for (unsigned i = 0; i < depth; i++)
    if (!(s->ops[i].h = curl_easy_init())) {
      http_fini(io);
      return -ENOMEM;
    }
  return 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg) {
  op *o = arg;
  size_t len = size * n;
  if (o->got + len > o->len)
    return 0; /* more than the range asked for */
  memcpy(o->buf + o->got, p, len);
  o->got += len;
  return len;
}

static int queue(dl__io *io, op *o) {
  http_state *s = io->state;
  char range[64];
  snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)o->off, (unsigned long long)(o->off + o->len - 1));
  dl__http_configure(o->h, &io->l->o, &o->t);
  curl_easy_setopt(o->h, CURLOPT_RANGE, range); /* copied */
  curl_easy_setopt(o->h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(o->h, CURLOPT_WRITEDATA, o);
  curl_easy_setopt(o->h, CURLOPT_PRIVATE, o);
  o->got = 0;
  if (curl_multi_add_handle(s->m, o->h) != CURLM_OK)
    return -ENOMEM;
  o->queued = true;
  atomic_fetch_add_explicit(&io->l->st.requests, 1, memory_order_relaxed);
  return 0;
}

/* FD is the file's index in the dataset: remote files have no descriptor. */
static int http_submit(dl__io *io, int fd, void *buf, size_t len, uint64_t off, uint64_t tag) {
  http_state *s = io->state;
  op *o = NULL;
  for (unsigned i = 0; i < s->depth && !o; i++)
    if (!s->ops[i].busy)
      o = &s->ops[i];
  if (!o)
    return -EBUSY;
  const dl__dataset *ds = &io->l->ds;
  *o = (op){.h = o->h, .busy = true, .tag = tag, .t = {ds->files[fd], ds->remote[fd].url, ds->s3}, .buf = buf,
            .len = len, .off = off, .empty = len == 0, .file = (uint32_t)fd};
  int cached = len && io->l->cache ? dl__cache_take(io->l->cache, (uint32_t)fd) : -1;
  if (cached >= 0) {
    o->local = true;
    int r = s->local.ops->submit(&s->local, cached, buf, len, off, (uint64_t)(o - s->ops));
    if (r) {
      dl__cache_put(io->l->cache, o->file);
      o->busy = false;
    } else {
      atomic_fetch_add_explicit(&io->l->st.cache_hits, 1, memory_order_relaxed);
    }
    return r;
  }
  int r = len ? queue(io, o) : 0;
  if (r)
    o->busy = false;
  return r;
}

/* Ends O with RES (bytes, or a negative code with its message in io->why). */
static int complete(dl__io *io, op *o, int64_t res, uint64_t *tag, int64_t *out) {
  if (o->queued)
    curl_multi_remove_handle(((http_state *)io->state)->m, o->h);
  o->queued = false;
  o->busy = false;
  *tag = o->tag;
  *out = res;
  return 0;
}

/* A read of a cached copy that completed. */
static int local_done(dl__io *io, uint64_t index, int64_t got, uint64_t *tag, int64_t *res) {
  http_state *s = io->state;
  op *o = &s->ops[index];
  dl__cache_put(io->l->cache, o->file);
  o->local = false;
  if (got < 0)
    snprintf(io->why, sizeof io->why, "%s (cached copy): read failed: %s", o->t.name, strerror((int)-got));
  return complete(io, o, got, tag, res);
}

static int http_wait(dl__io *io, uint64_t *tag, int64_t *res) {
  http_state *s = io->state;
  dl_loader *l = io->l;
  for (;;) {
    unsigned remote = 0, local = 0;
    for (unsigned i = 0; i < s->depth; i++) {
      remote += s->ops[i].busy && !s->ops[i].local;
      local += s->ops[i].busy && s->ops[i].local;
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
    /* Closing: what is in flight is dropped, one completion per call. */
    if (atomic_load_explicit(&l->cancel, memory_order_relaxed))
      for (unsigned i = 0; i < s->depth; i++)
        if (s->ops[i].busy && !s->ops[i].local) {
          snprintf(io->why, sizeof io->why, "the loader was closed");
          return complete(io, &s->ops[i], DL_ECLOSED, tag, res);
        }
    int64_t now = now_ms(), next_retry = INT64_MAX;
    for (unsigned i = 0; i < s->depth; i++) {
      op *o = &s->ops[i];
      if (o->busy && o->empty)
        return complete(io, o, 0, tag, res);
      if (!o->busy || o->queued || o->local)
        continue;
      if (o->retry_at_ms <= now) {
        if (queue(io, o)) {
          snprintf(io->why, sizeof io->why, "%s: out of memory queueing a retry", o->t.name);
          return complete(io, o, -ENOMEM, tag, res);
        }
      } else if (o->retry_at_ms < next_retry) {
        next_retry = o->retry_at_ms;
      }
    }
    int running = 0;
    curl_multi_perform(s->m, &running);
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(s->m, &left))) {
      if (msg->msg != CURLMSG_DONE)
        continue;
      op *o = NULL;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&o);
      dl__http_outcome out;
      bool again = dl__http_outcome_of(o->h, msg->data.result == CURLE_WRITE_ERROR ? CURLE_OK : msg->data.result,
                                       &o->t, (int64_t)o->len, (int64_t)o->got, o->buf, &out);
      if (!out.code && out.status != 206 && !(out.status == 200 && o->off == 0)) {
        snprintf(io->why, sizeof io->why, "%s: the server does not serve byte ranges (HTTP %ld)", o->t.name, out.status);
        return complete(io, o, DL_EREMOTE, tag, res);
      }
      if (!out.code)
        return complete(io, o, (int64_t)o->got, tag, res);
      if (!again || o->attempt >= l->o.retries) {
        snprintf(io->why, sizeof io->why, "%s%s", out.msg, o->attempt ? " (after retries)" : "");
        return complete(io, o, out.code, tag, res);
      }
      curl_multi_remove_handle(s->m, o->h);
      o->queued = false;
      o->attempt++;
      curl_off_t after = 0;
      curl_easy_getinfo(o->h, CURLINFO_RETRY_AFTER, &after);
      long wait = after > 0 ? (long)(after < 30 ? after : 30) * 1000 : dl__http_backoff_ms(o->attempt, &s->rng);
      o->retry_at_ms = now_ms() + wait;
      atomic_fetch_add_explicit(&l->st.retries, 1, memory_order_relaxed);
      dl__log(DL__LOG_INFO, "%s; retrying in %ld ms", out.msg, wait);
      if (o->retry_at_ms < next_retry)
        next_retry = o->retry_at_ms;
    }
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

const dl__io_ops dl__io_http_ops = {"http", http_init, http_fini, http_submit, http_wait, NULL, NULL};
