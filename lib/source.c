/* Turns a source spec into the sample table: "::" lists, brace ranges, globs, folders. */
#include "internal.h"

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct strlist {
  char **v;
  size_t n, cap;
} strlist;

static int push(strlist *l, char *s) {
  if (!s)
    return -ENOMEM;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    char **v = realloc(l->v, cap * sizeof *v);
    if (!v) {
      free(s);
      return -ENOMEM;
    }
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = s;
  return 0;
}

static void strlist_free(strlist *l) {
  for (size_t i = 0; i < l->n; i++)
    free(l->v[i]);
  free(l->v);
}

/* Parses "{a..b}" (zero-padded numbers, as WebDataset writes them) or "{x,y,z}". */
static int expand_into(const char *pat, strlist *out) {
  const char *open = strchr(pat, '{');
  if (!open)
    return push(out, strdup(pat));
  const char *close = strchr(open, '}');
  if (!close)
    return dl__fail(DL_EOPTION, "source '%s': '{' without '}'", pat);
  size_t pre = (size_t)(open - pat);
  const char *body = open + 1;
  size_t blen = (size_t)(close - body);
  const char *dots = strstr(body, "..");
  char buf[4096];
  if (dots && dots < close) {
    char *end;
    errno = 0;
    long long a = strtoll(body, &end, 10);
    if (end != dots || errno)
      return dl__fail(DL_EOPTION, "source '%s': bad range {%.*s}", pat, (int)blen, body);
    long long b = strtoll(dots + 2, &end, 10);
    if (end != close || errno || b < a || b - a > 10000000)
      return dl__fail(DL_EOPTION, "source '%s': bad range {%.*s}", pat, (int)blen, body);
    int width = (int)(dots - body);
    for (long long i = a; i <= b; i++) {
      int n = snprintf(buf, sizeof buf, "%.*s%0*lld%s", (int)pre, pat, width, i, close + 1);
      if (n < 0 || (size_t)n >= sizeof buf)
        return dl__fail(DL_EOPTION, "source '%s': path too long", pat);
      int r = expand_into(buf, out);
      if (r)
        return r;
    }
    return 0;
  }
  const char *p = body;
  while (p <= close) {
    const char *comma = memchr(p, ',', (size_t)(close - p));
    const char *end = comma ? comma : close;
    int n = snprintf(buf, sizeof buf, "%.*s%.*s%s", (int)pre, pat, (int)(end - p), p, close + 1);
    if (n < 0 || (size_t)n >= sizeof buf)
      return dl__fail(DL_EOPTION, "source '%s': path too long", pat);
    int r = expand_into(buf, out);
    if (r)
      return r;
    p = end + 1;
  }
  return 0;
}

int dl__expand_braces(const char *pattern, char ***out, size_t *count) {
  strlist l = {0};
  int r = expand_into(pattern, &l);
  if (r) {
    strlist_free(&l);
    return r == -ENOMEM ? dl__fail(r, "out of memory expanding '%s'", pattern) : r;
  }
  *out = l.v;
  *count = l.n;
  return 0;
}

static bool is_rfs(const char *path) {
  char magic[8] = {0};
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(magic, 1, sizeof magic, f) : 0;
  if (f)
    fclose(f);
  return n == 8 && !memcmp(magic, "RFSHARD1", 8);
}

static int load_path(dl__dataset *ds, const char *path, const dl__options *o) {
  struct stat st;
  if (stat(path, &st))
    return dl__fail(-errno, "source %s: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode))
    return dl__folder_load(ds, path);
  if (is_rfs(path))
    return dl__rfs_load(ds, path, o->direct);
  return dl__tar_load(ds, path, o->on_error);
}

static int load_part(dl__dataset *ds, const char *part, const dl__options *o) {
  char **paths = NULL;
  size_t n = 0;
  int r = dl__expand_braces(part, &paths, &n);
  if (r)
    return r;
  for (size_t i = 0; i < n && !r; i++) {
    if (strpbrk(paths[i], "*?[")) {
      glob_t g;
      int gr = glob(paths[i], 0, NULL, &g);
      if (gr == GLOB_NOMATCH)
        r = dl__fail(-ENOENT, "source %s: no file matches", paths[i]);
      else if (gr)
        r = dl__fail(-EIO, "source %s: glob failed", paths[i]);
      for (size_t j = 0; !r && gr == 0 && j < g.gl_pathc; j++)
        r = load_path(ds, g.gl_pathv[j], o);
      if (gr == 0)
        globfree(&g);
    } else {
      r = load_path(ds, paths[i], o);
    }
  }
  for (size_t i = 0; i < n; i++)
    free(paths[i]);
  free(paths);
  return r;
}

int dl__source_load(dl__dataset *ds, const char *source, const dl__options *o) {
  if (!source || !*source)
    return dl__fail(DL_EOPTION, "no source given");
  const char *p = source;
  for (;;) {
    const char *sep = strstr(p, "::");
    size_t n = sep ? (size_t)(sep - p) : strlen(p);
    char *part = strndup(p, n);
    if (!part)
      return dl__fail(-ENOMEM, "out of memory");
    int r = n ? load_part(ds, part, o) : 0;
    free(part);
    if (r)
      return r;
    if (!sep)
      break;
    p = sep + 2;
  }
  if (ds->n == 0)
    return dl__fail(DL_ENOSAMPLES, "source %s: no samples found", source);
  return 0;
}
