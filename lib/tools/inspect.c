/*
 * The tools' look into shards and datasets (tools.h): verify (every record read as the loader
 * reads it, by the format's own verify), index and ls. A remote shard is read from a temporary copy
 * (for ls of a ringfeed shard, a copy of its index alone).
 */
#include "tools.h"
#include "source/source.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct dl_tool_verifier {
  dl__checker *c;
  void (*on_mds)(const char *path, long *bad, FILE *out, void *arg);
  void *arg;
};

/* PATH (a file, or a URL copied to a temporary file: WHOLE, or what its format's listing reads)
 * opened for reading, its size in *SIZE; a negative code with the message. */
static int open_shard(const char *path, bool whole, uint64_t *size) {
  if (dl__is_url(path)) {
    dl__options o;
    dl__options_parse(&o, NULL);
    int fd;
    int r = dl__remote_copy(path, &o, whole, &fd, size);
    return r ? r : fd;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    return dl__fail(-e, "%s: %s", path, strerror(e));
  }
  *size = (uint64_t)st.st_size;
  return fd;
}

/* The local dataset PATH names (an MDS dataset, an image folder) rather than a shard file, or NULL. */
static const dl__format *dataset_at(const char *path) {
  struct stat st = {0}; /* an index.json is an MDS dataset's by its name, there or not */
  if (dl__is_url(path))
    return NULL;
  if (stat(path, &st))
    st = (struct stat){0};
  const dl__format *f = dl__format_of(path, &st, NULL, 0);
  return f == &dl__mds_format || f == &dl__folder_format ? f : NULL;
}

/* The format a shard open as FD is of, by its first bytes. */
static const dl__format *shard_format(int fd) {
  uint8_t head[512];
  ssize_t n = pread(fd, head, sizeof head, 0);
  return dl__format_of("", NULL, head, n > 0 ? (size_t)n : 0);
}

static void on_dataset(const char *path, const dl__format *f, dl__verified *n, FILE *out, void *arg) {
  dl_tool_verifier *v = arg;
  if (f == &dl__mds_format && v->on_mds)
    v->on_mds(path, &n->bad, out, v->arg);
}

int dl_tool_verifier_new(dl_tool_verifier **out, void (*on_mds)(const char *path, long *bad, FILE *out, void *arg),
                         void *arg) {
  dl_tool_verifier *v = calloc(1, sizeof *v);
  *out = v;
  if (!v)
    return dl__fail(-ENOMEM, "out of memory");
  v->on_mds = on_mds;
  v->arg = arg;
  dl__log_level = DL__LOG_QUIET;
  int r = dl__checker_new(&v->c, on_dataset, v);
  if (r) {
    free(v);
    *out = NULL;
  }
  return r;
}

void dl_tool_verifier_free(dl_tool_verifier *v) {
  if (!v)
    return;
  dl__checker_free(v->c);
  free(v);
}

void dl_tool_verify(dl_tool_verifier *v, const char *path, dl_tool_counts *c, FILE *out) {
  dl__verified n = {0};
  const dl__format *f = dataset_at(path);
  if (f) {
    f->verify(path, -1, 0, v->c, &n, out);
  } else {
    char name[4096];
    dl_tool_shown(path, name, sizeof name);
    size_t len = strlen(path);
    bool mds = dl__is_url(path) && dl__format_of(path, NULL, NULL, 0) == &dl__mds_format &&
               !(len > 4 && !strcmp(path + len - 4, ".mds"));
    uint64_t size;
    int fd = mds ? -1 : open_shard(path, true, &size);
    if (mds)
      fprintf(out, "%s: an MDS dataset on a server: verify a local copy of its folder\n", name);
    else if (fd < 0)
      fprintf(out, "%s\n", dl_last_error()); /* which names the file or URL */
    if (fd < 0) {
      c->unread++;
      return;
    }
    f = shard_format(fd);
    if (f && f->verify)
      f->verify(name, fd, size, v->c, &n, out);
    close(fd);
    n.shards++;
  }
  c->bad += n.bad;
  c->shards += n.shards;
  c->images += n.images;
}

typedef struct digest_each {
  int (*each)(const char *file, const char *algo, const char *hex, void *arg);
  void *arg;
} digest_each;

static int one_digest(const char *file, const dl__mds_digest *d, void *arg) {
  const digest_each *e = arg;
  return e->each(file, d->algo, d->hex, e->arg);
}

int dl_tool_mds_digests(const char *path, int (*each)(const char *file, const char *algo, const char *hex, void *arg),
                        void *arg) {
  digest_each e = {each, arg};
  return dl__mds_digests(path, one_digest, &e);
}

/* The ringfeed shard at PATH (NAME as shown) read into *R, its file's size in *SIZE: 0; 1 where
 * PATH is no ringfeed shard; a negative code where it cannot be read or is a damaged one, which is
 * not to be read as a tar, nor named one. */
static int rfs_at(const char *path, const char *name, dl__rfs *r, uint64_t *size) {
  int fd = open_shard(path, false, size);
  if (fd < 0)
    return fd;
  char why[256], magic[8];
  int e = dl__rfs_open(r, fd, *size, why, sizeof why);
  bool rfs = !e || (dl__pread_full(fd, magic, sizeof magic, 0) == sizeof magic &&
                    !memcmp(magic, DL__RFS_MAGIC, sizeof magic));
  close(fd);
  return !rfs ? 1 : e ? dl__fail(DL_ECORRUPT, "%s: damaged ringfeed shard: %s", name, why) : 0;
}

/* A local ringfeed shard's records counted from the index it carries; 0 if PATH is none. */
static int rfs_own_index(const char *path, size_t *n, bool *own) {
  dl__rfs r;
  uint64_t size;
  char name[4096];
  int k = rfs_at(path, dl_tool_shown(path, name, sizeof name), &r, &size);
  if (k)
    return k < 0 ? k : 0;
  *n = (size_t)r.nrecords, *own = true;
  dl__rfs_free(&r);
  return 0;
}

int dl_tool_index(const char *path, size_t *n, bool *own) {
  *own = false;
  if (!dl__is_url(path)) {
    int r = rfs_own_index(path, n, own);
    if (r || *own)
      return r;
  }
  dl__dataset ds = {0};
  dl__options o; /* a remote shard's index goes to the cache the loader reads, keyed by its version */
  dl__options_parse(&o, "on_error=fail");
  int r = dl__is_url(path) ? dl__remote_load(&ds, path, &o) : dl__tar_load(&ds, path, &o);
  *n = ds.n;
  dl__dataset_free(&ds);
  return r;
}

/* The labels' names (all of them with -v; else the first three and the last). */
static void list_classes(char *const *classes, uint32_t n, bool verbose, FILE *out) {
  fprintf(out, "  classes %u:", n);
  for (uint32_t c = 0; c < n; c++) {
    if (verbose || n <= 4 || c < 3 || c == n - 1)
      fprintf(out, " %s", classes[c]);
    else if (c == 3)
      fputs(" ...", out);
  }
  fprintf(out, "\n");
}

/* ls of an MDS dataset or an image folder: what the loader reads of it. */
static int list_dataset(const char *path, const dl__format *f, bool verbose, FILE *out) {
  dl__options o;
  dl__options_parse(&o, "on_error=skip");
  dl__dataset ds = {0};
  int r = dl__source_load(&ds, path, &o);
  if (r) {
    dl__dataset_free(&ds);
    return r;
  }
  uint64_t bytes = 0, images = 0;
  for (size_t i = 0; i < ds.n; i++) {
    bytes += ds.samples[i].size;
    images += ds.samples[i].codec != DL__CODEC_NONE;
  }
  fprintf(out, "%s: %s, %zu samples (%llu with an image) in %u files, %llu bytes", path, f->what, ds.n,
          (unsigned long long)images, ds.nfiles, (unsigned long long)bytes);
  if (ds.left_out)
    fprintf(out, ", %llu left out as damaged", (unsigned long long)ds.left_out);
  fprintf(out, "\n");
  for (int k = 0; k < ds.nfield_names; k++)
    fprintf(out, "  field %s\n", ds.field_names[k]);
  if (ds.classes && !ds.classes_differ)
    list_classes(ds.classes, ds.nclasses, verbose, out);
  for (size_t i = 0; verbose && i < ds.n; i++) {
    const dl__sample *s = &ds.samples[i];
    fprintf(out, "  %s label %lld %s offset %llu size %llu\n", ds.pool + s->key, (long long)s->label,
            ds.files[s->file], (unsigned long long)s->offset, (unsigned long long)s->size);
  }
  dl__dataset_free(&ds);
  return 0;
}

static int load_tar(dl__dataset *ds, const char *shard, const char *on_error) {
  dl__options o;
  dl__options_parse(&o, on_error);
  return dl__is_url(shard) ? dl__remote_load(ds, shard, &o) : dl__tar_load(ds, shard, &o);
}

/* A shard that is no ringfeed shard, listed as a tar. A damaged one is listed up to its damage and
 * then fails, as `tar t` does: what is wrong is said once, last; a file that is no tar at all lists
 * nothing. */
static int list_tar(const char *shard, const char *name, bool verbose, FILE *out) {
  dl__dataset ds = {0};
  char damage[DL__MSG_MAX] = "";
  int rc = load_tar(&ds, shard, "on_error=fail"), damage_code = rc;
  if (rc == DL_ECORRUPT || rc == DL_EUNSUPPORTED) {
    snprintf(damage, sizeof damage, "%s", dl_last_error());
    dl__dataset_free(&ds);
    ds = (dl__dataset){0};
    int level = dl__log_level;
    dl__log_level = DL__LOG_ERROR; /* its warning would say again what the failure says */
    rc = load_tar(&ds, shard, "on_error=skip");
    dl__log_level = level;
  }
  if (rc) { /* not the bytes: the file or the server failed (the message names it) */
    dl__dataset_free(&ds);
    return rc;
  }
  if (damage[0] && !ds.n) { /* no tar at all (or damaged before its first member): nothing to list */
    dl__dataset_free(&ds);
    return dl__fail(damage_code, "%s", damage);
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < ds.n; i++)
    bytes += ds.samples[i].size;
  fprintf(out, "%s: tar, %zu samples, %llu image bytes\n", name, ds.n, (unsigned long long)bytes);
  for (size_t i = 0; verbose && i < ds.n; i++)
    fprintf(out, "  %s label %lld offset %llu size %llu\n", ds.pool + ds.samples[i].name,
            (long long)ds.samples[i].label, (unsigned long long)ds.samples[i].offset,
            (unsigned long long)ds.samples[i].size);
  dl__dataset_free(&ds);
  return damage[0] ? dl__fail(damage_code, "%s", damage) : 0;
}

static void list_rfs(const dl__rfs *r, const char *name, uint64_t size, bool verbose, FILE *out) {
  fprintf(out, "%s: ringfeed shard v1, %llu records, alignment %u, %llu bytes\n", name,
          (unsigned long long)r->nrecords, r->align, (unsigned long long)size);
  for (uint32_t n = 0; n < r->nnames; n++) {
    uint64_t count = 0, stored = 0, raw = 0, jpegs = 0, clean = 0;
    uint32_t codecs = 0;
    for (uint64_t f = 0; f < r->nfields_total; f++)
      if (r->fields[f].name == n) {
        count++;
        stored += r->fields[f].size;
        raw += r->fields[f].raw_size;
        codecs |= 1u << r->fields[f].codec;
        const dl__codec *image = dl__codec_of_rfs(r->fields[f].codec);
        bool jpeg = image && image->id == DL__CODEC_JPEG;
        jpegs += jpeg;
        clean += jpeg && r->fields[f].scan == DL__RFS_SCAN_CLEAN; /* the byte means nothing elsewhere */
      }
    fprintf(out, "  field %-12s %8llu records  %12llu bytes stored  %12llu decoded  codec", r->names[n],
            (unsigned long long)count, (unsigned long long)stored, (unsigned long long)raw);
    for (int c = 0; c < DL__RFS_CODECS; c++)
      if (codecs & (1u << c))
        fprintf(out, " %s", dl__rfs_codec_name(c));
    /* What a GPU run's first epoch need not read (docs/format.md): none from a writer before it. */
    if (jpegs)
      fprintf(out, "  (%llu of %llu JPEGs read clean by the writer)", (unsigned long long)clean,
              (unsigned long long)jpegs);
    fprintf(out, "\n");
  }
  if (r->classes)
    list_classes(r->classes, r->nclasses, verbose, out);
  for (uint64_t i = 0; verbose && i < r->nrecords; i++) {
    const dl__rfs_record *rec = &r->records[i];
    fprintf(out, "  %llu %s label %lld offset %llu size %u:", (unsigned long long)i, r->keys + rec->key,
            (long long)rec->label, (unsigned long long)rec->offset, rec->size);
    for (uint16_t f = 0; f < rec->nfields; f++) {
      const dl__rfs_field *fd = &r->fields[rec->first_field + f];
      fprintf(out, " %s=%s:%u", r->names[fd->name], dl__rfs_codec_name(fd->codec), fd->size);
    }
    fprintf(out, "\n");
  }
}

int dl_tool_list(const char *path, bool verbose, FILE *out) {
  char index[DL__MSG_MAX];
  if (dl__is_index_file(path, index, sizeof index))
    return dl__fail(DL_ENOSAMPLES, "%s", index);
  const dl__format *f = dataset_at(path);
  if (f)
    return list_dataset(path, f, verbose, out);
  char name[4096];
  dl_tool_shown(path, name, sizeof name);
  dl__rfs r;
  uint64_t size;
  int k = rfs_at(path, name, &r, &size);
  if (k)
    return k < 0 ? k : list_tar(path, name, verbose, out);
  list_rfs(&r, name, size, verbose, out);
  dl__rfs_free(&r);
  return 0;
}
