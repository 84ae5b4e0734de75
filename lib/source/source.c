/* Turns a source spec into the sample table: "::" lists, brace ranges, globs, folders. */
#include "source/source.h"

#include <errno.h>
#include <glob.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

#define MAX_GROUPS 64 /* of braces in one pattern; each is a level of expand_into */
#define PATH_CAP 4096

/* Parses "{a..b}" (zero-padded numbers, as WebDataset writes them) or "{x,y,z}". DL_ELIMIT, with
 * no message, past DL__MAX_PATHS paths: the caller names the pattern. */
static int expand_into(const char *pat, strlist *out) {
  const char *open = strchr(pat, '{');
  if (!open)
    return out->n >= DL__MAX_PATHS ? DL_ELIMIT : push(out, strdup(pat));
  const char *close = strchr(open, '}');
  if (!close)
    return dl__fail(DL_EOPTION, "source '%s': '{' without '}'", pat);
  size_t pre = (size_t)(open - pat);
  const char *body = open + 1;
  size_t blen = (size_t)(close - body);
  /* Each piece would end at the inner '}', and the pieces around it could meet into a range no
   * count made beforehand ("{1,.2{.}.99999}" twice: ten billion paths). */
  if (memchr(body, '{', blen))
    return dl__fail(DL_EOPTION, "source '%s': braces inside {%.*s}: nested braces are not supported", pat,
                    (int)blen, body);
  const char *dots = strstr(body, "..");
  bool range = dots && dots < close;
  long long a = 0, b = 0;
  int width = 0;
  if (range) {
    char *end;
    errno = 0;
    a = strtoll(body, &end, 10);
    if (end != dots || end == body || errno) /* both ends are numbers: "{..3}" is no range from 0 */
      return dl__fail(DL_EOPTION, "source '%s': bad range {%.*s}", pat, (int)blen, body);
    b = strtoll(dots + 2, &end, 10);
    if (end != close || end == dots + 2 || errno || b < a ||
        (uint64_t)b - (uint64_t)a > 10000000) /* no signed overflow */
      return dl__fail(DL_EOPTION, "source '%s': bad range {%.*s}", pat, (int)blen, body);
    width = (int)(dots - body);
  }
  /* On the heap: a level per group, each with a path, on whatever stack the caller's thread has. */
  char *buf = malloc(PATH_CAP);
  if (!buf)
    return -ENOMEM;
  int r = 0;
  if (range) {
    for (long long i = a; i <= b && !r; i++) {
      int n = snprintf(buf, PATH_CAP, "%.*s%0*lld%s", (int)pre, pat, width, i, close + 1);
      r = n < 0 || n >= PATH_CAP ? dl__fail(DL_EOPTION, "source '%s': path too long", pat) : expand_into(buf, out);
    }
  } else {
    for (const char *p = body; p <= close && !r;) {
      const char *comma = memchr(p, ',', (size_t)(close - p));
      const char *end = comma ? comma : close;
      int n = snprintf(buf, PATH_CAP, "%.*s%.*s%s", (int)pre, pat, (int)(end - p), p, close + 1);
      r = n < 0 || n >= PATH_CAP ? dl__fail(DL_EOPTION, "source '%s': path too long", pat) : expand_into(buf, out);
      p = end + 1;
    }
  }
  free(buf);
  return r;
}

int dl__expand_braces(const char *pattern, char ***out, size_t *count) {
  int groups = 0;
  for (const char *p = strchr(pattern, '{'); p; p = strchr(p + 1, '{'))
    groups++;
  if (groups > MAX_GROUPS) /* 1,300 of them overflowed a thread's stack of 256 KiB */
    return dl__fail(DL_EOPTION, "source '%.200s%s': %d groups of braces, more than the %d allowed", pattern,
                    strlen(pattern) > 200 ? "..." : "", groups, MAX_GROUPS);
  strlist l = {0};
  int r = expand_into(pattern, &l);
  if (r) {
    strlist_free(&l);
    if (r == DL_ELIMIT)
      return dl__fail(DL_ELIMIT, "source '%s' expands to more than %d paths", pattern, DL__MAX_PATHS);
    return r == -ENOMEM ? dl__fail(r, "out of memory expanding '%s'", pattern) : r;
  }
  *out = l.v;
  *count = l.n;
  return 0;
}

/* The first bytes of PATH, by which its format is known: *GOT of them (at most CAP), or a negative
 * code when PATH cannot be read (a file that fails to open is not taken for a tar). */
static int read_head(const char *path, uint8_t *head, size_t cap, size_t *got) {
  struct stat st;
  int fd = dl__open_regular(path, "source", &st);
  if (fd < 0)
    return fd;
  int64_t n = dl__pread_full(fd, head, cap, 0);
  close(fd);
  if (n < 0)
    return dl__fail((int)n, "source %s: %s", path, strerror((int)-n));
  if (n < (st.st_size < (off_t)cap ? st.st_size : (off_t)cap))
    return dl__fail(DL_ECORRUPT, "source %s: the file ends at offset %lld, before its size %lld (truncated meanwhile)",
                    path, (long long)n, (long long)st.st_size);
  *got = (size_t)n;
  return 0;
}

/* Whether PATH begins as a URL does (scheme://) or as WebDataset's command sources (pipe:). */
static bool foreign_scheme(const char *path) {
  size_t n = strspn(path, "abcdefghijklmnopqrstuvwxyz0123456789+.-");
  return n && (!strncmp(path + n, "://", 3) || !strncmp(path, "pipe:", 5));
}

/* *F: the format of local PATH (ST its stat), by its name, else by its first bytes. */
static int format_of_local(const char *path, const struct stat *st, const dl__format **f) {
  if ((*f = dl__format_of(path, st, NULL, 0)))
    return 0;
  uint8_t head[512]; /* a tar header's */
  size_t n = 0;
  int r = read_head(path, head, sizeof head, &n);
  if (!r)
    *f = dl__format_of(path, st, head, n);
  return r;
}

static int load_path(dl__dataset *ds, const char *path, const dl__options *o) {
  /* The shards' own indexes, saved beside them, which a glob over their folder matches (or the
   * shell's, or Python's, before the list reaches us): no samples, and nothing wrong. */
  bool said = ds->skipped_shard[0]; /* else the index says what "no samples" tells */
  if (dl__is_index_file(path, said ? NULL : ds->skipped_shard, sizeof ds->skipped_shard))
    return 0;
  struct stat st;
  if (stat(path, &st)) {
    int e = errno;
    if (foreign_scheme(path)) /* not a local file: say what is read instead */
      return dl__fail(DL_EUNSUPPORTED, "source %s: %s", path,
                      !strncmp(path, "pipe:", 5)
                          ? "a command source (WebDataset's pipe:) is not run: give the URL or path it reads"
                          : "only http://, https://, s3:// and hf:// URLs are read (and local paths)");
    return dl__fail(-e, "source %s: %s", path, strerror(e));
  }
  const dl__format *f;
  int r = format_of_local(path, &st, &f);
  return r ? r : f->open(ds, path, o);
}

/* The next "::" that separates sources, or NULL; one inside the brackets of a URL's host is an
 * IPv6 address's (http://[::1]:8080/shard.tar, http://user@[::1]/). */
const char *dl__next_separator(const char *s) {
  bool host = false;
  for (const char *p = s; *p; p++) {
    if (*p == '[' && ((p - s >= 3 && !strncmp(p - 3, "://", 3)) || (p > s && p[-1] == '@')))
      host = true;
    else if (*p == ']')
      host = false;
    else if (!host && p[0] == ':' && p[1] == ':')
      return p;
  }
  return NULL;
}

/* What follows the host of URL: brackets before it hold an IPv6 address, not a pattern. */
static const char *url_path(const char *url) {
  const char *host = strstr(url, "://");
  const char *slash = host ? strchr(host + 3, '/') : NULL;
  return slash ? slash : "";
}

/* A local name with glob characters that exists as written ("data[1]/") is that name, not a
 * pattern. */
bool dl__is_pattern(const char *path) {
  struct stat st;
  return strpbrk(path, "*?[") && stat(path, &st) != 0;
}

/* A local path written as a URL (fsspec, Streaming) is the path. */
void dl__strip_file_scheme(char *path) {
  if (!strncmp(path, "file://", 7))
    memmove(path, path + 7, strlen(path + 7) + 1);
}

int dl__source_paths(const char *source, char ***out, size_t *n) {
  strlist l = {0};
  int r = 0;
  for (const char *p = source; p && !r;) {
    const char *sep = dl__next_separator(p);
    char *part = strndup(p, sep ? (size_t)(sep - p) : strlen(p)), **braced = NULL;
    size_t nb = 0;
    r = !part ? dl__fail(-ENOMEM, "out of memory") : *part ? dl__expand_braces(part, &braced, &nb) : 0;
    for (size_t i = 0; i < nb; i++) {
      dl__strip_file_scheme(braced[i]);
      glob_t g;
      if (r) {
        free(braced[i]);
      } else if (dl__is_url(braced[i]) || !dl__is_pattern(braced[i]) || glob(braced[i], 0, NULL, &g)) {
        r = push(&l, braced[i]); /* which frees it where it cannot keep it */
      } else {
        for (size_t j = 0; j < g.gl_pathc && !r; j++)
          r = push(&l, strdup(g.gl_pathv[j]));
        globfree(&g);
        free(braced[i]);
      }
    }
    free(braced);
    free(part);
    p = sep ? sep + 2 : NULL;
  }
  if (r) {
    strlist_free(&l);
    return r == -ENOMEM ? dl__fail(r, "out of memory expanding source %s", source) : r;
  }
  *out = l.v;
  *n = l.n;
  return 0;
}

static int load_part(dl__dataset *ds, const char *part, const dl__options *o) {
  char **paths = NULL;
  size_t n = 0;
  int r = dl__expand_braces(part, &paths, &n);
  if (r)
    return r;
  for (size_t i = 0; i < n && !r; i++) {
    dl__strip_file_scheme(paths[i]);
    bool listable = !strncmp(paths[i], "s3://", 5) || !strncmp(paths[i], "hf://", 5);
    if (listable && strpbrk(paths[i], "*?[")) {
      char **keys = NULL;
      size_t nkeys = 0;
      r = dl__remote_list(ds, paths[i], o, &keys, &nkeys);
      for (size_t k = 0; k < nkeys; k++) {
        if (!r)
          r = dl__remote_load(ds, keys[k], o);
        free(keys[k]);
      }
      free(keys);
    } else if (dl__is_url(paths[i])) {
      r = !strpbrk(url_path(paths[i]), "*[")
              ? dl__remote_load(ds, paths[i], o)
              : dl__fail(DL_EOPTION, "source %s: an HTTP server cannot be listed: give shards by name or brace range",
                         paths[i]);
    } else if (dl__is_pattern(paths[i])) {
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

/* Where the part just loaded ends in the sample table (for repeat=). */
static int note_part_end(dl__dataset *ds) {
  int64_t *grown = realloc(ds->part_first, (ds->nparts + 2) * sizeof *grown);
  if (!grown)
    return dl__fail(-ENOMEM, "out of memory");
  ds->part_first = grown;
  if (!ds->nparts)
    grown[0] = 0;
  grown[++ds->nparts] = (int64_t)ds->n;
  return 0;
}

typedef struct file_key {
  uint64_t key;      /* a hash of dev and ino, or of the path or URL */
  uint64_t dev, ino; /* of a file open on disk, else 0 */
  uint32_t file;
} file_key;

static int by_key(const void *a, const void *b) {
  const file_key *x = a, *y = b;
  return (x->key > y->key) - (x->key < y->key);
}

/* Whether the files of keys A and B are one: the same file on disk, or the same path or URL. */
static bool same_file(const dl__dataset *ds, const file_key *a, const file_key *b) {
  if (a->ino || b->ino)
    return a->dev == b->dev && a->ino == b->ino;
  return !strcmp(ds->files[a->file], ds->files[b->file]);
}

/* A shard named twice (a list, braces or globs that overlap) gives its samples twice an epoch:
 * allowed, but said, since it is mostly a slip (repeat= weighs a part without listing it again). */
static void name_repeated_files(const dl__dataset *ds) {
  if (ds->nfiles < 2)
    return;
  file_key *k = malloc(ds->nfiles * sizeof *k);
  if (!k)
    return; /* only a warning is lost */
  for (uint32_t i = 0; i < ds->nfiles; i++) {
    struct stat st; /* an unnamed copy (of a compressed shard) goes by the shard's name */
    bool on_disk = ds->fds[i] >= 0 && !fstat(ds->fds[i], &st) && st.st_nlink > 0;
    k[i] = (file_key){.dev = on_disk ? (uint64_t)st.st_dev : 0, .ino = on_disk ? (uint64_t)st.st_ino : 0,
                      .file = i};
    k[i].key = on_disk ? dl__hash3(k[i].dev, k[i].ino, 0)
                       : dl__rfs_checksum(ds->files[i], strlen(ds->files[i]));
  }
  qsort(k, ds->nfiles, sizeof *k, by_key);
  uint32_t repeats = 0, first = 0, again = 0; /* files named again; the first such, and its second name */
  bool in_run = false;
  for (uint32_t i = 1; i < ds->nfiles; i++) {
    bool same = k[i].key == k[i - 1].key && same_file(ds, &k[i - 1], &k[i]);
    if (same && !in_run && !repeats++) {
      first = k[i - 1].file < k[i].file ? k[i - 1].file : k[i].file;
      again = k[i - 1].file < k[i].file ? k[i].file : k[i - 1].file;
    }
    in_run = same;
  }
  free(k);
  if (!repeats)
    return;
  bool spelt_apart = strcmp(ds->files[first], ds->files[again]) != 0;
  dl__log(DL__LOG_WARN, "source: %s is named more than once%s%s%s, so its samples come as many times an "
          "epoch (%u file%s named again); to weigh a part of the source, name it once and give repeat=",
          ds->files[first], spelt_apart ? " (also as " : "", spelt_apart ? ds->files[again] : "",
          spelt_apart ? ")" : "", repeats, repeats == 1 ? "" : "s");
}

/* ---- indexes made ahead ---- */

typedef struct ahead {
  char **paths;
  size_t n, first; /* FIRST: where this rank begins, so that the host's ranks begin apart */
  atomic_size_t next, scanned;
  const dl__options *o;
} ahead;

static void *index_ahead_run(void *arg) {
  ahead *a = arg;
  for (size_t i; (i = atomic_fetch_add(&a->next, 1)) < a->n;) {
    const char *path = a->paths[(a->first + i) % a->n];
    struct stat st;
    const dl__format *f;
    if (!dl__is_url(path) && !dl__is_index_file(path, NULL, 0) && !stat(path, &st) && S_ISREG(st.st_mode) &&
        !format_of_local(path, &st, &f) && f == &dl__tar_format && dl__tar_index_ahead(path, a->o))
      atomic_fetch_add(&a->scanned, 1);
  }
  return NULL;
}

/* The local tars of SOURCE without an index file get one first, several shards at once: a tar's
 * headers lie between its members, so its scan reads it whole where it is not cached and reads
 * from header to header where it is; a first open of many shards on one thread would scan them
 * one after another. The load that follows reads those indexes, and says what their scans found
 * only where it scans again (a shard with something to say). URLs are left to their load, and a
 * source that does not expand to its message there.
 * The ranks of a host (torchrun's LOCAL_WORLD_SIZE) open the same shards at once: each takes its
 * share of the CPUs, and begins at its own part of the list, so that a shard another rank has
 * indexed meanwhile is found current and skipped, and one it scans at the moment (under the shard's
 * flock) left to it, not scanned once a rank. With one CPU a rank, its scans run here, on the
 * opening thread, for that head start. */
static void index_ahead(const char *source, const dl__options *o) {
  ahead a = {.o = o};
  if (dl__source_paths(source, &a.paths, &a.n))
    return;
  a.first = a.n * (size_t)o->host_rank / (size_t)o->host_ranks;
  double t0 = dl__now();
  cpu_set_t cpus;
  int threads = sched_getaffinity(0, sizeof cpus, &cpus) ? 1 : CPU_COUNT(&cpus) / o->host_ranks;
  threads = threads > 8 ? 8 : threads < 1 ? 1 : threads;
  threads = (size_t)threads > a.n ? (int)a.n : threads;
  if (threads == 1 && o->host_ranks > 1)
    index_ahead_run(&a);
  else if (threads > 1) {
    pthread_t t[8];
    int started = 0;
    while (started < threads && !pthread_create(&t[started], NULL, index_ahead_run, &a))
      started++;
    while (started--)
      pthread_join(t[started], NULL);
  }
  size_t scanned = atomic_load(&a.scanned);
  if (scanned) { /* the line says where this rank began, where ranks share the scan */
    char rank[PATH_MAX + 80] = "";
    if (o->host_ranks > 1)
      snprintf(rank, sizeof rank, ", beginning with %s (LOCAL_RANK=%d of LOCAL_WORLD_SIZE=%d)",
               a.paths[a.first], o->host_rank, o->host_ranks);
    dl__log(DL__LOG_DEBUG, "source: %zu of %zu shards indexed ahead in %.1f ms on %d thread%s%s", scanned, a.n,
            (dl__now() - t0) * 1e3, threads, threads == 1 ? "" : "s", rank);
  }
  for (size_t i = 0; i < a.n; i++)
    free(a.paths[i]);
  free(a.paths);
}

int dl__source_load(dl__dataset *ds, const char *source, const dl__options *o) {
  if (!source || !*source)
    return dl__fail(DL_EOPTION, "no source given");
  if (!strncmp(source, "tokens:", 7)) {
    if (!o->token_dtype || !o->seq_len)
      return dl__fail(DL_EOPTION, "source %s: a token source needs dtype=uint16|uint32 and seq_len=L", source);
    int r = dl__tokens_load(ds, source + 7, o->token_dtype == DL__DTYPE_UINT16 ? 2 : 4, o->seq_len);
    if (!r)
      name_repeated_files(ds);
    return r;
  }
  index_ahead(source, o);
  const char *p = source;
  for (;;) {
    const char *sep = dl__next_separator(p);
    size_t n = sep ? (size_t)(sep - p) : strlen(p);
    char *part = strndup(p, n);
    if (!part)
      return dl__fail(-ENOMEM, "out of memory");
    int r = n ? load_part(ds, part, o) : 0;
    free(part);
    if (!r && n && (r = note_part_end(ds)))
      return r;
    if (r)
      return r;
    if (!sep)
      break;
    p = sep + 2;
  }
  if (ds->n == 0)
    return dl__fail(DL_ENOSAMPLES, "source %s: no samples found%s%s", source, ds->skipped_shard[0] ? "; " : "",
                    ds->skipped_shard);
  if (ds->class_samples != ds->n) /* samples of other kinds, whose labels the folders' names do not name */
    ds->classes_differ = true;
  name_repeated_files(ds);
  /* Said where it costs: at info level each shard says it; past a few seconds, once, louder. */
  if (ds->unpacked_temp_s >= 5)
    dl__log(DL__LOG_WARN, "%u compressed shards were decompressed into temporary copies (%.1f GB) in %.0f s, as at "
            "every open: cache_dir= keeps the copies for later opens", ds->unpacked_temp,
            (double)ds->unpacked_temp_bytes / 1e9, ds->unpacked_temp_s);
  return 0;
}
