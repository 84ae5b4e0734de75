/*
 * HTTP(S) requests through libcurl: how every request is set up (TLS verified, connections kept,
 * HTTP/2 where offered, stalls cut off after timeout_ms), what counts as a failure worth retrying,
 * and the few blocking requests a loader makes while it opens (a probe, a ranged read, a download).
 * The workers' own requests go through io/http.c with the same setup and policy.
 */
#include "remote/remote.h"

#include <ctype.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static CURLcode init_result;

static void init(void) { init_result = curl_global_init(CURL_GLOBAL_DEFAULT); }

int dl__http_global_init(void) {
  pthread_once(&once, init);
  return init_result == CURLE_OK ? 0 : dl__fail(DL_EREMOTE, "libcurl: %s", curl_easy_strerror(init_result));
}

/* A private CA: the option, else the variables curl, OpenSSL and the AWS tools read. */
static const char *ca_file(const dl__options *o) {
  if (o->ca_file[0])
    return o->ca_file;
  const char *vars[] = {"CURL_CA_BUNDLE", "SSL_CERT_FILE", "AWS_CA_BUNDLE"};
  for (size_t i = 0; i < DL__ARRAY_LEN(vars); i++) {
    const char *v = getenv(vars[i]);
    if (v && *v)
      return v;
  }
  return NULL;
}

void dl__http_configure(CURL *h, const dl__options *o, const dl__target *t) {
  curl_easy_reset(h); /* the connection stays in the handle's cache */
  curl_easy_setopt(h, CURLOPT_URL, t->url);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  char agent[64];
  snprintf(agent, sizeof agent, "ringfeed/%s", dl_version());
  curl_easy_setopt(h, CURLOPT_USERAGENT, agent); /* copied by libcurl */
  /* A connection that does not open, or a body that stops coming, within timeout_ms. */
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)o->timeout_ms);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)((o->timeout_ms + 999) / 1000));
  const char *ca = ca_file(o);
  if (ca)
    curl_easy_setopt(h, CURLOPT_CAINFO, ca);
  bool signed_s3 = t->s3 && !t->s3->anonymous;
  if (signed_s3) {
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, t->s3->sigv4);
    curl_easy_setopt(h, CURLOPT_USERPWD, t->s3->userpwd);
  }
  if (t->headers || signed_s3)
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, t->headers ? t->headers : t->s3->headers);
}

bool dl__url_encode(char *out, size_t cap, size_t *at, const char *in, size_t n, const char *keep) {
  static const char hex[] = "0123456789ABCDEF";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)in[i];
    bool plain = isalnum(c) || (c && (strchr("-._~", c) || strchr(keep, c)));
    if (*at + (plain ? 1 : 3) >= cap)
      return false;
    if (plain) {
      out[(*at)++] = (char)c;
    } else {
      out[(*at)++] = '%';
      out[(*at)++] = hex[c >> 4];
      out[(*at)++] = hex[c & 15];
    }
  }
  out[*at] = 0;
  return true;
}

/* URL without any user:password@ it carries: messages never show credentials. */
static void redact(const char *url, char *out, size_t cap) {
  const char *scheme = strstr(url, "://");
  const char *at = scheme ? strchr(scheme + 3, '@') : NULL;
  const char *slash = scheme ? strchr(scheme + 3, '/') : NULL;
  if (at && (!slash || at < slash))
    snprintf(out, cap, "%.*s%s", (int)(scheme + 3 - url), url, at + 1);
  else
    snprintf(out, cap, "%s", url);
}

static bool retryable_transport(CURLcode c) {
  switch (c) {
  case CURLE_COULDNT_CONNECT:
  case CURLE_OPERATION_TIMEDOUT:
  case CURLE_RECV_ERROR:
  case CURLE_SEND_ERROR:
  case CURLE_PARTIAL_FILE:
  case CURLE_GOT_NOTHING:
  case CURLE_HTTP2:
  case CURLE_HTTP2_STREAM:
  case CURLE_SSL_CONNECT_ERROR:
    return true;
  default:
    return false;
  }
}

/* For a request that reached no server: which host it asked for (the URL of an s3:// or hf://
 * object names none), and for S3 the endpoint in use and where it comes from, into OUT. */
static void where_it_went(CURL *h, CURLcode c, const dl__target *t, char *out, size_t cap) {
  out[0] = 0;
  if (c != CURLE_COULDNT_RESOLVE_HOST && c != CURLE_COULDNT_CONNECT && c != CURLE_COULDNT_RESOLVE_PROXY)
    return;
  const char *url = NULL;
  char *host = NULL;
  curl_easy_getinfo(h, CURLINFO_EFFECTIVE_URL, &url);
  CURLU *u = curl_url();
  if (u && url && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK)
    curl_url_get(u, CURLUPART_HOST, &host, 0);
  int n = snprintf(out, cap, " (host %s", host ? host : "unknown");
  if (t->s3 && n > 0 && (size_t)n < cap)
    snprintf(out + n, cap - (size_t)n, ", the S3 endpoint %s: set AWS_ENDPOINT_URL for another)", t->s3->endpoint);
  else if (n > 0 && (size_t)n < cap)
    snprintf(out + n, cap - (size_t)n, ")");
  curl_free(host);
  curl_url_cleanup(u);
}

bool dl__http_outcome_of(CURL *h, CURLcode c, const dl__target *t, int64_t expect, int64_t got, const uint8_t *body,
                         int64_t asked_from, int64_t answered_from, dl__http_outcome *out) {
  char where[1024];
  redact(t->name, where, sizeof where);
  out->curl = c;
  out->status = 0;
  out->code = 0;
  out->msg[0] = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out->status);
  if (c != CURLE_OK) {
    out->code = DL_EREMOTE;
    char went[700];
    where_it_went(h, c, t, went, sizeof went);
    snprintf(out->msg, sizeof out->msg, "%s: %s%s", where, curl_easy_strerror(c), went);
    return retryable_transport(c);
  }
  long s = out->status;
  if (s == 206 && asked_from >= 0 && answered_from >= 0 && answered_from != asked_from) {
    /* A cache or proxy that answers another range: its bytes would be taken for the ones asked. */
    out->code = DL_EREMOTE;
    snprintf(out->msg, sizeof out->msg, "%s: HTTP 206 with the bytes from %lld when those from %lld were asked for",
             where, (long long)answered_from, (long long)asked_from);
    return true;
  }
  if (s == 200 || s == 206) {
    if (expect >= 0 && got != expect) {
      out->code = DL_EREMOTE;
      snprintf(out->msg, sizeof out->msg, "%s: short body (%lld of %lld bytes)", where, (long long)got,
               (long long)expect);
      return true;
    }
    return false;
  }
  out->code = s == 404 ? -ENOENT : s == 401 || s == 403 ? -EACCES : DL_EREMOTE;
  char code[96] = "";
  if (t->s3 && body && got > 0)
    dl__s3_error_code(body, (size_t)got, code, sizeof code); /* S3 says why: NoSuchKey, SignatureDoesNotMatch */
  const char *plain = s == 404 ? "not found" : s == 403 ? "forbidden" : s == 416 ? "range not satisfiable" : "";
  if (s == 412) /* If-Match refused: another version of the object than the one indexed */
    plain = "it changed on the server since it was opened";
  const char *why = code[0] && s != 412 ? code : plain;
  snprintf(out->msg, sizeof out->msg, "%s: HTTP %ld%s%s%s", where, s, why[0] ? " (" : "", why, why[0] ? ")" : "");
  return s == 429 || s == 500 || s == 502 || s == 503 || s == 504;
}

int64_t dl__http_range_from(const char *line, size_t len) {
  char text[128];
  snprintf(text, sizeof text, "%.*s", (int)(len < sizeof text - 1 ? len : sizeof text - 1), line);
  long long from;
  return sscanf(text, "%*[Cc]ontent-%*[Rr]ange: bytes %lld-", &from) == 1 && from >= 0 ? (int64_t)from : -1;
}

long dl__http_backoff_ms(int attempt, uint64_t *rng) {
  long cap = 5000, base = 100L << (attempt < 6 ? attempt - 1 : 5);
  if (base > cap)
    base = cap;
  *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
  return base / 2 + (long)((*rng >> 33) % (uint64_t)(base / 2 + 1)); /* [base/2, base] */
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000};
  while (nanosleep(&t, &t) && errno == EINTR)
    ;
}

/* ---- the blocking requests of dl_open ---- */

typedef struct sink {
  uint8_t *buf; /* into memory (CAP bytes at most), or */
  size_t cap;
  int fd; /* into a file at OFF onwards (fd >= 0), CAP bytes at most where CAP is set */
  uint64_t off;
  uint64_t got;
  bool over; /* more came than the CAP bytes of the file's part */
  int err; /* -errno of a failed write */
  /* From the headers: the object's total size (Content-Range) and its ETag. */
  int64_t total, range_from;
  char etag[128];
  char *next; /* with NEXT_CAP: the URL of a Link header's rel="next" (a listing's next page), or "" */
  size_t next_cap;
  const _Atomic int *cancel; /* a transfer stops when it turns nonzero (may be NULL) */
} sink;

/* H's transfer; with CANCEL, given up within 50 ms of it turning nonzero (libcurl's progress
 * callback may wait a second between calls on a stalled transfer). */
static CURLcode perform(CURL *h, const _Atomic int *cancel) {
  if (!cancel)
    return curl_easy_perform(h);
  CURLM *m = curl_multi_init();
  if (!m || curl_multi_add_handle(m, h) != CURLM_OK) {
    if (m)
      curl_multi_cleanup(m);
    return CURLE_OUT_OF_MEMORY;
  }
  CURLcode result = CURLE_ABORTED_BY_CALLBACK;
  for (int running = 1; running && !atomic_load_explicit(cancel, memory_order_relaxed);) {
    curl_multi_perform(m, &running);
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left)))
      if (msg->msg == CURLMSG_DONE)
        result = msg->data.result;
    if (running)
      curl_multi_poll(m, NULL, 0, 50, NULL);
  }
  curl_multi_remove_handle(m, h);
  curl_multi_cleanup(m);
  return result;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg) {
  sink *s = arg;
  size_t len = size * n;
  if (s->fd >= 0) {
    if (s->cap && s->got + len > s->cap) {
      s->over = true; /* an object larger than its size said, or a body that never ends */
      return 0;
    }
    for (size_t done = 0; done < len;) {
      ssize_t w = pwrite(s->fd, p + done, len - done, (off_t)(s->off + s->got + done));
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0) {
        s->err = w < 0 ? -errno : -EIO;
        return 0;
      }
      done += (size_t)w;
    }
  } else {
    if (s->got + len > s->cap) { /* more than asked for: a server that ignored the range, or a page too big */
      memcpy(s->buf + s->got, p, s->cap - s->got);
      s->got = s->cap;
      s->over = true;
      return 0;
    }
    memcpy(s->buf + s->got, p, len);
  }
  s->got += len;
  return len;
}

/* The URL of the rel="next" link of a Link header's value P (N bytes) into OUT, or "". */
static void next_link(const char *p, size_t n, char *out, size_t cap) {
  out[0] = 0;
  for (const char *at = p, *end = p + n; at < end;) {
    const char *open = memchr(at, '<', (size_t)(end - at));
    const char *close = open ? memchr(open, '>', (size_t)(end - open)) : NULL;
    if (!close)
      return;
    const char *stop = memchr(close, ',', (size_t)(end - close));
    stop = stop ? stop : end;
    bool next = false;
    for (const char *q = close; q + 10 <= stop && !next; q++)
      next = !strncasecmp(q, "rel=\"next\"", 10) || !strncasecmp(q, "rel=next", 8);
    if (next && (size_t)(close - open - 1) < cap) {
      snprintf(out, cap, "%.*s", (int)(close - open - 1), open + 1);
      return;
    }
    at = stop + 1;
  }
}

static size_t on_header(char *p, size_t size, size_t n, void *arg) {
  sink *s = arg;
  size_t len = size * n;
  if (s->next && len > 5 && !strncasecmp(p, "Link:", 5)) {
    next_link(p + 5, len - 5, s->next, s->next_cap);
    return len;
  }
  char line[512];
  snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line - 1 ? len : sizeof line - 1), p);
  line[strcspn(line, "\r\n")] = 0;
  if (!strncasecmp(line, "HTTP/", 5)) { /* a new response (after a redirect): forget the last one's */
    s->total = -1;
    s->range_from = -1;
    s->etag[0] = 0;
    if (s->next)
      s->next[0] = 0;
  } else if (!strncasecmp(line, "Content-Range:", 14)) {
    s->range_from = dl__http_range_from(line, strlen(line));
    const char *slash = strchr(line, '/');
    if (slash && slash[1] != '*')
      s->total = strtoll(slash + 1, NULL, 10);
  } else if (!strncasecmp(line, "ETag:", 5)) {
    const char *v = line + 5;
    while (*v == ' ')
      v++;
    /* One that does not fit would be asked for cut short, and never match (412 for every read):
     * such an object is read as one without an ETag. */
    bool fits = len < sizeof line - 1 && strlen(v) < sizeof s->etag;
    snprintf(s->etag, sizeof s->etag, "%s", fits ? v : "");
  }
  return len;
}

/* A handle for one request, libcurl set up for the process first. */
static int new_request(CURL **h) {
  int r = dl__http_global_init();
  if (r)
    return r;
  *h = curl_easy_init();
  return *h ? 0 : dl__fail(-ENOMEM, "out of memory starting a request");
}

/* One GET of T with RANGE ("a-b", or NULL for all), retried; the body into S. A ranged request
 * answered with the whole object (200) is refused unless WHOLE_OK. */
static int get(const dl__options *o, const dl__target *t, const char *range, bool whole_ok, int64_t expect, sink *s,
               dl__http_outcome *out) {
  CURL *h;
  int r = new_request(&h);
  if (r)
    return r;
  uint64_t rng = (uint64_t)(uintptr_t)s ^ (uint64_t)time(NULL);
  uint64_t start = s->got;
  for (int attempt = 0;; attempt++) {
    dl__http_configure(h, o, t);
    if (range)
      curl_easy_setopt(h, CURLOPT_RANGE, range);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, s);
    s->got = start;
    s->err = 0;
    s->over = false;
    s->total = -1;
    s->range_from = -1;
    CURLcode c = perform(h, s->cancel);
    if (s->err) {
      r = dl__fail(s->err, "writing what %s sent: %s", t->name, strerror(-s->err));
      break;
    }
    if (s->cancel && atomic_load_explicit(s->cancel, memory_order_relaxed)) {
      r = dl__fail(DL_ECLOSED, "%s: the loader was closed", t->name);
      break;
    }
    bool again = dl__http_outcome_of(h, c == CURLE_WRITE_ERROR ? CURLE_OK : c, t, expect, (int64_t)(s->got - start),
                                     s->buf ? s->buf + start : NULL, range ? strtoll(range, NULL, 10) : -1,
                                     s->range_from, out);
    if (range && out->status == 200 && !whole_ok) { /* the Range header was ignored */
      r = dl__fail(DL_EREMOTE, "%s: %s (HTTP 200 to a Range request)", t->name, DL__NO_RANGES);
      break;
    }
    /* More than asked for: retried, as a short body is. Where WHOLE_OK, what came is enough for the
     * caller (a probe's first bytes, a page that must fit), which judges it. */
    if (s->over && !whole_ok && (out->status == 200 || out->status == 206)) {
      char where[1024];
      redact(t->name, where, sizeof where);
      out->code = DL_EREMOTE;
      snprintf(out->msg, sizeof out->msg, "%s: more than the %llu bytes expected came (HTTP %ld)", where,
               (unsigned long long)s->cap, out->status);
      again = true;
    }
    if (!out->code || !again || attempt >= o->retries) {
      r = out->code ? dl__fail(out->code, "%s%s", out->msg, attempt ? " (after retries)" : "") : 0;
      break;
    }
    curl_off_t after = 0;
    curl_easy_getinfo(h, CURLINFO_RETRY_AFTER, &after);
    long wait = after > 0 ? (long)(after < 30 ? after : 30) * 1000 : dl__http_backoff_ms(attempt + 1, &rng);
    dl__log(DL__LOG_INFO, "%s; retrying in %ld ms", out->msg, wait);
    for (long slept = 0; slept < wait && !(s->cancel && atomic_load_explicit(s->cancel, memory_order_relaxed)); slept += 50)
      sleep_ms(wait - slept < 50 ? wait - slept : 50);
  }
  curl_easy_cleanup(h);
  return r;
}

int dl__http_probe(const dl__options *o, const dl__target *t, uint64_t *size, char *etag, size_t etag_cap,
                   uint8_t *head, size_t cap, size_t *head_len) {
  sink s = {.buf = head, .cap = cap, .fd = -1, .total = -1};
  char range[64];
  snprintf(range, sizeof range, "0-%zu", cap - 1);
  dl__http_outcome out;
  int r = get(o, t, range, true, -1, &s, &out);
  if (r && out.status == 416) /* an empty object has no byte 0 */
    return dl__fail(DL_ENOSAMPLES, "source %s: the object is empty", t->name);
  if (r)
    return r;
  if (out.status == 206 && s.total >= 0) {
    *size = (uint64_t)s.total;
  } else if (out.status == 200 && s.got < cap) {
    *size = s.got; /* the whole object came: it was smaller than asked for */
  } else {
    return dl__fail(DL_EREMOTE, "source %s: %s (HTTP %ld to a Range request)", t->name, DL__NO_RANGES,
                    out.status);
  }
  *head_len = s.got;
  snprintf(etag, etag_cap, "%s", s.etag);
  return 0;
}

int dl__http_range(const dl__options *o, const dl__target *t, uint64_t off, size_t len, uint8_t *out_buf) {
  sink s = {.buf = out_buf, .cap = len, .fd = -1, .total = -1};
  char range[64];
  snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)off, (unsigned long long)(off + len - 1));
  dl__http_outcome out;
  return get(o, t, range, false, (int64_t)len, &s, &out);
}

int dl__http_get_small(const dl__options *o, const dl__target *t, uint8_t *out_buf, size_t cap, size_t *len) {
  return dl__http_get_page(o, t, out_buf, cap, len, NULL, 0);
}

int dl__http_get_page(const dl__options *o, const dl__target *t, uint8_t *out_buf, size_t cap, size_t *len, char *next,
                      size_t next_cap) {
  sink s = {.buf = out_buf, .cap = cap, .fd = -1, .total = -1, .next = next, .next_cap = next_cap};
  if (next)
    next[0] = 0;
  dl__http_outcome out;
  int r = get(o, t, NULL, true, -1, &s, &out);
  *len = s.got;
  if (!r && s.got == cap)
    return dl__fail(DL_ELIMIT, "%s: the answer is larger than %zu bytes", t->name, cap);
  return r;
}

int dl__http_download(const dl__options *o, const dl__target *t, int fd, uint64_t size, const _Atomic int *cancel) {
  /* A download cut short resumes where it stopped rather than starting over. */
  uint64_t have = 0;
  for (int pass = 0; have < size && pass <= o->retries; pass++) {
    sink s = {.fd = fd, .cap = (size_t)(size - have), .off = have, .total = -1, .cancel = cancel};
    char range[64];
    snprintf(range, sizeof range, "%llu-", (unsigned long long)have);
    dl__http_outcome out;
    int r = get(o, t, have ? range : NULL, false, (int64_t)(size - have), &s, &out);
    have += s.got;
    if (r == 0)
      return have == size ? 0 : dl__fail(DL_EREMOTE, "source %s: %llu of %llu bytes came", t->name,
                                         (unsigned long long)have, (unsigned long long)size);
    if (!s.got || s.over)
      return r; /* failed without progress, after get()'s own retries, or too much came */
  }
  return have == size ? 0 : dl__fail(DL_EREMOTE, "source %s: the download kept stopping", t->name);
}

/* ---- uploads (dlshard create s3://...) ---- */

typedef struct source {
  int fd;
  uint64_t off, size;
  int err;
} source;

static size_t on_read(char *p, size_t size, size_t n, void *arg) {
  source *s = arg;
  size_t want = size * n;
  if (want > s->size - s->off)
    want = (size_t)(s->size - s->off);
  int64_t got = want ? dl__pread_full(s->fd, p, want, s->off) : 0;
  if (got < 0 || (size_t)got != want) {
    s->err = got < 0 ? (int)got : -EIO;
    return CURL_READFUNC_ABORT;
  }
  s->off += (uint64_t)got;
  return (size_t)got;
}

int dl__http_put(const dl__options *o, const dl__target *t, int fd, uint64_t size) {
  CURL *h;
  int r = new_request(&h);
  if (r)
    return r;
  uint64_t rng = (uint64_t)(uintptr_t)h ^ (uint64_t)time(NULL);
  uint8_t answer[1024];
  for (int attempt = 0;; attempt++) {
    source src = {.fd = fd, .size = size};
    sink s = {.buf = answer, .cap = sizeof answer, .fd = -1, .total = -1};
    dl__http_configure(h, o, t);
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)size);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(h, CURLOPT_READDATA, &src);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    /* The body is not hashed into the signature (S3's UNSIGNED-PAYLOAD; TLS protects it). */
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, t->s3 ? t->s3->put_headers : NULL);
    CURLcode c = curl_easy_perform(h);
    if (c == CURLE_WRITE_ERROR)
      c = CURLE_OK; /* a long answer: its start says enough */
    if (src.err) {
      r = dl__fail(src.err, "reading what to upload to %s: %s", t->name, strerror(-src.err));
      break;
    }
    dl__http_outcome out;
    bool again = dl__http_outcome_of(h, c, t, -1, (int64_t)s.got, answer, -1, -1, &out);
    if (!out.code && out.status != 200 && out.status != 201 && out.status != 204) {
      r = dl__fail(DL_EREMOTE, "%s: upload answered with HTTP %ld", t->name, out.status);
      break;
    }
    if (!out.code || !again || attempt >= o->retries) {
      r = out.code ? dl__fail(out.code, "%s%s", out.msg, attempt ? " (after retries)" : "") : 0;
      break;
    }
    long wait = dl__http_backoff_ms(attempt + 1, &rng);
    dl__log(DL__LOG_INFO, "%s; retrying in %ld ms", out.msg, wait);
    sleep_ms(wait);
  }
  curl_easy_cleanup(h);
  return r;
}
