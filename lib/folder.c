/*
 * ImageFolder sources as torchvision reads them: root/<class>/.../<image>, classes sorted by name,
 * files sorted by (folder, name) within a class; the class index is the label.
 */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

typedef struct entry {
  char *dir;  /* relative to the class folder, "" at its top */
  char *name;
  uint64_t size;
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

static int image_codec(const char *name) {
  const char *dot = strrchr(name, '.');
  if (!dot)
    return DL__CODEC_NONE;
  if (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"))
    return DL__CODEC_JPEG;
  if (!strcasecmp(dot, ".png"))
    return DL__CODEC_PNG;
  return DL__CODEC_NONE;
}

static int walk(const char *base, const char *rel, entries *out, size_t *skipped) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s%s%s", base, *rel ? "/" : "", rel);
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
    if (stat(full, &st))
      continue;
    if (S_ISDIR(st.st_mode)) {
      rc = walk(base, sub, out, skipped);
    } else if (S_ISREG(st.st_mode)) {
      if (image_codec(de->d_name) == DL__CODEC_NONE) {
        (*skipped)++;
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

int dl__folder_load(dl__dataset *ds, const char *root) {
  DIR *d = opendir(root);
  if (!d)
    return dl__fail(-errno, "source %s: %s", root, strerror(errno));
  char **classes = NULL;
  size_t nclasses = 0, cap = 0, skipped = 0;
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
  if (!rc && nclasses == 0)
    rc = dl__fail(DL_ENOSAMPLES, "source %s: a folder source needs class folders (root/<class>/<image>)",
                  root);
  if (!rc)
    qsort(classes, nclasses, sizeof *classes, cmp_str);
  for (size_t c = 0; c < nclasses && !rc; c++) {
    char cdir[PATH_MAX];
    snprintf(cdir, sizeof cdir, "%s/%s", root, classes[c]);
    entries es = {0};
    rc = walk(cdir, "", &es, &skipped);
    if (!rc)
      qsort(es.v, es.n, sizeof *es.v, cmp_entry);
    for (size_t i = 0; i < es.n && !rc; i++) {
      char path[PATH_MAX], name[PATH_MAX];
      const entry *e = &es.v[i];
      snprintf(path, sizeof path, "%s%s%s/%s", cdir, *e->dir ? "/" : "", e->dir, e->name);
      snprintf(name, sizeof name, "%s/%s%s%s", classes[c], e->dir, *e->dir ? "/" : "", e->name);
      dl__sample s = {.size = e->size, .label = (int64_t)c, .codec = (uint8_t)image_codec(e->name)};
      const char *dot = strrchr(name, '.');
      rc = dl__dataset_add_file(ds, path, &s.file);
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
  for (size_t c = 0; c < nclasses; c++)
    free(classes[c]);
  free(classes);
  if (!rc && skipped)
    dl__log(DL__LOG_INFO, "source %s: %zu files that are not .jpg/.jpeg/.png were left out", root,
            skipped);
  return rc;
}
