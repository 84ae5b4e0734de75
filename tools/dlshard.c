/*
 * dlshard: make ringfeed shards from an ImageFolder, WebDataset tars or other ringfeed shards
 * (sample order kept), build tar indexes ahead of time, verify shards, and list them.
 */
#include "internal.h"
#include "cli_number.h"
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

#include <glob.h>
#include <png.h>
#include <zstd.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage:\n"
          "  dlshard create OUT_PREFIX INPUT... [--samples-per-shard N | --shard-size SIZE]\n"
          "                 [--codec image=keep,label=index] [--align BYTES] [--threads T]\n"
          "      INPUT: tar shards (lists, globs, {a..b}), ImageFolder roots, MDS datasets'\n"
          "      folders (MosaicML Streaming) or ringfeed shards;\n"
          "      writes OUT_PREFIX-000000.rfs ... in the inputs' sample order; an OUT_PREFIX of\n"
          "      s3://bucket/prefix/name uploads each shard once written (credentials as for the loader)\n"
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

/* The paths ARG names: brace ranges ({000..146}, {a,b}) expanded, then globs; *N of them, or
 * NULL with a message printed. The caller frees each and the array. */
static char **paths_of(const char *arg, size_t *n) {
  char **braced = NULL, **out = NULL;
  size_t nb = 0, count = 0, cap = 0;
  if (dl__expand_braces(arg, &braced, &nb)) {
    fprintf(stderr, "dlshard: %s\n", dl_last_error());
    return NULL;
  }
  bool ok = true;
  for (size_t i = 0; i < nb; i++) {
    glob_t g = {0};
    char **listed = NULL; /* an s3:// or hf:// glob's objects */
    size_t nlisted = 0;
    bool pattern = strpbrk(braced[i], "*?[") != NULL, url = dl__is_url(braced[i]);
    if (pattern && url) {
      dl__options o;
      dl__dataset tmp = {0};
      dl__options_parse(&o, NULL);
      bool listable = !strncmp(braced[i], "s3://", 5) || !strncmp(braced[i], "hf://", 5);
      if (!listable || dl__remote_list(&tmp, braced[i], &o, &listed, &nlisted)) {
        fprintf(stderr, "dlshard: %s: %s\n", braced[i],
                !listable ? "an HTTP server cannot be listed (name the shards)" : dl_last_error());
        ok = false;
      }
      dl__remote_free(&tmp);
    } else if (pattern && glob(braced[i], 0, NULL, &g)) {
      fprintf(stderr, "dlshard: %s: no file matches\n", braced[i]);
      ok = false;
    }
    size_t add = !pattern ? 1 : url ? nlisted : g.gl_pathc;
    if (ok && count + add > cap) {
      cap = (count + add) * 2;
      char **grown = realloc(out, cap * sizeof *out);
      if (!grown)
        ok = false;
      else
        out = grown;
    }
    for (size_t j = 0; ok && j < add; j++)
      if (!(out[count++] = strdup(!pattern ? braced[i] : url ? listed[j] : g.gl_pathv[j])))
        ok = false;
    if (pattern && !url)
      globfree(&g);
    for (size_t j = 0; j < nlisted; j++)
      free(listed[j]);
    free(listed);
  }
  for (size_t i = 0; i < nb; i++)
    free(braced[i]);
  free(braced);
  if (!ok) {
    for (size_t i = 0; i < count; i++)
      free(out[i]);
    free(out);
    return NULL;
  }
  *n = count;
  return out;
}

/* PATH as dlshard prints it: a URL without its user name and password, which must not reach a log. */
static const char *shown(const char *path, char *buf, size_t cap) {
  snprintf(buf, cap, "%s", path);
  dl__without_credentials(buf);
  return buf;
}

/* PATH (a file, or a URL copied to a temporary file: WHOLE, or a ringfeed shard's index only)
 * opened for reading, its size in *SIZE; -1 with a message printed. */
static int open_shard(const char *path, bool whole, uint64_t *size, FILE *msg) {
  const char *who = msg == stderr ? "dlshard: " : "";
  if (dl__is_url(path)) {
    dl__options o;
    dl__options_parse(&o, NULL);
    int fd;
    if (dl__remote_copy(path, &o, whole, &fd, size)) {
      fprintf(msg, "%s%s\n", who, dl_last_error()); /* which names the URL */
      return -1;
    }
    return fd;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    fprintf(msg, "%s%s: %s\n", who, path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  *size = (uint64_t)st.st_size;
  return fd;
}

static void free_paths(char **p, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(p[i]);
  free(p);
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

typedef struct create_job {
  dl__dataset *ds;
  const char *prefix; /* where shards are written */
  const char *upload; /* s3://bucket/key prefix each written shard is uploaded to (then deleted), or NULL */
  const dl__options *o;
  const char *writer_opts;
  size_t *bounds; /* shard s holds samples [bounds[s], bounds[s + 1]) */
  size_t nshards;
  size_t next;    /* next shard to write */
  size_t done;    /* samples written */
  int err;
  char errmsg[DL__MSG_MAX];
  pthread_mutex_t mu;
  double t0;
  bool tty;
} create_job;

static int read_sample(const dl__dataset *ds, const dl__sample *s, dl__buf *buf) {
  if (dl__buf_reserve(buf, s->size ? s->size : 1))
    return dl__fail(-ENOMEM, "out of memory");
  int fd = ds->fds[s->file], own = -1;
  if (fd < 0 || ds->direct[s->file])
    fd = own = open(ds->files[s->file], O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return dl__fail(-errno, "%s: %s", ds->files[s->file], strerror(errno));
  size_t got = 0;
  while (got < s->size) {
    ssize_t n = pread(fd, buf->p + got, s->size - got, (off_t)(s->offset + got));
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  if (own >= 0)
    close(own);
  if (got < s->size)
    return dl__fail(DL_ECORRUPT, "shard %s member %s: file ends early (truncated)", ds->files[s->file],
                    ds->pool + s->name);
  if ((s->flags & DL__SAMPLE_CHECKSUM) && dl__rfs_checksum(buf->p, s->size) != s->checksum)
    return dl__fail(DL_ECORRUPT, "shard %s %s: record checksum mismatch", ds->files[s->file],
                    ds->pool + s->name);
  return 0;
}

/* An MDS column's value as a .npy payload (version 1.0 header, little-endian) into OUT. */
static int npy_of_mds(const dl__mds_spec *spec, const uint8_t *p, size_t n, dl__buf *out, size_t *len, dl__err *e) {
  dl__npy v;
  if (dl__mds_parse(spec, p, n, &v, e))
    return e->code;
  char shape[DL__NPY_MAX_DIMS * 24 + 4] = "";
  for (int d = 0; d < v.ndim; d++)
    snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%lld,%s", (long long)v.shape[d],
             d + 1 < v.ndim ? " " : "");
  char head[256];
  int h = snprintf(head, sizeof head, "{'descr': '%c%c%u', 'fortran_order': False, 'shape': (%s), }",
                   v.dtype.bits == 8 ? '|' : '<', "iuf"[v.dtype.code], v.dtype.bits / 8u, shape);
  size_t total = (10 + (size_t)h + 1 + 63) / 64 * 64; /* magic, version, length, dict, '\n': to 64 */
  if (dl__buf_reserve(out, total + v.bytes))
    return dl__err_set(e, -ENOMEM, "out of memory");
  memcpy(out->p, "\x93NUMPY\x01\x00", 8);
  out->p[8] = (uint8_t)((total - 10) & 0xFF);
  out->p[9] = (uint8_t)((total - 10) >> 8);
  memcpy(out->p + 10, head, (size_t)h);
  memset(out->p + 10 + h, ' ', total - 10 - (size_t)h - 1);
  out->p[total - 1] = '\n';
  memcpy(out->p + total, v.data, v.bytes);
  *len = total + v.bytes;
  return 0;
}

/* Writes sample S's tensor fields (tar .npy/.npy.zst members, .rfs raw/zstd fields, MDS columns)
 * from BYTES. */
static int write_tensors(dl_writer *w, const dl__dataset *ds, const dl__sample *s, const uint8_t *bytes,
                         dl__buf *raw) {
  for (uint8_t r = 0; r < s->nrefs; r++) {
    const dl__fref *ref = &ds->refs[s->first_ref + r];
    const char *name = ds->field_names[ref->name];
    const uint8_t *p = bytes + ref->at;
    if (ref->kind == DL__REF_MDS) {
      dl__err e = {0};
      size_t len = 0;
      if (npy_of_mds(&ds->mds[ref->name], p, ref->len, raw, &len, &e))
        return dl__fail(e.code, "sample %s field %s: %s", ds->pool + s->key, name, e.msg);
      int rc = dl_writer_field(w, name, "raw", raw->p, len);
      if (rc)
        return rc;
      continue;
    }
    if (ref->kind == DL__REF_NPY || ref->kind == DL__REF_BYTES) {
      /* An MDS str or json column keeps its kind; other bytes keep their names, whose extension
       * says it (caption.txt). */
      uint8_t bk = ds->bytes_kind[ref->name];
      const char *codec = ref->kind == DL__REF_NPY        ? "raw"
                          : bk == DL__BYTES_TEXT ? "text"
                          : bk == DL__BYTES_JSON ? "json"
                                                 : "bytes";
      int rc = dl_writer_field(w, name, codec, p, ref->len);
      if (rc)
        return rc;
      continue;
    }
    /* Compressed: checked by decompressing (frames from a stream carry no size), then stored
     * compressed again; at most 1 GiB. */
    ZSTD_DStream *z = ZSTD_createDStream();
    ZSTD_inBuffer in = {p, ref->len, 0};
    size_t got = 0, zr = 1;
    while (z && zr != 0 && !ZSTD_isError(zr)) {
      if (got + (1u << 20) > raw->cap && (raw->cap >= (1u << 30) || dl__buf_reserve(raw, got + (1u << 20)))) {
        zr = (size_t)-1;
        break;
      }
      ZSTD_outBuffer out = {raw->p + got, raw->cap - got, 0};
      size_t before = in.pos;
      zr = ZSTD_decompressStream(z, &out, &in);
      got += out.pos;
      if (!ZSTD_isError(zr) && zr != 0 && in.pos == before && out.pos == 0 && in.pos == in.size)
        zr = (size_t)-1; /* truncated frame: no progress left to make */
    }
    ZSTD_freeDStream(z);
    if (!z || zr != 0)
      return dl__fail(DL_ECORRUPT, "sample %s field %s: zstd: %s", ds->pool + s->key, name,
                      ZSTD_isError(zr) && zr != (size_t)-1 ? ZSTD_getErrorName(zr) : "frame cut short or too large");
    int rc = dl_writer_field(w, name, "zstd", raw->p, got);
    if (rc)
      return rc;
  }
  return 0;
}

/* Streaming's raw "pil" pixels as a PNG in OUT (*LEN bytes): lossless, so the ringfeed shard gives
 * the loader the same pixels (alpha kept, and dropped at decode as for the pil value). */
static int pil_to_png(const dl__sample *s, const dl__dataset *ds, const uint8_t *p, size_t len, dl__buf *out,
                      size_t *png_len) {
  dl__pil_image im;
  dl__err e = {0};
  if (dl__pil_header(p, len, INT64_C(1) << 31, &im, &e))
    return dl__fail(e.code, "sample %s: %s", ds->pool + s->key, e.msg);
  static const png_uint_32 formats[] = {0, PNG_FORMAT_GRAY, PNG_FORMAT_GA, PNG_FORMAT_RGB, PNG_FORMAT_RGBA};
  png_image png = {.version = PNG_IMAGE_VERSION, .width = im.width, .height = im.height, .format = formats[im.bpp]};
  png_alloc_size_t need = 0;
  png_image_write_to_memory(&png, NULL, &need, 0, im.pixels, 0, NULL);
  if (!need || dl__buf_reserve(out, need)) {
    png_image_free(&png);
    return dl__fail(need ? -ENOMEM : DL_ELIMIT, "sample %s: its %ux%u pil pixels cannot be a PNG%s", ds->pool + s->key,
                    im.width, im.height, need ? " (out of memory)" : "");
  }
  if (!png_image_write_to_memory(&png, out->p, &need, 0, im.pixels, 0, NULL))
    return dl__fail(DL_ELIMIT, "sample %s: writing its pil pixels as a PNG: %s", ds->pool + s->key, png.message);
  *png_len = need;
  return 0;
}

static int write_shard(create_job *j, size_t shard, dl__buf *buf, dl__buf *raw_) {
  char path[PATH_MAX];
  dl__buf raw = *raw_, zimage = {0};
  void *zctx = NULL;
  snprintf(path, sizeof path, "%s-%06zu.rfs", j->prefix, shard);
  dl_writer *w;
  int r = dl_writer_open(&w, path, j->writer_opts);
  if (r)
    return r;
  for (size_t i = j->bounds[shard]; i < j->bounds[shard + 1] && !r; i++) {
    const dl__sample *s = &j->ds->samples[i];
    r = dl_writer_begin(w, j->ds->pool + s->key, s->label);
    if (!r && (s->codec != DL__CODEC_NONE || s->nrefs))
      r = read_sample(j->ds, s, buf);
    if (!r && s->codec != DL__CODEC_NONE) {
      const uint8_t *img = buf->p + s->image_at;
      size_t len = s->image_len;
      if (s->codec == DL__CODEC_PIL) { /* raw pixels, which ringfeed shards keep as PNG */
        r = pil_to_png(s, j->ds, img, len, &zimage, &len);
        img = zimage.p;
      } else if (s->flags & DL__SAMPLE_IMAGE_ZST) { /* stored as the plain image it holds */
        dl__err e = {0};
        if (dl__zstd_inflate(&zctx, img, len, 1u << 30, &zimage, &len, &e))
          r = dl__fail(e.code, "sample %s image: %s", j->ds->pool + s->key, e.msg);
        img = zimage.p;
      }
      int codec = r ? DL__CODEC_NONE : dl__sniff_codec(img, len); /* IMG may be NULL after a failure */
      if (!r)
        r = dl_writer_field(w, "image", codec == DL__CODEC_PNG ? "png" : codec == DL__CODEC_WEBP ? "webp" : "jpeg",
                            img, len);
    }
    if (!r && s->nrefs)
      r = write_tensors(w, j->ds, s, buf->p, &raw);
    if (!r)
      r = dl_writer_end(w);
    pthread_mutex_lock(&j->mu);
    j->done++;
    pthread_mutex_unlock(&j->mu);
  }
  *raw_ = raw;
  dl__buf_free(&zimage);
  ZSTD_freeDCtx(zctx);
  if (r) {
    dl_writer_abort(w);
    return r;
  }
  if ((r = dl_writer_close(w)) || !j->upload)
    return r;
  /* Uploaded once whole, then the local copy goes. */
  char url[PATH_MAX];
  snprintf(url, sizeof url, "%s-%06zu.rfs", j->upload, shard);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st))
    r = dl__fail(-errno, "%s: %s", path, strerror(errno));
  else
    r = dl__remote_put(url, j->o, fd, (uint64_t)st.st_size);
  if (fd >= 0)
    close(fd);
  unlink(path);
  return r;
}

static void *create_worker(void *arg) {
  create_job *j = arg;
  dl__buf buf = {0}, raw = {0};
  for (;;) {
    pthread_mutex_lock(&j->mu);
    size_t shard = j->err ? j->nshards : j->next++;
    pthread_mutex_unlock(&j->mu);
    if (shard >= j->nshards)
      break;
    int r = write_shard(j, shard, &buf, &raw);
    if (r) {
      pthread_mutex_lock(&j->mu);
      if (!j->err) {
        j->err = r;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", dl_last_error());
      }
      pthread_mutex_unlock(&j->mu);
    }
  }
  dl__buf_free(&buf);
  dl__buf_free(&raw);
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

static int cmd_create(int argc, char **argv) {
  static const struct option opts[] = {{"samples-per-shard", 1, 0, 'n'}, {"shard-size", 1, 0, 's'},
                                       {"codec", 1, 0, 'c'}, {"align", 1, 0, 'a'},
                                       {"threads", 1, 0, 't'}, {0, 0, 0, 0}};
  int64_t shard_bytes = 0;
  long per_shard = 0, align = 4096, threads = sysconf(_SC_NPROCESSORS_ONLN);
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
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
    case 'c':
      /* Images are kept as they are (JPEG/PNG); labels live in the index. */
      for (char *tok = strtok(optarg, ","); tok; tok = strtok(NULL, ",")) {
        if (strcmp(tok, "image=keep") && strcmp(tok, "label=index") && strcmp(tok, "label=raw")) {
          fprintf(stderr, "dlshard: --codec %s: supported are image=keep and label=index\n", tok);
          return 2;
        }
      }
      break;
    default: usage(stderr); return 2;
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
  if (dl__is_url(prefix)) {
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
    /* The prefix's folder is made if missing, as `mkdir -p` would. */
    snprintf(folder, sizeof folder, "%s", prefix);
    char *slash = strrchr(folder, '/');
    if (slash && slash != folder) {
      *slash = 0;
      dl__mkdirs(folder);
    }
  }
  dl__options o;
  dl__options_parse(&o, "on_error=fail");
  dl__dataset ds = {0};
  for (int i = optind + 1; i < argc; i++) {
    if (dl__is_url(argv[i])) {
      fprintf(stderr, "dlshard: %s: create reads local inputs (copy remote ones first)\n", argv[i]);
      dl__dataset_free(&ds);
      return 2;
    }
    int r = dl__source_load(&ds, argv[i], &o);
    if (r) {
      fprintf(stderr, "dlshard: %s\n", dl_last_error());
      dl__dataset_free(&ds);
      return 1;
    }
  }
  size_t *bounds = malloc((ds.n + 2) * sizeof *bounds), nshards = 0;
  bounds[0] = 0;
  int64_t acc = 0;
  for (size_t i = 0; i < ds.n; i++) {
    size_t in_shard = i - bounds[nshards];
    acc += (int64_t)ds.samples[i].size + (int64_t)align;
    if (in_shard > 0 && ((per_shard && (int64_t)in_shard >= per_shard) || (shard_bytes && acc > shard_bytes))) {
      bounds[++nshards] = i;
      acc = (int64_t)ds.samples[i].size + (int64_t)align;
    }
  }
  bounds[++nshards] = ds.n;
  char wopts[64];
  snprintf(wopts, sizeof wopts, "align=%lld", (long long)align);
  create_job j = {.ds = &ds, .prefix = prefix, .upload = upload, .o = &o, .writer_opts = wopts, .bounds = bounds, .nshards = nshards,
                  .t0 = now(), .tty = isatty(2)};
  pthread_mutex_init(&j.mu, NULL);
  if (threads > (long)nshards)
    threads = (long)nshards;
  pthread_t *t = calloc((size_t)threads, sizeof *t);
  for (long i = 0; i < threads; i++)
    pthread_create(&t[i], NULL, create_worker, &j);
  if (j.tty)
    for (;;) {
      pthread_mutex_lock(&j.mu);
      bool finished = j.done >= ds.n || j.err;
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
  } else {
    printf("%zu samples in %zu shard%s (%s-%06d.rfs ...), %.2f s, %.0f samples/s\n", ds.n, nshards,
           nshards == 1 ? "" : "s", upload ? upload : prefix, 0, dt, ds.n / (dt > 0 ? dt : 1e-9));
    if (!upload)
      name_leftovers(prefix, nshards);
  }
  if (staging[0]) { /* what a failed shard left */
    for (size_t s = 0; s < nshards; s++) {
      char path[PATH_MAX + 16];
      snprintf(path, sizeof path, "%s-%06zu.rfs", prefix, s);
      unlink(path);
    }
    rmdir(staging);
  }
  free(t);
  free(bounds);
  pthread_mutex_destroy(&j.mu);
  dl__dataset_free(&ds);
  return rc;
}

/* ---- verify ---- */

/* What verify decodes with, made once for all shards. */
typedef struct checker {
  dl__image_decoder d;
  void *zctx;   /* ZSTD_DCtx, made on first use */
  dl__buf raw;  /* an inflated value or image */
  size_t limit; /* the most an inflated value may hold: the loader's default max_member_bytes */
} checker;

static int plan_full(dl__decode_job *job, int w, int h, dl__err *e) {
  (void)e;
  job->rect = (dl__rect){0, 0, w, h};
  job->out_w = w;
  job->out_h = h;
  return 0;
}

/* *P and *N made the inflated bytes where ZST (`.jpg.zst` members, `.npy.zst` and zstd fields). */
static int inflated(checker *c, const uint8_t **p, size_t *n, bool zst, dl__err *e) {
  if (!zst)
    return 0;
  if (dl__zstd_inflate(&c->zctx, *p, *n, c->limit, &c->raw, n, e))
    return e->code;
  *p = c->raw.p;
  return 0;
}

/* Decodes the whole image at P (N bytes, zstd-compressed when ZST). */
static int decode_image(checker *c, const uint8_t *p, size_t n, bool zst, bool pil, dl__err *e) {
  if (inflated(c, &p, &n, zst, e))
    return e->code;
  dl__decode_job job = {.src = p, .len = n, .channels = 3, .out_w = 1 << 30, .out_h = 1 << 30,
                        .max_pixels = 1ll << 28, .plan = plan_full, .scratch = &c->d.scratch, .pil = pil};
  return dl__image_decode_job(&c->d, &job, e);
}

/* A tensor value (N bytes at P, zstd-compressed when ZST) as the loader takes it: a .npy payload
 * whose header parses and whose data holds its whole shape. */
static int check_npy(checker *c, const uint8_t *p, size_t n, bool zst, dl__err *e) {
  dl__npy npy;
  return inflated(c, &p, &n, zst, e) ? e->code : dl__npy_parse(p, n, n, &npy, e);
}

static int check_ref(checker *c, const dl__dataset *ds, const dl__fref *ref, const uint8_t *p, dl__err *e) {
  size_t len;
  if (ref->kind == DL__REF_MDS)
    return npy_of_mds(&ds->mds[ref->name], p, ref->len, &c->raw, &len, e);
  if (ref->kind == DL__REF_NPY || ref->kind == DL__REF_NPY_ZST)
    return check_npy(c, p, ref->len, ref->kind == DL__REF_NPY_ZST, e);
  return 0; /* bytes, text and JSON reach the consumer as they are */
}

#define NO_IMAGE "sample has no image member, where the others have one: the loader skips it"

static bool is_image(const dl__rfs_field *f) {
  return f->codec == DL__RFS_JPEG || f->codec == DL__RFS_PNG || f->codec == DL__RFS_WEBP;
}

/* Whether record I of R has an image field. */
static bool rfs_image(const dl__rfs *r, uint64_t i) {
  for (uint16_t f = 0; f < r->records[i].nfields; f++)
    if (is_image(&r->fields[r->records[i].first_field + f]))
      return true;
  return false;
}

/* Whether any sample of DS has an image: then the loader skips those without one. */
static bool any_image(const dl__dataset *ds) {
  for (size_t i = 0; i < ds->n; i++)
    if (ds->samples[i].codec != DL__CODEC_NONE)
      return true;
  return false;
}

/* Sample S of DS, read into BYTES: its image decoded, its tensor values checked. */
static int check_sample(checker *c, const dl__dataset *ds, const dl__sample *s, const uint8_t *bytes,
                        dl__err *e) {
  bool zst = s->flags & DL__SAMPLE_IMAGE_ZST, pil = s->codec == DL__CODEC_PIL;
  if (s->codec != DL__CODEC_NONE && decode_image(c, bytes + s->image_at, s->image_len, zst, pil, e))
    return e->code;
  for (uint8_t r = 0; r < s->nrefs; r++) {
    const dl__fref *ref = &ds->refs[s->first_ref + r];
    if (check_ref(c, ds, ref, bytes + ref->at, e))
      return dl__err_prefix(e, "field %s: ", ds->field_names[ref->name]);
  }
  return 0;
}

static int verify_rfs(const char *path, int fd, uint64_t size, checker *c, long *bad) {
  dl__rfs r;
  char why[256];
  int rc = dl__rfs_open(&r, fd, size, why, sizeof why);
  if (rc) {
    printf("%s: %s\n", path, why);
    (*bad)++;
    return 1;
  }
  dl__buf buf = {0};
  bool has_images = false;
  for (uint64_t i = 0; i < r.nrecords && !has_images; i++)
    has_images = rfs_image(&r, i);
  for (uint64_t i = 0; i < r.nrecords; i++) {
    const dl__rfs_record *rec = &r.records[i];
    const char *key = r.keys + rec->key;
    dl__err e = {0};
    if (has_images && !rfs_image(&r, i)) {
      dl__err_set(&e, DL_ENOFIELD, NO_IMAGE);
    } else if (dl__buf_reserve(&buf, rec->size ? rec->size : 1) ||
        pread(fd, buf.p, rec->size, (off_t)rec->offset) != (ssize_t)rec->size) {
      dl__err_set(&e, DL_ECORRUPT, "cannot read the record's %u bytes", rec->size);
    } else if (dl__rfs_checksum(buf.p, rec->size) != rec->checksum) {
      dl__err_set(&e, DL_ECORRUPT, "checksum mismatch");
    } else {
      for (uint16_t f = 0; f < rec->nfields && !e.code; f++) {
        const dl__rfs_field *fd_ = &r.fields[rec->first_field + f];
        const uint8_t *p = buf.p + fd_->offset;
        if (is_image(fd_))
          decode_image(c, p, fd_->size, false, false, &e);
        else if (fd_->codec == DL__RFS_ZSTD && ZSTD_getFrameContentSize(p, fd_->size) != fd_->raw_size)
          dl__err_set(&e, DL_ECORRUPT, "zstd frame does not declare its %llu bytes",
                      (unsigned long long)fd_->raw_size);
        else if (fd_->codec == DL__RFS_ZSTD)
          check_npy(c, p, fd_->size, true, &e);
        else if (fd_->raw_size != fd_->size)
          dl__err_set(&e, DL_ECORRUPT, "raw field of %u bytes claims %llu", fd_->size,
                      (unsigned long long)fd_->raw_size);
        else if (fd_->codec == DL__RFS_RAW) /* a tensor; bytes, text and JSON are delivered as they are */
          check_npy(c, p, fd_->size, false, &e);
        if (e.code)
          dl__err_prefix(&e, "field %s: ", r.names[fd_->name]);
      }
    }
    if (e.code) {
      printf("%s: record %llu (key %s, offset %llu): %s\n", path, (unsigned long long)i, key,
             (unsigned long long)rec->offset, e.msg);
      (*bad)++;
    }
  }
  dl__buf_free(&buf);
  dl__rfs_free(&r);
  return 0;
}

static int verify_tar(const char *path, int packed, uint64_t size, checker *c, long *bad) {
  /* A compressed shard is checked through a temporary uncompressed copy, as the loader reads it;
   * damage to its compressed data is a bad record, and what came before it is checked. */
  dl__options o;
  dl__options_parse(&o, "on_error=skip");
  int copy, fd = packed;
  int rc = dl__tar_uncompressed(packed, path, NULL, &o, &copy, &size);
  if (rc) {
    printf("%s\n", dl_last_error());
    (*bad)++;
    if (copy < 0)
      return 0;
  }
  if (copy >= 0)
    fd = copy;
  dl__dataset ds = {0};
  uint32_t file;
  dl__dataset_add_file(&ds, path, &file);
  rc = dl__tar_scan(&ds, file, fd, size, DL__ON_ERROR_FAIL);
  if (rc < 0) {
    printf("%s\n", dl_last_error());
    (*bad)++;
  }
  ds.fds[file] = -1; /* the caller closes fd */
  dl__buf buf = {0};
  bool has_images = any_image(&ds);
  for (size_t i = 0; i < ds.n; i++) {
    const dl__sample *s = &ds.samples[i];
    dl__err e = {0};
    if (has_images && s->codec == DL__CODEC_NONE)
      dl__err_set(&e, DL_ENOFIELD, NO_IMAGE);
    else if (s->codec == DL__CODEC_NONE && !s->nrefs)
      continue; /* a label alone has nothing to decode */
    else if (dl__buf_reserve(&buf, s->size ? s->size : 1) ||
             pread(fd, buf.p, s->size, (off_t)s->offset) != (ssize_t)s->size)
      dl__err_set(&e, DL_ECORRUPT, "cannot read %llu bytes", (unsigned long long)s->size);
    else
      check_sample(c, &ds, s, buf.p, &e);
    if (e.code) {
      printf("%s: member %s (offset %llu): %s\n", path, ds.pool + s->name, (unsigned long long)s->offset, e.msg);
      (*bad)++;
    }
  }
  dl__buf_free(&buf);
  dl__dataset_free(&ds);
  if (copy >= 0)
    close(copy);
  return 0;
}

typedef struct digest_check {
  long checked, bad;
} digest_check;

/* One digest an MDS index records of FILE, against the file's bytes. A file that is not there is
 * passed over: a shard kept only compressed has no raw file, and a missing shard the load named. */
static int check_digest(const char *file, const dl__mds_digest *d, void *arg) {
  digest_check *c = arg;
  int fd = dl__open_regular(file, "MDS shard", NULL); /* not a FIFO's wait for a writer */
  if (fd < 0) {
    if (fd != -ENOENT) {
      printf("%s (its %s digest not checked)\n", dl_last_error(), d->algo);
      c->bad++;
    }
    return 0;
  }
  char hex[160];
  int rc = file_digest(fd, d->algo, hex, sizeof hex);
  close(fd);
  if (rc == -ENOTSUP || rc == -ENOSYS) {
    printf("%s: its '%s' digest is not checked: %s\n", file, d->algo,
           rc == -ENOTSUP ? "no algorithm of that name is known here"
                          : "this dlshard was built without libcrypto (install libssl-dev and build again)");
    return 0;
  }
  c->checked++;
  if (rc) {
    printf("%s: reading it for its %s digest failed: %s\n", file, d->algo, strerror(-rc));
    c->bad++;
  } else if (strcasecmp(hex, d->hex)) {
    printf("%s: %s digest %s, but the index records %s: the file is not the one the index was written with\n",
           file, d->algo, hex, d->hex);
    c->bad++;
  }
  return 0;
}

/* The digests the MDS index at PATH records of its shard files, each checked (Streaming's writers
 * record them when given hashes=[...]; its readers check one when asked, with validate_hash). */
static void verify_digests(const char *path, long *bad) {
  digest_check c = {0};
  if (dl__mds_digests(path, check_digest, &c)) {
    printf("%s\n", dl_last_error());
    (*bad)++;
    return;
  }
  if (c.checked)
    printf("%s: %ld digest%s of its shard files checked%s\n", path, c.checked, c.checked == 1 ? "" : "s",
           c.bad ? ", not all as recorded (above)" : ", all as recorded");
  *bad += c.bad;
}

/* A dataset that is not one shard file (an MDS dataset, an ImageFolder): loaded as the loader
 * loads it, each sample then read and its image and MDS values decoded. Samples the load left out
 * are named by its warnings and counted as bad. Its files count as shards (MDS) or images. */
static void verify_dataset(const char *path, checker *c, long *bad, long *shards, long *images) {
  dl__options o;
  dl__options_parse(&o, "on_error=skip");
  dl__dataset ds = {0};
  int quiet = dl__log_level;
  dl__log_level = DL__LOG_WARN; /* what the load leaves out, named on stderr */
  int rc = dl__source_load(&ds, path, &o);
  dl__log_level = quiet;
  if (rc) {
    printf("%s\n", dl_last_error());
    (*bad)++;
    dl__dataset_free(&ds);
    return;
  }
  if (ds.left_out)
    printf("%s: %llu sample%s left out as damaged (named above)\n", path, (unsigned long long)ds.left_out,
           ds.left_out == 1 ? "" : "s");
  *bad += (long)ds.left_out;
  *(dl__mds_is(path) ? shards : images) += ds.nfiles;
  if (dl__mds_is(path))
    verify_digests(path, bad);
  dl__buf buf = {0};
  bool has_images = any_image(&ds);
  for (size_t i = 0; i < ds.n; i++) {
    const dl__sample *s = &ds.samples[i];
    dl__err e = {0};
    if (has_images && s->codec == DL__CODEC_NONE)
      dl__err_set(&e, DL_ENOFIELD, NO_IMAGE);
    else if (s->codec == DL__CODEC_NONE && !s->nrefs)
      continue;
    else if (read_sample(&ds, s, &buf))
      dl__err_set(&e, DL_ECORRUPT, "%s", dl_last_error());
    else
      check_sample(c, &ds, s, buf.p, &e);
    if (e.code) {
      printf("%s: sample %s: %s\n", ds.files[s->file], ds.pool + s->key, e.msg);
      (*bad)++;
    }
  }
  dl__buf_free(&buf);
  dl__dataset_free(&ds);
}

/* An MDS dataset or ImageFolder named by PATH, rather than a shard file. */
static bool is_dataset(const char *path) {
  struct stat st;
  return dl__mds_is(path) || (!stat(path, &st) && S_ISDIR(st.st_mode));
}

static int cmd_verify(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  checker c = {0};
  if (dl__image_decoder_init(&c.d)) {
    fprintf(stderr, "dlshard: out of memory\n");
    return 1;
  }
  dl__options defaults;
  dl__options_parse(&defaults, "");
  c.limit = (size_t)defaults.max_member_bytes;
  dl__log_level = DL__LOG_QUIET;
  long bad = 0, shards = 0, images = 0, unread = 0;
  for (int a = 1; a < argc; a++) {
    size_t n = 0;
    char **paths = paths_of(argv[a], &n);
    if (!paths) {
      unread++;
      continue;
    }
    for (size_t i = 0; i < n; i++) {
      if (!dl__is_url(paths[i]) && is_dataset(paths[i])) {
        verify_dataset(paths[i], &c, &bad, &shards, &images);
        continue;
      }
      char name[4096];
      shown(paths[i], name, sizeof name);
      if (dl__is_url(paths[i]) && (dl__mds_is(paths[i]) || paths[i][strlen(paths[i]) - 1] == '/')) {
        printf("%s: an MDS dataset on a server: verify a local copy of its folder\n", name);
        unread++;
        continue;
      }
      uint64_t size;
      int fd = open_shard(paths[i], true, &size, stdout);
      if (fd < 0) {
        unread++;
        continue;
      }
      char magic[8] = {0};
      bool rfs = pread(fd, magic, 8, 0) == 8 && !memcmp(magic, "RFSHARD1", 8);
      (rfs ? verify_rfs : verify_tar)(name, fd, size, &c, &bad);
      close(fd);
      shards++;
    }
    free_paths(paths, n);
  }
  dl__image_decoder_free(&c.d);
  ZSTD_freeDCtx(c.zctx);
  dl__buf_free(&c.raw);
  char what[96];
  if (images && !shards) /* an ImageFolder's files are images, not shards */
    snprintf(what, sizeof what, "%ld image%s", images, images == 1 ? "" : "s");
  else if (images)
    snprintf(what, sizeof what, "%ld shard%s and %ld image%s", shards, shards == 1 ? "" : "s", images,
             images == 1 ? "" : "s");
  else
    snprintf(what, sizeof what, "%ld shard%s", shards, shards == 1 ? "" : "s");
  printf("%s verified%s\n", what, bad ? ": damaged (see above)" : shards || images ? ": ok" : "");
  if (bad)
    printf("%ld bad record%s\n", bad, bad == 1 ? "" : "s");
  if (unread) /* missing or unreadable: named above, not counted as records */
    printf("%ld shard%s could not be read (see above)\n", unread, unread == 1 ? "" : "s");
  return bad || unread ? 1 : 0;
}

/* ---- index, ls ---- */

static int cmd_index(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  int rc = 0;
  for (int a = 1; a < argc; a++) {
    size_t n = 0;
    char **paths = paths_of(argv[a], &n);
    if (!paths) {
      rc = 1;
      continue;
    }
    for (size_t i = 0; i < n; i++) {
      dl__dataset ds = {0};
      dl__options o; /* a remote shard's index goes to the cache the loader reads, keyed by its version */
      dl__options_parse(&o, "on_error=fail");
      int r = dl__is_url(paths[i]) ? dl__remote_load(&ds, paths[i], &o)
                                   : dl__tar_load(&ds, paths[i], &o);
      if (r) {
        fprintf(stderr, "dlshard: %s\n", dl_last_error());
        rc = 1;
      } else {
        char name[4096];
        printf("%s: %zu samples indexed\n", shown(paths[i], name, sizeof name), ds.n);
      }
      dl__dataset_free(&ds);
    }
    free_paths(paths, n);
  }
  return rc;
}

/* ls of an MDS dataset or an ImageFolder: what the loader reads of it. */
static int ls_dataset(const char *path, bool verbose) {
  dl__options o;
  dl__options_parse(&o, "on_error=skip");
  dl__dataset ds = {0};
  if (dl__source_load(&ds, path, &o)) {
    fprintf(stderr, "dlshard: %s\n", dl_last_error());
    dl__dataset_free(&ds);
    return 1;
  }
  uint64_t bytes = 0, images = 0;
  for (size_t i = 0; i < ds.n; i++) {
    bytes += ds.samples[i].size;
    images += ds.samples[i].codec != DL__CODEC_NONE;
  }
  printf("%s: %s, %zu samples (%llu with an image) in %u files, %llu bytes", path,
         dl__mds_is(path) ? "MDS dataset" : "image folder", ds.n, (unsigned long long)images, ds.nfiles,
         (unsigned long long)bytes);
  if (ds.left_out)
    printf(", %llu left out as damaged", (unsigned long long)ds.left_out);
  printf("\n");
  for (int f = 0; f < ds.nfield_names; f++)
    printf("  field %s\n", ds.field_names[f]);
  for (size_t i = 0; verbose && i < ds.n; i++) {
    const dl__sample *s = &ds.samples[i];
    printf("  %s label %lld %s offset %llu size %llu\n", ds.pool + s->key, (long long)s->label, ds.files[s->file],
           (unsigned long long)s->offset, (unsigned long long)s->size);
  }
  dl__dataset_free(&ds);
  return 0;
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
  if (!dl__is_url(shard) && is_dataset(shard))
    return ls_dataset(shard, verbose);
  uint64_t size;
  int fd = open_shard(shard, false, &size, stderr);
  if (fd < 0)
    return 1;
  char name[4096];
  shown(shard, name, sizeof name);
  dl__rfs r;
  char why[256];
  if (dl__rfs_open(&r, fd, size, why, sizeof why)) {
    /* Not a ringfeed shard: list it as a tar. */
    dl__dataset ds = {0};
    dl__options o;
    dl__options_parse(&o, "on_error=skip");
    close(fd);
    if (dl__is_url(shard) ? dl__remote_load(&ds, shard, &o) : dl__tar_load(&ds, shard, &o)) {
      fprintf(stderr, "dlshard: %s: %s\n", name, dl__is_url(shard) ? dl_last_error() : why);
      return 1;
    }
    uint64_t bytes = 0;
    for (size_t i = 0; i < ds.n; i++)
      bytes += ds.samples[i].size;
    printf("%s: tar, %zu samples, %llu image bytes\n", name, ds.n, (unsigned long long)bytes);
    for (size_t i = 0; verbose && i < ds.n; i++)
      printf("  %s label %lld offset %llu size %llu\n", ds.pool + ds.samples[i].name,
             (long long)ds.samples[i].label, (unsigned long long)ds.samples[i].offset,
             (unsigned long long)ds.samples[i].size);
    dl__dataset_free(&ds);
    return 0;
  }
  printf("%s: ringfeed shard v1, %llu records, alignment %u, %llu bytes\n", name,
         (unsigned long long)r.nrecords, r.align, (unsigned long long)size);
  for (uint32_t n = 0; n < r.nnames; n++) {
    uint64_t count = 0, stored = 0, raw = 0;
    int codecs = 0;
    for (uint64_t f = 0; f < r.nfields_total; f++)
      if (r.fields[f].name == n) {
        count++;
        stored += r.fields[f].size;
        raw += r.fields[f].raw_size;
        codecs |= 1 << r.fields[f].codec;
      }
    printf("  field %-12s %8llu records  %12llu bytes stored  %12llu decoded  codec", r.names[n],
           (unsigned long long)count, (unsigned long long)stored, (unsigned long long)raw);
    for (int c = 0; c < (int)DL__ARRAY_LEN(dl__rfs_codec_names); c++)
      if (codecs & (1 << c))
        printf(" %s", dl__rfs_codec_names[c]);
    printf("\n");
  }
  for (uint64_t i = 0; verbose && i < r.nrecords; i++) {
    const dl__rfs_record *rec = &r.records[i];
    printf("  %llu %s label %lld offset %llu size %u:", (unsigned long long)i, r.keys + rec->key,
           (long long)rec->label, (unsigned long long)rec->offset, rec->size);
    for (uint16_t f = 0; f < rec->nfields; f++) {
      const dl__rfs_field *fd_ = &r.fields[rec->first_field + f];
      printf(" %s=%s:%u", r.names[fd_->name], dl__rfs_codec_names[fd_->codec], fd_->size);
    }
    printf("\n");
  }
  dl__rfs_free(&r);
  close(fd);
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
  fprintf(stderr, "dlshard: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
