/*
 * The Hugging Face Hub: hf:// URLs, and the token that gated and private repositories ask for.
 * hf://datasets/ORG/NAME[@REVISION]/PATH (hf://ORG/NAME/... for a model's files, hf://spaces/...
 * for a space's, as huggingface_hub's HfFileSystem writes them) is read from
 * ENDPOINT/datasets/ORG/NAME/resolve/REVISION/PATH, REVISION main unless given. ENDPOINT is
 * HF_ENDPOINT, else https://huggingface.co. Every request to the endpoint (hf:// URLs, and the
 * Hub's own https:// URLs given as they are) carries "Authorization: Bearer TOKEN" when there is
 * a token where huggingface_hub looks for one: HF_TOKEN (or the older HUGGING_FACE_HUB_TOKEN),
 * else the file HF_TOKEN_PATH, else HF_HOME/token (HF_HOME: $XDG_CACHE_HOME/huggingface, or
 * ~/.cache/huggingface). libcurl does not send it on to another host a redirect names (the Hub's
 * file storage, reached by a signed URL of its own).
 */
#include "remote/remote.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

/* The token file's first line, without the spaces around it, into OUT ("" when there is none). */
static void read_token_file(const char *path, char *out, size_t cap) {
  out[0] = 0;
  FILE *f = fopen(path, "re");
  if (!f)
    return;
  if (!fgets(out, (int)cap, f))
    out[0] = 0;
  fclose(f);
}

static void trim(char *s) {
  size_t start = strspn(s, " \t\r\n"), n = strlen(s);
  while (n > start && strchr(" \t\r\n", s[n - 1]))
    n--;
  memmove(s, s + start, n - start);
  s[n - start] = 0;
}

static void find_token(char *out, size_t cap) {
  const char *v = env("HF_TOKEN") ? env("HF_TOKEN") : env("HUGGING_FACE_HUB_TOKEN");
  if (v) {
    snprintf(out, cap, "%s", v);
  } else {
    char path[4096];
    if (env("HF_TOKEN_PATH"))
      snprintf(path, sizeof path, "%s", env("HF_TOKEN_PATH"));
    else if (env("HF_HOME"))
      snprintf(path, sizeof path, "%s/token", env("HF_HOME"));
    else if (env("XDG_CACHE_HOME"))
      snprintf(path, sizeof path, "%s/huggingface/token", env("XDG_CACHE_HOME"));
    else
      snprintf(path, sizeof path, "%s/.cache/huggingface/token", env("HOME") ? env("HOME") : "");
    read_token_file(path, out, cap);
  }
  trim(out);
}

int dl__hub_open(dl__hub **out) {
  dl__hub *h = calloc(1, sizeof *h);
  if (!h)
    return dl__fail(-ENOMEM, "out of memory");
  snprintf(h->endpoint, sizeof h->endpoint, "%s", env("HF_ENDPOINT") ? env("HF_ENDPOINT") : "https://huggingface.co");
  size_t n = strlen(h->endpoint);
  while (n && h->endpoint[n - 1] == '/')
    h->endpoint[--n] = 0;
  char token[1024], line[1100];
  find_token(token, sizeof token);
  if (token[0]) {
    snprintf(line, sizeof line, "Authorization: Bearer %s", token);
    h->auth = curl_slist_append(NULL, line);
    memset(line, 0, sizeof line);
    memset(token, 0, sizeof token);
    if (!h->auth) {
      free(h);
      return dl__fail(-ENOMEM, "out of memory");
    }
  }
  *out = h;
  return 0;
}

void dl__hub_free(dl__hub *h) {
  if (!h)
    return;
  curl_slist_free_all(h->auth);
  memset(h, 0, sizeof *h); /* the token does not outlive the loader in memory */
  free(h);
}

bool dl__hub_serves(const dl__hub *h, const char *url) {
  size_t n = strlen(h->endpoint);
  return !strncmp(url, h->endpoint, n) && (url[n] == '/' || url[n] == 0);
}

/* Appends IN to OUT at *AT, percent-encoding what a URL's path cannot hold as it is (a '%' stays:
 * a revision such as refs%2Fconvert%2Fparquet comes encoded). */
static bool append_encoded(char *out, size_t cap, size_t *at, const char *in, size_t n) {
  static const char hex[] = "0123456789ABCDEF";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)in[i];
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("-._~/%", c);
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

int dl__hub_url(const dl__hub *h, const char *hf, char *out, size_t cap) {
  const char *p = hf + 5; /* after hf:// */
  const char *kind = "";
  if (!strncmp(p, "datasets/", 9) || !strncmp(p, "spaces/", 7)) {
    kind = p[0] == 'd' ? "datasets/" : "spaces/";
    p += strlen(kind);
  }
  /* ORG/NAME[@REVISION]/PATH */
  const char *slash = strchr(p, '/');
  const char *end = slash ? strchr(slash + 1, '/') : NULL;
  if (!slash || slash == p || !end || end == slash + 1 || !end[1])
    return dl__fail(DL_EOPTION, "source %s: a Hugging Face URL is hf://datasets/ORG/NAME[@REVISION]/PATH", hf);
  const char *at_rev = memchr(slash + 1, '@', (size_t)(end - slash - 1));
  const char *name_end = at_rev ? at_rev : end;
  size_t len = (size_t)snprintf(out, cap, "%s/%s%.*s/resolve/", h->endpoint, kind, (int)(name_end - p), p);
  bool fits = len < cap;
  if (fits && at_rev && at_rev + 1 < end)
    fits = append_encoded(out, cap, &len, at_rev + 1, (size_t)(end - at_rev - 1));
  else if (fits)
    fits = append_encoded(out, cap, &len, "main", 4);
  if (fits)
    fits = append_encoded(out, cap, &len, end, strlen(end));
  return fits ? 0 : dl__fail(DL_ELIMIT, "source %s: the URL is too long", hf);
}

int dl__hub_explain(int rc, const dl__hub *h) {
  if (rc != -EACCES)
    return rc;
  char said[DL__MSG_MAX];
  snprintf(said, sizeof said, "%s", dl_last_error());
  return dl__fail(rc, "%s; %s", said,
                  h->auth ? "the Hub refused the token (HF_TOKEN, or huggingface-cli login's) or it has no access "
                            "to this repository: a gated one needs its terms accepted on the Hub"
                          : "a gated or private repository needs a token: set HF_TOKEN, or log in with "
                            "huggingface-cli login");
}
