/*
 * dlshard: make ringfeed shards from an ImageFolder, WebDataset tars or other ringfeed shards
 * (sample order kept), build tar indexes ahead of time, verify shards, and list them.
 */
#include "cli_number.h"
#include "tools.h"
#include "file_digest.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage:\n"
          "  dlshard create OUT_PREFIX INPUT... [--samples-per-shard N | --shard-size SIZE]\n"
          "                 [--codec image=keep,label=index] [--align BYTES] [--threads T]\n"
          "                 [--keep-bad] [--strict]\n"
          "      INPUT: tar shards (lists, globs, {a..b}), ImageFolder roots, MDS datasets'\n"
          "      folders (MosaicML Streaming) or ringfeed shards;\n"
          "      writes OUT_PREFIX-000000.rfs ... in the inputs' sample order; an OUT_PREFIX of\n"
          "      s3://bucket/prefix/name uploads each shard once written (credentials as for the loader);\n"
          "      each sample is checked as verify checks it: a bad one is left out and named\n"
          "      (--keep-bad: kept as it is; --strict: exit 1 when there was any)\n"
          "  dlshard index SHARD...     build and cache the member index of tar shards\n"
          "  dlshard verify SHARD...    decode every image and tensor, check every checksum (and\n"
          "                             the digests an MDS index records);\n"
          "                             exits 1 naming each bad record\n"
          "  dlshard ls SHARD [-v]      records, fields, sizes and codecs (-v: every record)\n"
          "  verify and ls also take an MDS dataset's folder (or its index.json) and an ImageFolder root\n"
          "  dlshard --version\n"
          "  SHARD arguments of index and verify take brace ranges and globs, as the loader does;\n"
          "  any SHARD may be an http(s)://, s3:// or hf:// URL (globs on s3:// and hf:// only).\n");
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static int64_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  double mult = 1;
  if (!strcasecmp(end, "k") || !strcasecmp(end, "kb") || !strcasecmp(end, "kib"))
    mult = 1024;
  else if (!strcasecmp(end, "m") || !strcasecmp(end, "mb") || !strcasecmp(end, "mib"))
    mult = 1024.0 * 1024;
  else if (!strcasecmp(end, "g") || !strcasecmp(end, "gb") || !strcasecmp(end, "gib"))
    mult = 1024.0 * 1024 * 1024;
  else if (*end)
    return -1;
  return v > 0 ? (int64_t)(v * mult) : -1;
}

/* ---- create ---- */

#define MAX_NAMED 1000 /* bad samples named at the end of a create; the rest are counted */

typedef struct create_job {
  const dl_tool_source *src;
  const char *prefix; /* where shards are written */
  const char *upload; /* s3://bucket/key prefix each written shard is uploaded to (then deleted), or NULL */
  const char *writer_opts;
  size_t *bounds; /* shard s holds samples [bounds[s], bounds[s + 1]) */
  size_t nshards;
  size_t next;    /* next shard to write */
  size_t done;    /* samples written or left out */
  bool keep_bad;
  char **bad;     /* the first bad samples' reasons (MAX_NAMED), and how many there were */
  size_t nbad;
  int err;
  char errmsg[1024];
  pthread_mutex_t mu; /* over next, done and err */
  double t0;
  bool tty;
} create_job;

static int write_shard(create_job *j, size_t shard, dl_tool_scratch *t) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s-%06zu.rfs", j->prefix, shard);
  dl_writer *w;
  int r = dl_writer_open(&w, path, j->writer_opts);
  if (r)
    return r;
  size_t nclasses;
  const char *const *classes = dl_tool_source_classes(j->src, &nclasses);
  if (classes && (r = dl_writer_classes(w, classes, nclasses))) { /* every shard names them all */
    dl_writer_abort(w);
    return r;
  }
  for (size_t i = j->bounds[shard]; i < j->bounds[shard + 1] && !r; i++) {
    char why[1024];
    r = dl_tool_write_sample(j->src, i, w, t, j->keep_bad, why, sizeof why);
    pthread_mutex_lock(&j->mu);
    j->done++;
    if (r > 0 && j->bad && j->nbad < MAX_NAMED)
      j->bad[j->nbad] = strdup(why);
    j->nbad += r > 0;
    pthread_mutex_unlock(&j->mu);
    r = r > 0 ? 0 : r;
  }
  if (r) {
    dl_writer_abort(w);
    return r;
  }
  if ((r = dl_writer_close(w)) || !j->upload)
    return r;
  /* Uploaded once whole, then the local copy goes. */
  char url[PATH_MAX];
  snprintf(url, sizeof url, "%s-%06zu.rfs", j->upload, shard);
  r = dl_tool_upload(path, url);
  unlink(path);
  return r;
}

static void *create_worker(void *arg) {
  create_job *j = arg;
  dl_tool_scratch *t = dl_tool_scratch_new();
  for (;;) {
    pthread_mutex_lock(&j->mu);
    size_t shard = j->err ? j->nshards : j->next++;
    pthread_mutex_unlock(&j->mu);
    if (shard >= j->nshards)
      break;
    int r = t ? write_shard(j, shard, t) : -ENOMEM;
    if (r) {
      pthread_mutex_lock(&j->mu);
      if (!j->err) {
        j->err = r;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", t ? dl_last_error() : "out of memory");
      }
      pthread_mutex_unlock(&j->mu);
    }
  }
  dl_tool_scratch_free(t);
  return NULL;
}

static void progress(create_job *j, bool final) {
  pthread_mutex_lock(&j->mu);
  size_t done = j->done;
  pthread_mutex_unlock(&j->mu);
  double rate = done / (now() - j->t0 + 1e-9);
  size_t total = j->bounds[j->nshards];
  int width = 30, filled = total ? (int)(width * done / total) : width;
  fprintf(stderr, "\r[%.*s%*s] %zu/%zu samples, %.0f samples/s%s", filled,
          "##############################", width - filled, "", done, total, rate, final ? "\n" : "");
}

/* Shards PREFIX-N.rfs, PREFIX-N+1.rfs ... that an earlier, longer run left after the N just written:
 * a glob of the prefix would read them with the new ones, so they are named (and left: they are
 * the user's files). */
static void name_leftovers(const char *prefix, size_t n) {
  char path[PATH_MAX + 16];
  size_t last = n;
  for (; last < n + 1000000; last++) {
    snprintf(path, sizeof path, "%s-%06zu.rfs", prefix, last);
    if (access(path, F_OK))
      break;
  }
  if (last == n)
    return;
  if (last - n == 1)
    fprintf(stderr, "dlshard: 1 shard of an earlier run follows these, %s-%06zu.rfs: a glob of %s-*.rfs would read it "
            "too; delete it\n", prefix, n, prefix);
  else
    fprintf(stderr, "dlshard: %zu shards of an earlier run follow these, %s-%06zu.rfs to %s-%06zu.rfs: a glob of "
            "%s-*.rfs would read them too; delete them\n", last - n, prefix, n, prefix, last - 1, prefix);
}

static void remove_shards(const char *prefix, size_t nshards) {
  for (size_t s = 0; s < nshards; s++) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s-%06zu.rfs", prefix, s);
    unlink(path);
  }
}

/* The samples left out (or with --keep-bad kept) as the loader would skip them, named. */
static void name_bad(const create_job *j) {
  if (!j->nbad)
    return;
  bool one = j->nbad == 1;
  if (j->keep_bad)
    fprintf(stderr, "dlshard: %zu bad sample%s kept (--keep-bad); the loader will skip %s:\n", j->nbad, one ? "" : "s",
            one ? "it" : "them");
  else
    fprintf(stderr, "dlshard: %zu bad sample%s left out, as the loader would skip %s (--keep-bad keeps %s):\n",
            j->nbad, one ? "" : "s", one ? "it" : "them", one ? "it" : "them");
  for (size_t i = 0; i < j->nbad && i < MAX_NAMED; i++)
    fprintf(stderr, "  %s\n", j->bad[i] ? j->bad[i] : "(out of memory naming it)");
  if (j->nbad > MAX_NAMED)
    fprintf(stderr, "  and %zu more\n", j->nbad - MAX_NAMED);
}

static int cmd_create(int argc, char **argv) {
  static const struct option opts[] = {{"samples-per-shard", 1, 0, 'n'}, {"shard-size", 1, 0, 's'},
                                       {"codec", 1, 0, 'c'}, {"align", 1, 0, 'a'},
                                       {"threads", 1, 0, 't'}, {"keep-bad", 0, 0, 'k'},
                                       {"strict", 0, 0, 'S'}, {0, 0, 0, 0}};
  bool keep_bad = false, strict = false;
  int64_t shard_bytes = 0;
  long per_shard = 0, align = 4096, threads = sysconf(_SC_NPROCESSORS_ONLN);
  int c;
  optind = 1;
  opterr = 0; /* cli_bad_flag says it, last */
  while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    switch (c) {
    case 'n':
      if (!cli_whole_number("dlshard", "--samples-per-shard", optarg, 1, &per_shard))
        return 2;
      break;
    case 's':
      if ((shard_bytes = parse_size(optarg)) <= 0) {
        fprintf(stderr, "dlshard: --shard-size %s: expected a size above 0 (bytes, or with K, M or G)\n", optarg);
        return 2;
      }
      break;
    case 'a':
      if (!cli_whole_number("dlshard", "--align", optarg, 1, &align))
        return 2;
      break;
    case 't':
      if (!cli_whole_number("dlshard", "--threads", optarg, 1, &threads))
        return 2;
      break;
    case 'k': keep_bad = true; break;
    case 'S': strict = true; break;
    case 'c':
      /* Images are kept as they are (JPEG/PNG); labels live in the index. */
      for (char *tok = strtok(optarg, ","); tok; tok = strtok(NULL, ",")) {
        if (strcmp(tok, "image=keep") && strcmp(tok, "label=index") && strcmp(tok, "label=raw")) {
          fprintf(stderr, "dlshard: --codec %s: supported are image=keep and label=index\n", tok);
          return 2;
        }
      }
      break;
    default: return cli_bad_flag("dlshard", c, argv, optind, optopt, opts);
    }
  }
  if (per_shard && shard_bytes) {
    fprintf(stderr, "dlshard: give --samples-per-shard or --shard-size, not both\n");
    return 2;
  }
  if (argc - optind < 2) {
    usage(stderr);
    return 2;
  }
  if (!per_shard && !shard_bytes)
    per_shard = 10000;
  const char *prefix = argv[optind], *upload = NULL;
  char folder[PATH_MAX], staging[PATH_MAX] = "";
  if (dl_tool_is_url(prefix)) {
    /* Written to a temporary folder, each shard uploaded once whole. */
    const char *base = strrchr(prefix, '/');
    const char *tmp = getenv("TMPDIR");
    snprintf(staging, sizeof staging, "%s/dlshard-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (strncmp(prefix, "s3://", 5) || !base || !base[1] || !mkdtemp(staging)) {
      fprintf(stderr, "dlshard: %s: %s\n", prefix,
              strncmp(prefix, "s3://", 5) ? "uploads go to s3://bucket/prefix/name (HTTP servers take no uploads)"
              : !base || !base[1]     ? "expected s3://bucket/prefix/name"
                                      : strerror(errno));
      return 2;
    }
    upload = prefix;
    snprintf(folder, sizeof folder, "%s%s", staging, base);
    prefix = folder;
  } else {
    /* A folder as the prefix would make shards named -000000.rfs in it, or beside it. */
    size_t len = strlen(prefix);
    struct stat st;
    if (!len) {
      fprintf(stderr, "dlshard: OUT_PREFIX is empty: give the shards' folder and name, such as shards/train\n");
      return 2;
    }
    if (prefix[len - 1] == '/' || (!stat(prefix, &st) && S_ISDIR(st.st_mode))) {
      const char *sep = prefix[len - 1] == '/' ? "" : "/";
      fprintf(stderr, "dlshard: OUT_PREFIX %s is a folder: give the shards' name in it too, such as %s%strain "
              "(for %s%strain-000000.rfs ...)\n", prefix, prefix, sep, prefix, sep);
      return 2;
    }
    /* The prefix's folder is made if missing, as `mkdir -p` would. */
    snprintf(folder, sizeof folder, "%s", prefix);
    char *slash = strrchr(folder, '/');
    if (slash && slash != folder) {
      *slash = 0;
      dl_tool_mkdirs(folder);
    }
  }
  dl_tool_source *src = NULL;
  for (int i = optind + 1; i < argc; i++) {
    if (dl_tool_is_url(argv[i])) {
      fprintf(stderr, "dlshard: %s: create reads local inputs (copy remote ones first)\n", argv[i]);
      dl_tool_source_free(src);
      return 2;
    }
    int r = dl_tool_source_add(&src, argv[i], "on_error=fail");
    if (r) {
      fprintf(stderr, "dlshard: %s\n", dl_last_error());
      dl_tool_source_free(src);
      return 1;
    }
  }
  size_t count = dl_tool_source_count(src);
  size_t *bounds = malloc((count + 2) * sizeof *bounds), nshards = 0;
  if (!bounds) {
    fprintf(stderr, "dlshard: out of memory\n");
    dl_tool_source_free(src);
    return 1;
  }
  bounds[0] = 0;
  int64_t acc = 0;
  for (size_t i = 0; i < count; i++) {
    size_t in_shard = i - bounds[nshards];
    acc += (int64_t)dl_tool_sample_bytes(src, i) + (int64_t)align;
    if (in_shard > 0 && ((per_shard && (int64_t)in_shard >= per_shard) || (shard_bytes && acc > shard_bytes))) {
      bounds[++nshards] = i;
      acc = (int64_t)dl_tool_sample_bytes(src, i) + (int64_t)align;
    }
  }
  bounds[++nshards] = count;
  char wopts[64];
  snprintf(wopts, sizeof wopts, "align=%lld", (long long)align);
  create_job j = {.src = src, .prefix = prefix, .upload = upload, .writer_opts = wopts, .bounds = bounds,
                  .nshards = nshards, .t0 = now(), .tty = isatty(2), .keep_bad = keep_bad,
                  .bad = calloc(MAX_NAMED, sizeof(char *))};
  pthread_mutex_init(&j.mu, NULL);
  if (threads > (long)nshards)
    threads = (long)nshards;
  pthread_t *t = calloc((size_t)threads, sizeof *t);
  for (long i = 0; i < threads; i++)
    pthread_create(&t[i], NULL, create_worker, &j);
  if (j.tty)
    for (;;) {
      pthread_mutex_lock(&j.mu);
      bool finished = j.done >= count || j.err;
      pthread_mutex_unlock(&j.mu);
      if (finished)
        break;
      progress(&j, false);
      usleep(200000);
    }
  for (long i = 0; i < threads; i++)
    pthread_join(t[i], NULL);
  if (j.tty)
    progress(&j, true);
  double dt = now() - j.t0;
  int rc = 0;
  if (j.err) {
    fprintf(stderr, "dlshard: %s\n", j.errmsg);
    rc = 1;
  } else if (!keep_bad && j.nbad && j.nbad == count) { /* shards of no record would fail later, in the loader */
    name_bad(&j);
    if (!upload)
      remove_shards(prefix, nshards);
    fprintf(stderr, "dlshard: every sample was bad: %s\n",
            upload ? "the uploaded shards hold none (delete them)" : "no shard written");
    rc = 1;
  } else {
    size_t written = count - (keep_bad ? 0 : j.nbad);
    printf("%zu samples in %zu shard%s (%s-%06d.rfs ...), %.2f s, %.0f samples/s\n", written, nshards,
           nshards == 1 ? "" : "s", upload ? upload : prefix, 0, dt, count / (dt > 0 ? dt : 1e-9));
    if (!upload)
      name_leftovers(prefix, nshards);
    name_bad(&j);
    rc = strict && j.nbad ? 1 : 0;
  }
  for (size_t i = 0; j.bad && i < j.nbad && i < MAX_NAMED; i++)
    free(j.bad[i]);
  free(j.bad);
  if (staging[0]) { /* what a failed shard left */
    remove_shards(prefix, nshards);
    rmdir(staging);
  }
  free(t);
  free(bounds);
  pthread_mutex_destroy(&j.mu);
  dl_tool_source_free(src);
  return rc;
}

/* ---- verify ---- */

typedef struct digest_check {
  long checked, bad;
  FILE *out;
} digest_check;

/* One digest an MDS index records of FILE, against the file's bytes. A file that is not there is
 * passed over: a shard kept only compressed has no raw file, and a missing shard the load named. */
static int check_digest(const char *file, const char *algo, const char *want, void *arg) {
  digest_check *c = arg;
  int fd = dl_tool_open_regular(file, "MDS shard"); /* not a FIFO's wait for a writer */
  if (fd < 0) {
    if (fd != -ENOENT) {
      fprintf(c->out, "%s (its %s digest not checked)\n", dl_last_error(), algo);
      c->bad++;
    }
    return 0;
  }
  char hex[160];
  int rc = file_digest(fd, algo, hex, sizeof hex);
  close(fd);
  if (rc == -ENOTSUP || rc == -ENOSYS) {
    fprintf(c->out, "%s: its '%s' digest is not checked: %s\n", file, algo,
            rc == -ENOTSUP ? "no algorithm of that name is known here"
                           : "this dlshard was built without libcrypto (install libssl-dev and build again)");
    return 0;
  }
  c->checked++;
  if (rc) {
    fprintf(c->out, "%s: reading it for its %s digest failed: %s\n", file, algo, strerror(-rc));
    c->bad++;
  } else if (strcasecmp(hex, want)) {
    fprintf(c->out, "%s: %s digest %s, but the index records %s: the file is not the one the index was written "
            "with\n", file, algo, hex, want);
    c->bad++;
  }
  return 0;
}

/* The digests the MDS index at PATH records of its shard files, each checked (Streaming's writers
 * record them when given hashes=[...]; its readers check one when asked, with validate_hash). */
static void verify_digests(const char *path, long *bad, FILE *out, void *arg) {
  (void)arg;
  digest_check c = {.out = out};
  if (dl_tool_mds_digests(path, check_digest, &c)) {
    fprintf(out, "%s\n", dl_last_error());
    (*bad)++;
    return;
  }
  if (c.checked)
    fprintf(out, "%s: %ld digest%s of its shard files checked%s\n", path, c.checked, c.checked == 1 ? "" : "s",
            c.bad ? ", not all as recorded (above)" : ", all as recorded");
  *bad += c.bad;
}

/* What verify and index say when the paths named no shard: only the indexes beside shards. */
#define NO_SHARD ": no shard among the paths (the indexes saved beside shards, <shard>.rfidx, are left out)"

static int cmd_verify(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  dl_tool_verifier *v;
  if (dl_tool_verifier_new(&v, verify_digests, NULL)) {
    fprintf(stderr, "dlshard: out of memory\n");
    return 1;
  }
  dl_tool_counts c = {0};
  for (int a = 1; a < argc; a++) {
    size_t n = 0;
    char **paths;
    if (dl_tool_paths(argv[a], &paths, &n, stderr, "dlshard: ")) {
      c.unread++;
      continue;
    }
    for (size_t i = 0; i < n; i++)
      dl_tool_verify(v, paths[i], &c, stdout);
    dl_tool_free_paths(paths, n);
  }
  dl_tool_verifier_free(v);
  long bad = c.bad, shards = c.shards, images = c.images, unread = c.unread;
  char what[96];
  if (images && !shards) /* an ImageFolder's files are images, not shards */
    snprintf(what, sizeof what, "%ld image%s", images, images == 1 ? "" : "s");
  else if (images)
    snprintf(what, sizeof what, "%ld shard%s and %ld image%s", shards, shards == 1 ? "" : "s", images,
             images == 1 ? "" : "s");
  else
    snprintf(what, sizeof what, "%ld shard%s", shards, shards == 1 ? "" : "s");
  /* Nothing to verify (only the indexes saved beside shards, which paths leave out): not a pass. */
  bool none = !shards && !images && !bad && !unread;
  printf("%s verified%s\n", what, bad ? ": damaged (see above)" : none ? NO_SHARD : ": ok");
  if (bad)
    printf("%ld bad record%s\n", bad, bad == 1 ? "" : "s");
  if (unread) /* missing or unreadable: named above, not counted as records */
    printf("%ld shard%s could not be read (see above)\n", unread, unread == 1 ? "" : "s");
  return bad || unread || none ? 1 : 0;
}

/* ---- index, ls ---- */

static int cmd_index(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  int rc = 0;
  size_t given = 0;
  for (int a = 1; a < argc; a++) {
    size_t n = 0;
    char **paths;
    if (dl_tool_paths(argv[a], &paths, &n, stderr, "dlshard: ")) {
      rc = 1;
      continue;
    }
    given += n;
    for (size_t i = 0; i < n; i++) {
      size_t samples;
      bool own;
      char name[4096];
      if (dl_tool_index(paths[i], &samples, &own)) {
        fprintf(stderr, "dlshard: %s\n", dl_last_error());
        rc = 1;
      } else if (own) {
        printf("%s: %zu samples, in a ringfeed shard: its index is its own, nothing to build\n",
               dl_tool_shown(paths[i], name, sizeof name), samples);
      } else {
        printf("%s: %zu samples indexed\n", dl_tool_shown(paths[i], name, sizeof name), samples);
      }
    }
    dl_tool_free_paths(paths, n);
  }
  if (!rc && !given) {
    printf("0 shards indexed%s\n", NO_SHARD);
    return 1;
  }
  return rc;
}

static int cmd_ls(int argc, char **argv) {
  /* -v before or after the shard, as "ls -v" is typed; one shard. */
  bool verbose = false;
  const char *shard = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-v") && !verbose) {
      verbose = true;
    } else if (!shard && argv[i][0] != '-') {
      shard = argv[i];
    } else {
      fprintf(stderr, "dlshard ls: unexpected %s\n", argv[i]);
      shard = NULL;
      break;
    }
  }
  if (!shard) {
    usage(stderr);
    return 2;
  }
  if (dl_tool_list(shard, verbose, stdout)) {
    fprintf(stderr, "dlshard: %s\n", dl_last_error());
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--version")) {
    printf("dlshard (ringfeed) %s\n", dl_version());
    return 0;
  }
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "create"))
    return cmd_create(argc - 1, argv + 1);
  if (!strcmp(argv[1], "verify"))
    return cmd_verify(argc - 1, argv + 1);
  if (!strcmp(argv[1], "index"))
    return cmd_index(argc - 1, argv + 1);
  if (!strcmp(argv[1], "ls"))
    return cmd_ls(argc - 1, argv + 1);
  fprintf(stderr, "dlshard: unknown command '%s': create, verify, index or ls (dlshard --help)\n", argv[1]);
  return 2;
}
