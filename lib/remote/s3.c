/*
 * S3 and S3-compatible stores: where s3://bucket/key is reached and how requests are signed. The
 * signing itself is libcurl's (CURLOPT_AWS_SIGV4); this file finds what it needs where the AWS
 * tools look: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else the profile
 * (AWS_PROFILE, "default") in ~/.aws/credentials; the region in AWS_REGION, AWS_DEFAULT_REGION or
 * ~/.aws/config; the endpoint in AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else AWS's own.
 * Listings (for globs) are ListObjectsV2 pages, of which only Key, IsTruncated and
 * NextContinuationToken are read.
 */
#include "remote/remote.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* libcurl's SigV4 of curl 7.88 does not send x-amz-content-sha256, which S3 requires: the hash
 * of the empty body of a GET. */
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

/* KEY of section SECTION in the INI file PATH into OUT; false when absent. */
static bool ini_get(const char *path, const char *section, const char *key, char *out, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f)
    return false;
  char line[4096];
  bool in = false, found = false;
  while (!found && fgets(line, sizeof line, f)) {
    char *p = line;
    while (isspace((unsigned char)*p))
      p++;
    p[strcspn(p, "\r\n")] = 0;
    if (*p == '[') {
      char *end = strchr(p, ']');
      if (end)
        *end = 0;
      char *name = p + 1;
      while (isspace((unsigned char)*name))
        name++;
      in = !strcmp(name, section);
      continue;
    }
    char *eq = strchr(p, '=');
    if (!in || !eq || *p == '#' || *p == ';')
      continue;
    char *k = p, *v = eq + 1, *kend = eq;
    while (kend > k && isspace((unsigned char)kend[-1]))
      kend--;
    *kend = 0;
    while (isspace((unsigned char)*v))
      v++;
    char *vend = v + strlen(v);
    while (vend > v && isspace((unsigned char)vend[-1]))
      *--vend = 0;
    if (!strcmp(k, key)) {
      snprintf(out, cap, "%s", v);
      found = true;
    }
  }
  fclose(f);
  return found;
}

static void aws_file(const char *var, const char *name, char *out, size_t cap) {
  const char *set = env(var), *home = env("HOME");
  if (set)
    snprintf(out, cap, "%s", set);
  else
    snprintf(out, cap, "%s/.aws/%s", home ? home : "", name);
}

/* LIST with LINE added; NULL (and LIST freed) when out of memory. */
static struct curl_slist *append(struct curl_slist *list, const char *line) {
  if (!list)
    return NULL;
  struct curl_slist *more = curl_slist_append(list, line);
  if (!more)
    curl_slist_free_all(list);
  return more;
}

int dl__s3_open(const dl__options *o, dl__s3 **out) {
  dl__s3 *s = calloc(1, sizeof *s);
  if (!s)
    return dl__fail(-ENOMEM, "out of memory");
  const char *profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";
  char creds[1024], config[1024], section[300], key_id[256] = "", secret[256] = "", token[4096] = "";
  aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials", creds, sizeof creds);
  aws_file("AWS_CONFIG_FILE", "config", config, sizeof config);
  snprintf(section, sizeof section, strcmp(profile, "default") ? "profile %s" : "%s", profile);
  /* Region: the variables, then the profile's config. */
  if (env("AWS_REGION"))
    snprintf(s->region, sizeof s->region, "%s", env("AWS_REGION"));
  else if (env("AWS_DEFAULT_REGION"))
    snprintf(s->region, sizeof s->region, "%s", env("AWS_DEFAULT_REGION"));
  else if (!ini_get(config, section, "region", s->region, sizeof s->region))
    snprintf(s->region, sizeof s->region, "us-east-1");
  /* Credentials: the variables, then the profile. */
  if (env("AWS_ACCESS_KEY_ID") && env("AWS_SECRET_ACCESS_KEY")) {
    snprintf(key_id, sizeof key_id, "%s", env("AWS_ACCESS_KEY_ID"));
    snprintf(secret, sizeof secret, "%s", env("AWS_SECRET_ACCESS_KEY"));
    if (env("AWS_SESSION_TOKEN"))
      snprintf(token, sizeof token, "%s", env("AWS_SESSION_TOKEN"));
  } else if (ini_get(creds, profile, "aws_access_key_id", key_id, sizeof key_id) &&
             ini_get(creds, profile, "aws_secret_access_key", secret, sizeof secret)) {
    ini_get(creds, profile, "aws_session_token", token, sizeof token);
  } else if (env("AWS_PROFILE")) {
    free(s);
    return dl__fail(-EACCES, "AWS_PROFILE=%s: no credentials for it in %s", profile, creds);
  }
  /* Endpoint and addressing: a custom endpoint (MinIO, Ceph, s3rver) is usually path-style. */
  const char *endpoint = env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3") : env("AWS_ENDPOINT_URL");
  if (endpoint)
    snprintf(s->endpoint, sizeof s->endpoint, "%s", endpoint);
  else
    snprintf(s->endpoint, sizeof s->endpoint, "https://s3.%s.amazonaws.com", s->region);
  size_t n = strlen(s->endpoint);
  while (n && s->endpoint[n - 1] == '/')
    s->endpoint[--n] = 0;
  s->path_style = o->s3_addressing == DL__S3_PATH || (o->s3_addressing == DL__S3_AUTO && endpoint);
  s->anonymous = !key_id[0];
  if (!s->anonymous) {
    snprintf(s->sigv4, sizeof s->sigv4, "aws:amz:%s:s3", s->region);
    snprintf(s->userpwd, sizeof s->userpwd, "%s:%s", key_id, secret);
    char header[4200];
    s->headers = curl_slist_append(NULL, "x-amz-content-sha256: " EMPTY_SHA256);
    s->put_headers = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (token[0]) {
      snprintf(header, sizeof header, "x-amz-security-token: %s", token);
      s->headers = append(s->headers, header);
      s->put_headers = append(s->put_headers, header);
    }
  }
  if (!s->anonymous && (!s->headers || !s->put_headers)) {
    dl__s3_free(s);
    return dl__fail(-ENOMEM, "out of memory");
  }
  memset(secret, 0, sizeof secret);
  memset(token, 0, sizeof token);
  *out = s;
  return 0;
}

void dl__s3_free(dl__s3 *s) {
  if (!s)
    return;
  curl_slist_free_all(s->headers);
  curl_slist_free_all(s->put_headers);
  memset(s, 0, sizeof *s); /* the secret does not outlive the loader in memory */
  free(s);
}

/* BUCKET and KEY of s3://bucket/key (KEY may be empty). */
static int split(const char *s3url, char *bucket, size_t bcap, const char **key) {
  const char *b = s3url + 5, *slash = strchr(b, '/');
  size_t blen = slash ? (size_t)(slash - b) : strlen(b);
  if (!blen || blen >= bcap)
    return dl__fail(DL_EOPTION, "source %s: expected s3://bucket/key", s3url);
  memcpy(bucket, b, blen);
  bucket[blen] = 0;
  *key = slash ? slash + 1 : "";
  return 0;
}

static int bucket_url(const dl__s3 *s, const char *bucket, char *out, size_t cap) {
  const char *scheme_end = strstr(s->endpoint, "://");
  if (!scheme_end)
    return dl__fail(DL_EOPTION, "S3 endpoint %s: expected scheme://host", s->endpoint);
  int n = s->path_style ? snprintf(out, cap, "%s/%s", s->endpoint, bucket)
                        : snprintf(out, cap, "%.*s%s.%s", (int)(scheme_end + 3 - s->endpoint), s->endpoint, bucket,
                                   scheme_end + 3);
  return n > 0 && (size_t)n < cap ? 0 : dl__fail(DL_ELIMIT, "S3 URL for bucket %s too long", bucket);
}

int dl__s3_url(const dl__s3 *s, const char *s3url, char *out, size_t cap) {
  char bucket[256];
  const char *key;
  int r = split(s3url, bucket, sizeof bucket, &key);
  if (!r && (!*key || key[strlen(key) - 1] == '/')) /* a bucket or a "folder": its listing is no shard */
    r = dl__fail(DL_EOPTION, "source %s: names no object: give s3://bucket/key, or a pattern such as "
                 "s3://bucket/prefix/*.tar", s3url);
  if (!r)
    r = bucket_url(s, bucket, out, cap);
  if (r)
    return r;
  size_t n = strlen(out);
  /* S3's canonical form: unreserved characters as they are; a key's slashes are its path's */
  bool fits = dl__url_encode(out, cap, &n, "/", 1, "/") && dl__url_encode(out, cap, &n, key, strlen(key), "/");
  return fits ? 0 : dl__fail(DL_ELIMIT, "source %s: URL too long", s3url);
}

/* The text of the next <TAG>...</TAG> at or after *P (XML entities decoded), advancing *P. */
static bool xml_next(const char **p, const char *end, const char *tag, char *out, size_t cap) {
  char open[64], close[64];
  snprintf(open, sizeof open, "<%s>", tag);
  snprintf(close, sizeof close, "</%s>", tag);
  const char *a = memmem(*p, (size_t)(end - *p), open, strlen(open));
  if (!a)
    return false;
  a += strlen(open);
  const char *b = memmem(a, (size_t)(end - a), close, strlen(close));
  if (!b)
    return false;
  size_t n = 0;
  static const struct {
    const char *name;
    char c;
  } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
  for (const char *q = a; q < b && n + 1 < cap;) {
    bool done = false;
    for (size_t e = 0; e < DL__ARRAY_LEN(ents) && !done; e++)
      if (!strncmp(q, ents[e].name, strlen(ents[e].name))) {
        out[n++] = ents[e].c;
        q += strlen(ents[e].name);
        done = true;
      }
    if (!done)
      out[n++] = *q++;
  }
  out[n] = 0;
  *p = b + strlen(close);
  return true;
}

void dl__s3_error_code(const uint8_t *body, size_t n, char *out, size_t cap) {
  const char *p = (const char *)body;
  out[0] = 0;
  if (!xml_next(&p, (const char *)body + n, "Code", out, cap))
    out[0] = 0;
}

int dl__s3_list(const dl__options *o, const dl__s3 *s, const char *pattern, char ***out, size_t *count) {
  char bucket[256], base[1024], prefix[1024], url[8192], token[2048] = "", esc_prefix[3072], esc_token[6144];
  const char *key_pattern;
  int r = split(pattern, bucket, sizeof bucket, &key_pattern);
  if (!r)
    r = bucket_url(s, bucket, base, sizeof base);
  if (r)
    return r;
  /* List from the part of the key before its first wildcard. */
  size_t plen = strcspn(key_pattern, "*?[");
  snprintf(prefix, sizeof prefix, "%.*s", (int)plen, key_pattern);
  size_t at = 0;
  if (!dl__url_encode(esc_prefix, sizeof esc_prefix, &at, prefix, strlen(prefix), ""))
    return dl__fail(DL_ELIMIT, "source %s: the prefix is too long", pattern);
  /* A page holds up to 1,000 keys of up to 1,024 bytes each, XML-escaped, with their details. */
  size_t cap = 8u << 20, n = 0, vcap = 0;
  uint8_t *page = malloc(cap);
  char **v = NULL;
  if (!page)
    return dl__fail(-ENOMEM, "out of memory");
  /* A server that answers every page as truncated would keep the listing going for ever: a token
   * given twice in a row ends it, and so do DL__MAX_LIST_PAGES pages or DL__MAX_PATHS matches. */
  char seen[sizeof token] = "";
  for (int pages = 0; !r; pages++) {
    if (pages && !strcmp(token, seen)) {
      r = dl__fail(DL_EREMOTE, "listing %s: page %d gives the same continuation token as the page before",
                   pattern, pages);
      break;
    }
    if (pages >= DL__MAX_LIST_PAGES) {
      r = dl__fail(DL_ELIMIT, "listing %s: more than %d pages", pattern, DL__MAX_LIST_PAGES);
      break;
    }
    snprintf(seen, sizeof seen, "%s", token);
    at = 0;
    dl__url_encode(esc_token, sizeof esc_token, &at, token, strlen(token), ""); /* fits: 3 x its size */
    snprintf(url, sizeof url, "%s?list-type=2&prefix=%s%s%s", base, esc_prefix, token[0] ? "&continuation-token=" : "",
             token[0] ? esc_token : "");
    dl__target t = {pattern, url, s, NULL};
    size_t len = 0;
    r = dl__http_get_small(o, &t, page, cap, &len);
    if (r)
      break;
    const char *p = (const char *)page, *end = p + len;
    char key[1100], flag[16];
    while (!r && xml_next(&p, end, "Key", key, sizeof key)) {
      if (fnmatch(key_pattern, key, FNM_PATHNAME))
        continue;
      if (n == DL__MAX_PATHS) {
        r = dl__fail(DL_ELIMIT, "listing %s: more than %d objects match", pattern, DL__MAX_PATHS);
        break;
      }
      if (n == vcap) {
        vcap = vcap ? vcap * 2 : 64;
        char **grown = realloc(v, vcap * sizeof *v);
        if (!grown) {
          r = dl__fail(-ENOMEM, "out of memory listing %s", pattern);
          break;
        }
        v = grown;
      }
      size_t need = strlen(bucket) + strlen(key) + 7;
      if (!(v[n] = malloc(need))) {
        r = dl__fail(-ENOMEM, "out of memory listing %s", pattern);
        break;
      }
      snprintf(v[n++], need, "s3://%s/%s", bucket, key);
    }
    p = (const char *)page;
    if (r || !xml_next(&p, end, "IsTruncated", flag, sizeof flag) || strcmp(flag, "true"))
      break;
    p = (const char *)page;
    if (!xml_next(&p, end, "NextContinuationToken", token, sizeof token))
      r = dl__fail(DL_EREMOTE, "listing %s: a truncated page without a continuation token", pattern);
  }
  free(page);
  if (!r && !n)
    r = dl__fail(-ENOENT, "source %s: no object matches", pattern);
  if (r) {
    for (size_t i = 0; i < n; i++)
      free(v[i]);
    free(v);
    return r;
  }
  *out = v;
  *count = n;
  return 0;
}
