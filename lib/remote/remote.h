/*
 * The remote stage (remote/): the clients of HTTP(S) (libcurl, connection reuse, TLS verified,
 * the retry policy every request shares), S3 (addressing, credentials, listings) and the Hugging
 * Face Hub (endpoint, token, listings). It calls only util/ and internal.h; io/ reads samples
 * through it and source/ loads remote shards' indexes through it.
 */
#ifndef RINGFEED_REMOTE_H
#define RINGFEED_REMOTE_H

#include "internal.h"
#include "options.h"
#include "util/util.h"

#include <curl/curl.h>

#define DL__MAX_LIST_PAGES 100000 /* of a listing (S3, the Hub): 100 million keys at 1,000 a page */

/* S3's addressing and credentials for one dataset (s3.c): where a bucket's objects are reached and
 * how requests are signed (SigV4 by libcurl). */
typedef struct dl__s3 {
  char region[64];
  char endpoint[512]; /* scheme://host[:port], no trailing slash */
  bool path_style;    /* endpoint/bucket/key, else scheme://bucket.host/key */
  bool anonymous;     /* no credentials found: unsigned requests (public buckets) */
  char sigv4[128];    /* CURLOPT_AWS_SIGV4 */
  char userpwd[512];  /* access key id:secret */
  struct curl_slist *headers; /* x-amz-content-sha256, x-amz-security-token */
  struct curl_slist *put_headers; /* the same for uploads: UNSIGNED-PAYLOAD */
} dl__s3;

/* Resolves region, endpoint and credentials from the options and the AWS variables and files. */
int dl__s3_open(const dl__options *o, dl__s3 **out);
void dl__s3_free(dl__s3 *s);
/* The HTTP(S) URL of S3URL (s3://bucket/key) into OUT. */
int dl__s3_url(const dl__s3 *s, const char *s3url, char *out, size_t cap);
/* The keys of s3://bucket/PATTERN (globs within a path segment), as s3:// URLs, sorted. */
int dl__s3_list(const dl__options *o, const dl__s3 *s, const char *pattern, char ***out, size_t *n);
/* S3's <Code> in an error body, or "". */
void dl__s3_error_code(const uint8_t *body, size_t n, char *out, size_t cap);

/* The Hugging Face Hub (hub.c): its endpoint and the token its requests carry. */
typedef struct dl__hub {
  char endpoint[512];      /* scheme://host[:port], no trailing slash */
  struct curl_slist *auth; /* "Authorization: Bearer ...", or NULL without a token */
} dl__hub;

/* The endpoint (HF_ENDPOINT) and the token found as huggingface_hub finds it. */
int dl__hub_open(dl__hub **out);
void dl__hub_free(dl__hub *h);
/* Whether the HTTP(S) URL is on the Hub's endpoint (its requests carry the token). */
bool dl__hub_serves(const dl__hub *h, const char *url);
/* The HTTP(S) URL of HF (hf://datasets/ORG/NAME[@REVISION]/PATH) into OUT. */
int dl__hub_url(const dl__hub *h, const char *hf, char *out, size_t cap);
/* RC, with what to do added to the last error where the Hub refused access (-EACCES). */
int dl__hub_explain(int rc, const dl__hub *h);
/* The entries of one page of the Hub's tree API at P (to END): each file's "path" to ON_FILE,
 * which stops the walk by returning an error code (returned). -1 when the page is not the array
 * of objects the API answers with. */
int dl__hub_tree_files(const char *p, const char *end, int (*on_file)(const char *path, void *arg), void *arg);
/* The files of hf://.../DIR/PATTERN (wildcards in the file name only), as hf:// URLs, sorted. */
int dl__hub_list(const dl__options *o, const dl__hub *h, const char *pattern, char ***out, size_t *n);

/* Why a server that answers a Range request with the whole object (HTTP 200) cannot serve a loader. */
#define DL__NO_RANGES                                                                                    \
  "the server does not serve byte ranges, by which samples are read: serve the shards from one that "   \
  "does (nginx, Apache, S3, most CDNs) or copy them to local disk"

/* One remote object: NAME in messages (the source as given; messages lose its user name and
 * password on the way out), URL requested, S3 signing or NULL, and the headers of its requests
 * where they are its own (else S3's, or none). */
typedef struct dl__target {
  const char *name;
  const char *url;
  const dl__s3 *s3;
  struct curl_slist *headers;
} dl__target;

/* What a request came to: its transport result, HTTP status and a message naming the URL. */
typedef struct dl__http_outcome {
  CURLcode curl;
  long status;
  int code; /* 0, or the DL_E / -errno code to report */
  char msg[DL__MSG_MAX];
} dl__http_outcome;

/* Appends N bytes of IN to OUT (CAP bytes, from *AT on), percent-encoding all but the unreserved
 * characters and those in KEEP; false when it does not fit. */
bool dl__url_encode(char *out, size_t cap, size_t *at, const char *in, size_t n, const char *keep);
/* libcurl set up once for the process. */
int dl__http_global_init(void);
/* H ready for a request to T with the loader's TLS and timeout options (and S3's signing). */
void dl__http_configure(CURL *h, const dl__options *o, const dl__target *t);
/* Reads a finished request's result into OUT; true when it failed in a way worth retrying
 * (timeouts, resets, 429 and 5xx, short bodies, another range than asked). EXPECT: the body length
 * it should have had (or -1), GOT: what came; ASKED_FROM: the first byte a ranged request asked
 * for, ANSWERED_FROM: the first its Content-Range gave (each -1 when there is none). */
bool dl__http_outcome_of(CURL *h, CURLcode c, const dl__target *t, int64_t expect, int64_t got, const uint8_t *body,
                         int64_t asked_from, int64_t answered_from, dl__http_outcome *out);
/* The first byte of a "Content-Range: bytes A-B/T" header LINE (LEN bytes), or -1 for any other. */
int64_t dl__http_range_from(const char *line, size_t len);
/* The wait before retry ATTEMPT (1, 2, ...): exponential with jitter, capped. */
long dl__http_backoff_ms(int attempt, uint64_t *rng);

/* Size, ETag and the first bytes (up to CAP) of the object T. */
int dl__http_probe(const dl__options *o, const dl__target *t, uint64_t *size, char *etag, size_t etag_cap,
                   uint8_t *head, size_t cap, size_t *head_len);
/* LEN bytes at OFF of T into OUT (one ranged GET, retried). */
int dl__http_range(const dl__options *o, const dl__target *t, uint64_t off, size_t len, uint8_t *out);
/* The whole object into FD (retried, resuming where a transfer stopped), SIZE bytes expected;
 * given up with DL_ECLOSED once *CANCEL (may be NULL) turns nonzero. */
int dl__http_download(const dl__options *o, const dl__target *t, int fd, uint64_t size, const _Atomic int *cancel);
/* Uploads SIZE bytes of FD to T (a PUT, retried). */
int dl__http_put(const dl__options *o, const dl__target *t, int fd, uint64_t size);
/* The body of a GET of T (at most CAP bytes) into OUT, its length in *LEN: small answers (listings). */
int dl__http_get_small(const dl__options *o, const dl__target *t, uint8_t *out, size_t cap, size_t *len);
/* The same, and the URL of the next page (a Link header's rel="next", NEXT_CAP bytes) into NEXT, or "". */
int dl__http_get_page(const dl__options *o, const dl__target *t, uint8_t *out, size_t cap, size_t *len, char *next,
                      size_t next_cap);

#endif
