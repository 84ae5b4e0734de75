/*
 * ImageFolder sources as torchvision reads them: root/<class>/.../<image>, classes sorted by name,
 * files sorted by (folder, name) within a class; the class index is the label.
 */
#include "source/source.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct entry {
  char *dir;  /* relative to the class folder, "" at its top */
  char *name;
  uint64_t size;
  dl__file_seen seen;
} entry;

typedef struct entries {
  entry *v;
  size_t n, cap;
} entries;

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_entry(const void *a, const void *b) {
  const entry *x = a, *y = b;
  int c = strcmp(x->dir, y->dir);
  return c ? c : strcmp(x->name, y->name);
}

static int image_codec(const char *name) { return strrchr(name, '.') ? dl__codec_of_ext(name) : DL__CODEC_NONE; }

/* The folders from the root down to the one being listed: a symlink back to one of them would
 * list the same images again and again (under another class, for a link to the root). */
typedef struct chain {
  dev_t dev;
  ino_t ino;
  const struct chain *up;
} chain;

/* Files an ImageFolder leaves out, by extension (the first few kinds), for one warning. */
typedef struct left_out {
  size_t n;
  char ext[6][16];
  size_t count[6];
  int kinds;
  size_t unreadable;    /* entries stat() fails on (a link to nothing, a mount gone) */
  char first_unreadable[PATH_MAX + 64];
} left_out;

static void leave_out(left_out *lo, const char *name) {
  const char *dot = strrchr(name, '.');
  char ext[16];
  snprintf(ext, sizeof ext, "%s", dot ? dot : "(no extension)");
  for (char *c = ext; *c; c++)
    *c = (char)tolower((unsigned char)*c);
  lo->n++;
  for (int k = 0; k < lo->kinds; k++)
    if (!strcmp(lo->ext[k], ext)) {
      lo->count[k]++;
      return;
    }
  if (lo->kinds < (int)DL__ARRAY_LEN(lo->ext)) {
    memcpy(lo->ext[lo->kinds], ext, sizeof ext);
    lo->count[lo->kinds++] = 1;
  }
}

/* An entry of PATH that cannot be read, for WHY (stat()'s errno, or DL__NOT_REGULAR), counted for
 * one warning. */
static void unreadable(left_out *lo, const char *path, const char *why) {
  if (!lo->unreadable++)
    snprintf(lo->first_unreadable, sizeof lo->first_unreadable, "%s: %s", path, why);
}

static void warn_unreadable(const char *root, const left_out *lo) {
  if (lo->unreadable)
    dl__log(DL__LOG_WARN, "source %s: %zu entr%s could not be read and %s left out (%s%s)", root, lo->unreadable,
            lo->unreadable == 1 ? "y" : "ies", lo->unreadable == 1 ? "was" : "were", lo->first_unreadable,
            lo->unreadable > 1 ? ", ..." : "");
}

/* The warnings of what ROOT's listing left out: files that are not WHAT, by kind, and the entries
 * it could not read. */
static void warn_left_out(const char *root, const left_out *lo, const char *what) {
  if (lo->n) {
    char kinds[256] = "";
    for (int k = 0; k < lo->kinds; k++)
      snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%zu %s", k ? ", " : "", lo->count[k],
               lo->ext[k]);
    dl__log(DL__LOG_WARN, "source %s: %zu %s not %s %s left out (%s%s)", root, lo->n,
            lo->n == 1 ? "file that is" : "files that are", what, lo->n == 1 ? "was" : "were", kinds,
            lo->kinds == (int)DL__ARRAY_LEN(lo->ext) ? ", ..." : "");
  }
  warn_unreadable(root, lo);
}

static int walk(const char *base, const char *rel, entries *out, left_out *skipped, const chain *up) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s%s%s", base, *rel ? "/" : "", rel);
  struct stat here;
  if (stat(path, &here))
    return dl__fail(-errno, "source %s: %s", path, strerror(errno));
  for (const chain *c = up; c; c = c->up)
    if (c->dev == here.st_dev && c->ino == here.st_ino) {
      dl__log(DL__LOG_WARN, "source %s: a link back to an enclosing folder; not listed again", path);
      return 0;
    }
  chain me = {here.st_dev, here.st_ino, up};
  DIR *d = opendir(path);
  if (!d)
    return dl__fail(-errno, "source %s: %s", path, strerror(errno));
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(d)) && !rc) {
    if (de->d_name[0] == '.')
      continue;
    char full[PATH_MAX], sub[PATH_MAX];
    snprintf(full, sizeof full, "%s/%s", path, de->d_name);
    snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", de->d_name);
    struct stat st;
    if (stat(full, &st)) {
      unreadable(skipped, full, strerror(errno));
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      rc = walk(base, sub, out, skipped, &me);
    } else if (!S_ISREG(st.st_mode)) {
      if (image_codec(de->d_name) != DL__CODEC_NONE) /* reading a FIFO would wait for a writer */
        unreadable(skipped, full, DL__NOT_REGULAR);
    } else {
      if (image_codec(de->d_name) == DL__CODEC_NONE) {
        leave_out(skipped, de->d_name);
        continue;
      }
      if (out->n == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 256;
        entry *v = realloc(out->v, cap * sizeof *v);
        if (!v) {
          rc = dl__fail(-ENOMEM, "out of memory listing %s", path);
          break;
        }
        out->v = v;
        out->cap = cap;
      }
      entry *e = &out->v[out->n];
      e->dir = strdup(rel);
      e->name = strdup(de->d_name);
      e->size = (uint64_t)st.st_size;
      dl__file_seen_of(&st, &e->seen);
      if (!e->dir || !e->name) {
        free(e->dir);
        free(e->name);
        rc = dl__fail(-ENOMEM, "out of memory listing %s", path);
        break;
      }
      out->n++;
    }
  }
  closedir(d);
  return rc;
}

/* The label in the .cls file of KEY (KLEN bytes) among FILES[I..N), the files of ROOT in name order
 * (those of one key are next to each other), or -1. */
static int64_t label_of(const char *root, char **files, size_t i, size_t n, const char *key, size_t klen) {
  for (; i < n && !strncmp(files[i], key, klen) && files[i][klen] == '.'; i++) {
    if (strcasecmp(files[i] + klen, ".cls"))
      continue;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", root, files[i]);
    uint8_t text[64];
    int fd = dl__open_regular(path, "source", NULL);
    int64_t got = fd < 0 ? -1 : dl__pread_full(fd, text, sizeof text, 0);
    if (fd >= 0)
      close(fd);
    const char *why = "is not an integer";
    int64_t label = got > 0 && (size_t)got < sizeof text ? dl__parse_label(text, (size_t)got, &why) : -1;
    if (why)
      dl__log(DL__LOG_WARN, "source %s: %s holds no integer label: its text %s; using -1", root, files[i], why);
    return why ? -1 : label;
  }
  return -1;
}

/*
 * A folder with no class folders: every file is a sample named by its stem, a JPEG/PNG image or a
 * .npy (.npy.zst) tensor field named as in WebDataset ("k.depth.npy" is field "depth", "k.npy"
 * field "npy"), labelled by the .cls file of its key where there is one (a WebDataset shard
 * unpacked into a folder). Files are taken in name order.
 */
static int flat_load(dl__dataset *ds, const char *root, char **files, size_t n) {
  int rc = 0;
  left_out skipped = {0};
  size_t run = 0, run_len = 0; /* the files of the current key: from RUN, its key RUN_LEN bytes */
  int64_t run_label = -1;
  for (size_t i = 0; i < n && !rc; i++) {
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", root, files[i]);
    if (stat(path, &st)) {
      unreadable(&skipped, path, strerror(errno));
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      unreadable(&skipped, path, DL__NOT_REGULAR);
      continue;
    }
    const char *dot = strchr(files[i], '.');
    if (!dot)
      continue;
    size_t klen = (size_t)(dot - files[i]);
    if (i == 0 || klen != run_len || strncmp(files[i], files[run], klen)) {
      run = i;
      run_len = klen;
      run_label = label_of(root, files, i, n, files[i], klen);
    }
    const char *ext = dot + 1;
    size_t elen = strlen(ext);
    bool zst = elen > 4 && !strcasecmp(ext + elen - 4, ".zst");
    size_t stem = zst ? elen - 4 : elen;
    bool npy = stem >= 3 && !strncasecmp(ext + stem - 3, "npy", 3) && (stem == 3 || ext[stem - 4] == '.');
    int codec = image_codec(files[i]);
    if (!npy && codec == DL__CODEC_NONE) {
      if (strcasecmp(ext, "cls"))
        leave_out(&skipped, files[i]);
      continue;
    }
    dl__sample s = {.size = (uint64_t)st.st_size, .label = run_label, .codec = (uint8_t)codec,
                    .image_len = codec ? (uint32_t)(st.st_size < UINT32_MAX ? st.st_size : UINT32_MAX) : 0};
    if ((rc = dl__dataset_add_file(ds, path, &s.file)))
      break;
    dl__file_seen seen;
    dl__file_seen_of(&st, &seen);
    dl__dataset_file_named(ds, s.file, &seen, sizeof seen);
    if (npy) {
      int f = dl__dataset_field(ds, ext, stem == 3 ? 3 : stem - 4);
      dl__fref ref = {.name = (uint16_t)f, .kind = zst ? DL__REF_NPY_ZST : DL__REF_NPY,
                      .len = (uint32_t)(st.st_size < UINT32_MAX ? st.st_size : UINT32_MAX)};
      s.first_ref = (uint32_t)ds->nrefs;
      s.nrefs = 1;
      if (f < 0 || dl__dataset_add_ref(ds, &ref))
        rc = dl__fail(DL_ELIMIT, "source %s: more than %d tensor fields", root, DL__MAX_FIELDS);
    }
    if (!rc && ((s.name = dl__dataset_intern(ds, files[i], strlen(files[i]))) == UINT32_MAX ||
                (s.key = dl__dataset_intern(ds, files[i], (size_t)(dot - files[i]))) == UINT32_MAX ||
                dl__dataset_push(ds, &s)))
      rc = dl__fail(-ENOMEM, "out of memory listing %s", root);
  }
  if (!ds->n)
    skipped.n = 0; /* a folder of nothing to load: the error that follows says so */
  if (!rc)
    warn_left_out(root, &skipped, "an image, .npy or .cls");
  return rc;
}

int dl__folder_load(dl__dataset *ds, const char *root) {
  DIR *d = opendir(root);
  if (!d)
    return dl__fail(-errno, "source %s: %s", root, strerror(errno));
  char **classes = NULL;
  size_t nclasses = 0, cap = 0;
  left_out skipped = {0};
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.')
      continue;
    char full[PATH_MAX];
    struct stat st;
    snprintf(full, sizeof full, "%s/%s", root, de->d_name);
    if (stat(full, &st) || !S_ISDIR(st.st_mode))
      continue;
    if (nclasses == cap) {
      cap = cap ? cap * 2 : 64;
      char **v = realloc(classes, cap * sizeof *v);
      if (!v) {
        rc = dl__fail(-ENOMEM, "out of memory listing %s", root);
        break;
      }
      classes = v;
    }
    if (!(classes[nclasses] = strdup(de->d_name))) {
      rc = dl__fail(-ENOMEM, "out of memory listing %s", root);
      break;
    }
    nclasses++;
  }
  closedir(d);
  if (!rc && nclasses == 0) {
    /* No class folders: a flat folder of files. */
    char **files = NULL;
    size_t nfiles = 0, fcap = 0;
    bool shards = false;
    DIR *fd = opendir(root);
    while (fd && (de = readdir(fd))) {
      if (de->d_name[0] == '.')
        continue;
      if (nfiles == fcap) {
        fcap = fcap ? fcap * 2 : 256;
        char **v = realloc(files, fcap * sizeof *v);
        if (!v) {
          rc = dl__fail(-ENOMEM, "out of memory listing %s", root); /* not a part of the folder */
          break;
        }
        files = v;
      }
      if (!(files[nfiles] = strdup(de->d_name))) {
        rc = dl__fail(-ENOMEM, "out of memory listing %s", root);
        break;
      }
      const char *ext = strrchr(de->d_name, '.');
      shards |= ext && (!strcmp(ext, ".tar") || !strcmp(ext, ".rfs"));
      nfiles++;
    }
    if (fd)
      closedir(fd);
    if (!rc) {
      qsort(files, nfiles, sizeof *files, cmp_str);
      rc = flat_load(ds, root, files, nfiles);
    }
    for (size_t i = 0; i < nfiles; i++)
      free(files[i]);
    free(files);
    if (!rc && ds->n == 0)
      rc = dl__fail(DL_ENOSAMPLES, "source %s: no class folders (root/<class>/<image>) and no image or .npy files%s",
                    root, shards ? " (it holds shards: give them by a glob or a brace range, as DIR/*.tar)" : "");
    return rc;
  }
  if (!rc)
    qsort(classes, nclasses, sizeof *classes, cmp_str);
  struct stat top_st;
  if (!rc && stat(root, &top_st))
    rc = dl__fail(-errno, "source %s: %s", root, strerror(errno));
  chain top = {rc ? 0 : top_st.st_dev, rc ? 0 : top_st.st_ino, NULL};
  size_t first = ds->n;
  size_t empty = 0, empty_first = 0;
  for (size_t c = 0; c < nclasses && !rc; c++) {
    char cdir[PATH_MAX];
    snprintf(cdir, sizeof cdir, "%s/%s", root, classes[c]);
    entries es = {0};
    rc = walk(cdir, "", &es, &skipped, &top);
    if (!rc && es.n) /* an empty class folder has no array to sort */
      qsort(es.v, es.n, sizeof *es.v, cmp_entry);
    if (!rc && !es.n && !empty++)
      empty_first = c;
    for (size_t i = 0; i < es.n && !rc; i++) {
      char path[PATH_MAX], name[PATH_MAX];
      const entry *e = &es.v[i];
      snprintf(path, sizeof path, "%s%s%s/%s", cdir, *e->dir ? "/" : "", e->dir, e->name);
      snprintf(name, sizeof name, "%s/%s%s%s", classes[c], e->dir, *e->dir ? "/" : "", e->name);
      dl__sample s = {.size = e->size, .label = (int64_t)c, .codec = (uint8_t)image_codec(e->name),
                      .image_len = (uint32_t)(e->size < UINT32_MAX ? e->size : UINT32_MAX)};
      const char *dot = strrchr(name, '.');
      rc = dl__dataset_add_file(ds, path, &s.file);
      if (!rc)
        dl__dataset_file_named(ds, s.file, &e->seen, sizeof e->seen);
      if (!rc && ((s.name = dl__dataset_intern(ds, name, strlen(name))) == UINT32_MAX ||
                  (s.key = dl__dataset_intern(ds, name, (size_t)(dot - name))) == UINT32_MAX))
        rc = dl__fail(-ENOMEM, "out of memory listing %s", root);
      if (!rc && dl__dataset_push(ds, &s))
        rc = dl__fail(-ENOMEM, "out of memory listing %s", root);
    }
    for (size_t i = 0; i < es.n; i++) {
      free(es.v[i].dir);
      free(es.v[i].name);
    }
    free(es.v);
  }
  if (!rc && empty) /* a class without samples: a copy cut short, or a filter gone wrong */
    dl__log(DL__LOG_WARN, "source %s: %zu class %s no image (%s%s, label %zu); labels count %s as "
            "torchvision's class_to_idx does (its ImageFolder refuses such a folder)", root, empty,
            empty == 1 ? "folder holds" : "folders hold", empty == 1 ? "" : "the first: ",
            classes[empty_first], empty_first, empty == 1 ? "it" : "them");
  if (!rc)
    dl__dataset_classes(ds, &classes, (uint32_t)nclasses, ds->n - first);
  for (size_t c = 0; classes && c < nclasses; c++)
    free(classes[c]);
  free(classes);
  char exts[96];
  if (!rc)
    warn_left_out(root, &skipped, dl__codec_exts(exts, sizeof exts, "/"));
  return rc;
}

static bool folder_by_name(const char *path, const struct stat *st) {
  (void)path;
  return st && S_ISDIR(st->st_mode);
}

static int folder_open(dl__dataset *ds, const char *path, const dl__options *o) {
  (void)o;
  return dl__folder_load(ds, path);
}

const dl__format dl__folder_format = {.name = "folder", .what = "image folder", .by_name = folder_by_name,
                                      .open = folder_open, .verify = dl__dataset_verify};
