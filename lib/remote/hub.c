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
#include <fnmatch.h>
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

/* Appends IN to OUT at *AT as a URL's path holds it: a '%' stays, for a revision such as
 * refs%2Fconvert%2Fparquet comes encoded. */
static bool append_encoded(char *out, size_t cap, size_t *at, const char *in, size_t n) {
  return dl__url_encode(out, cap, at, in, n, "/%");
}

/* The parts of hf://[datasets/|spaces/]ORG/NAME[@REVISION]/PATH. */
typedef struct hf_parts {
  const char *kind; /* "datasets", "spaces" or "models" */
  const char *repo; /* ORG/NAME */
  int repo_len;
  const char *rev; /* REVISION, or "main" */
  size_t rev_len;
  const char *path; /* PATH, after ORG/NAME[@REVISION]/ */
} hf_parts;

static int split_hf(const char *hf, hf_parts *x) {
  const char *p = hf + 5; /* after hf:// */
  x->kind = "models";
  if (!strncmp(p, "datasets/", 9) || !strncmp(p, "spaces/", 7)) {
    x->kind = p[0] == 'd' ? "datasets" : "spaces";
    p += strlen(x->kind) + 1;
  }
  const char *slash = strchr(p, '/');
  const char *end = slash ? strchr(slash + 1, '/') : NULL;
  if (!slash || slash == p || !end || end == slash + 1 || !end[1])
    return dl__fail(DL_EOPTION, "source %s: a Hugging Face URL is hf://datasets/ORG/NAME[@REVISION]/PATH", hf);
  const char *at = memchr(slash + 1, '@', (size_t)(end - slash - 1));
  x->repo = p;
  x->repo_len = (int)((at ? at : end) - p);
  x->rev = at && at + 1 < end ? at + 1 : "main";
  x->rev_len = at && at + 1 < end ? (size_t)(end - at - 1) : 4;
  x->path = end + 1;
  return 0;
}

int dl__hub_url(const dl__hub *h, const char *hf, char *out, size_t cap) {
  hf_parts x;
  if (split_hf(hf, &x))
    return -1;
  /* ENDPOINT/[datasets/|spaces/]ORG/NAME/resolve/REVISION/PATH: a model's files have no prefix */
  bool model = !strcmp(x.kind, "models");
  size_t len = (size_t)snprintf(out, cap, "%s/%s%s%.*s/resolve/", h->endpoint, model ? "" : x.kind, model ? "" : "/",
                                x.repo_len, x.repo);
  bool fits = len < cap && append_encoded(out, cap, &len, x.rev, x.rev_len) &&
              append_encoded(out, cap, &len, "/", 1) && append_encoded(out, cap, &len, x.path, strlen(x.path));
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

/* ---- listing a folder of a repository (the Hub's tree API, pages of JSON) ---- */

int dl__hub_tree_files(const char *p, const char *end, int (*on_file)(const char *path, void *arg), void *arg) {
  char key[16], value[1100], type[16], path[1100];
  p = dl__json_space(p, end);
  if (p >= end || *p++ != '[')
    return -1;
  int more, member;
  while ((more = dl__json_element(&p, end)) == 1) {
    if (*p++ != '{')
      return -1;
    type[0] = path[0] = 0;
    while ((member = dl__json_member(&p, end, key, sizeof key)) == 1) {
      bool wanted = !strcmp(key, "type") || !strcmp(key, "path");
      p = wanted && *p == '"' ? dl__json_string(p, end, value, sizeof value) : dl__json_skip(p, end);
      if (!p)
        return -1;
      if (wanted)
        snprintf(!strcmp(key, "type") ? type : path, !strcmp(key, "type") ? sizeof type : sizeof path, "%s", value);
    }
    if (member < 0)
      return -1;
    int r = !strcmp(type, "file") && path[0] ? on_file(path, arg) : 0;
    if (r)
      return r;
  }
  return more < 0 ? -1 : 0;
}

typedef struct listing {
  const char *pattern; /* the hf:// pattern, for messages */
  const char *base;    /* hf://KIND/ORG/NAME[@REV]/: what each match is named after */
  size_t base_len;
  const char *folder; /* DIR/ (or "") and the file name's pattern after it */
  size_t folder_len;
  const char *glob;
  char **v;
  size_t n, cap;
} listing;

static int add_match(const char *path, void *arg) {
  listing *ls = arg;
  if (strncmp(path, ls->folder, ls->folder_len) || fnmatch(ls->glob, path + ls->folder_len, FNM_PATHNAME))
    return 0;
  if (ls->n == DL__MAX_PATHS)
    return dl__fail(DL_ELIMIT, "listing %s: more than %d files match", ls->pattern, DL__MAX_PATHS);
  if (ls->n == ls->cap) {
    size_t cap = ls->cap ? 2 * ls->cap : 64;
    char **grown = realloc(ls->v, cap * sizeof *grown);
    if (!grown)
      return dl__fail(-ENOMEM, "out of memory listing %s", ls->pattern);
    ls->v = grown;
    ls->cap = cap;
  }
  size_t need = ls->base_len + strlen(path) + 1;
  if (!(ls->v[ls->n] = malloc(need)))
    return dl__fail(-ENOMEM, "out of memory listing %s", ls->pattern);
  snprintf(ls->v[ls->n++], need, "%.*s%s", (int)ls->base_len, ls->base, path);
  return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int dl__hub_list(const dl__options *o, const dl__hub *h, const char *pattern, char ***out, size_t *count) {
  hf_parts x;
  if (split_hf(pattern, &x))
    return -1;
  const char *glob = strrchr(x.path, '/') ? strrchr(x.path, '/') + 1 : x.path;
  if (strcspn(x.repo, "*?[") < (size_t)(glob - x.repo))
    return dl__fail(DL_EOPTION, "source %s: on the Hub, wildcards go in the file name only (not in the repository "
                    "or its folders)", pattern);
  listing ls = {.pattern = pattern, .base = pattern, .base_len = (size_t)(x.path - pattern), .folder = x.path,
                .folder_len = (size_t)(glob - x.path), .glob = glob};
  /* ENDPOINT/api/KIND/ORG/NAME/tree/REVISION[/DIR, its slashes encoded], as huggingface_hub asks */
  char url[8192], next[4096];
  size_t len = (size_t)snprintf(url, sizeof url, "%s/api/%s/%.*s/tree/", h->endpoint, x.kind, x.repo_len, x.repo);
  bool fits = len < sizeof url && append_encoded(url, sizeof url, &len, x.rev, x.rev_len);
  if (fits && ls.folder_len > 1) {
    fits = append_encoded(url, sizeof url, &len, "/", 1);
    for (size_t i = 0; fits && i + 1 < ls.folder_len; i++)
      fits = ls.folder[i] == '/' ? append_encoded(url, sizeof url, &len, "%2F", 3)
                                 : append_encoded(url, sizeof url, &len, ls.folder + i, 1);
  }
  if (!fits)
    return dl__fail(DL_ELIMIT, "source %s: the URL is too long", pattern);
  size_t cap = 8u << 20; /* a page holds 1,000 entries, each with its path and hashes */
  uint8_t *page = malloc(cap);
  if (!page)
    return dl__fail(-ENOMEM, "out of memory");
  int r = 0;
  for (int pages = 0; !r && url[0]; pages++) {
    dl__target t = {pattern, url, NULL, h->auth};
    size_t got = 0;
    if ((r = dl__http_get_page(o, &t, page, cap, &got, next, sizeof next))) {
      r = r == -EACCES ? dl__hub_explain(r, h) : r;
      break;
    }
    int f = dl__hub_tree_files((const char *)page, (const char *)page + got, add_match, &ls);
    if (f == -1)
      r = dl__fail(DL_EREMOTE, "listing %s: the Hub's answer is not a list of files (page %d)", pattern, pages + 1);
    else if (f)
      r = f;
    else if (pages >= DL__MAX_LIST_PAGES)
      r = dl__fail(DL_ELIMIT, "listing %s: more than %d pages", pattern, DL__MAX_LIST_PAGES);
    else if (!strcmp(next, url)) /* would ask for it again and again, up to the page bound */
      r = dl__fail(DL_EREMOTE, "listing %s: page %d links to itself as the next page", pattern, pages + 1);
    else if (next[0] && !dl__hub_serves(h, next)) /* the token goes to the Hub only */
      r = dl__fail(DL_EREMOTE, "listing %s: the Hub's next page is on another host", pattern);
    snprintf(url, sizeof url, "%s", next);
  }
  free(page);
  if (!r && !ls.n)
    r = dl__fail(-ENOENT, "source %s: no file matches", pattern);
  if (r) {
    for (size_t i = 0; i < ls.n; i++)
      free(ls.v[i]);
    free(ls.v);
    return r;
  }
  qsort(ls.v, ls.n, sizeof *ls.v, by_name);
  *out = ls.v;
  *count = ls.n;
  return 0;
}
