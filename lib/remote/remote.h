/*
 * Shards behind HTTP(S): the requests (libcurl, connection reuse, TLS verified), the retry policy
 * shared by every request, the loading of a remote shard's index, and the I/O backend the workers
 * read samples with (ranged GETs, many in flight).
 */
#ifndef RINGFEED_REMOTE_H
#define RINGFEED_REMOTE_H

#include "internal.h"

#include <curl/curl.h>

/* What a request came to: its transport result, HTTP status and a message naming the URL. */
typedef struct dl__http_outcome {
  CURLcode curl;
  long status;
  int code; /* 0, or the DL_E / -errno code to report */
  char msg[DL__MSG_MAX];
} dl__http_outcome;

/* libcurl set up once for the process. */
int dl__http_global_init(void);
/* H ready for a request to URL with the loader's TLS and timeout options. */
void dl__http_configure(CURL *h, const dl__options *o, const char *url);
/* Reads a finished request's result into OUT; true when it failed in a way worth retrying
 * (timeouts, resets, 429 and 5xx, short bodies). EXPECT: the body length it should have had (or
 * -1), GOT: what came. */
bool dl__http_outcome_of(CURL *h, CURLcode c, const char *url, int64_t expect, int64_t got, dl__http_outcome *out);
/* The wait before retry ATTEMPT (1, 2, ...): exponential with jitter, capped. */
long dl__http_backoff_ms(int attempt, uint64_t *rng);

/* Size, ETag and the first bytes (up to CAP) of the object at URL. */
int dl__http_probe(const dl__options *o, const char *url, uint64_t *size, char *etag, size_t etag_cap,
                   uint8_t *head, size_t cap, size_t *head_len);
/* LEN bytes at OFF of URL into OUT (one ranged GET, retried). */
int dl__http_range(const dl__options *o, const char *url, uint64_t off, size_t len, uint8_t *out);
/* The whole object into FD (one GET, retried from the start), SIZE bytes expected. */
int dl__http_download(const dl__options *o, const char *url, int fd, uint64_t size);

#endif
