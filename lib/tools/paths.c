/* The tools' paths, files and URLs (tools.h): the loader's own expansion and helpers, for them. */
#include "tools.h"
#include "source/source.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int dl_tool_paths(const char *arg, char ***paths, size_t *n, FILE *err, const char *who) {
  char **braced = NULL, **out = NULL;
  size_t nb = 0, count = 0, cap = 0;
  *paths = NULL;
  *n = 0;
  if (dl__expand_braces(arg, &braced, &nb)) {
    fprintf(err, "%s%s\n", who, dl_last_error());
    return -1;
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
        fprintf(err, "%s%s: %s\n", who, braced[i],
                !listable ? "an HTTP server cannot be listed (name the shards)" : dl_last_error());
        ok = false;
      }
      dl__remote_free(&tmp);
    } else if (pattern && glob(braced[i], 0, NULL, &g)) {
      fprintf(err, "%s%s: no file matches\n", who, braced[i]);
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
    for (size_t j = 0; ok && j < add; j++) {
      const char *path = !pattern ? braced[i] : url ? listed[j] : g.gl_pathv[j];
      if (!url && dl__is_index_file(path, NULL, 0)) /* the shards' own indexes, saved beside them */
        continue;
      if (!(out[count++] = strdup(path)))
        ok = false;
    }
    if (pattern && !url)
      globfree(&g);
    for (size_t j = 0; j < nlisted; j++)
      free(listed[j]);
    free(listed);
  }
  dl_tool_free_paths(braced, nb);
  if (!ok) {
    dl_tool_free_paths(out, count);
    return -1;
  }
  *paths = out;
  *n = count;
  return 0;
}

void dl_tool_free_paths(char **paths, size_t n) {
  for (size_t i = 0; paths && i < n; i++)
    free(paths[i]);
  free(paths);
}

bool dl_tool_is_url(const char *path) { return dl__is_url(path); }

void dl_tool_options(FILE *out, bool markdown) { dl__options_doc(out, markdown); }

const char *dl_tool_shown(const char *path, char *buf, size_t cap) {
  snprintf(buf, cap, "%s", path);
  dl__without_credentials(buf);
  return buf;
}

bool dl_tool_nearer(const char *typed, const char *name, int *least) {
  return dl__nearer(typed, name, least);
}

int dl_tool_open_regular(const char *path, const char *what) { return dl__open_regular(path, what, NULL); }

int dl_tool_mkdirs(const char *dir) { return dl__mkdirs(dir); }

int64_t dl_tool_pread(int fd, void *buf, size_t n, uint64_t off) { return dl__pread_full(fd, buf, n, off); }

int dl_tool_upload(const char *path, const char *url) {
  dl__options o;
  dl__options_parse(&o, NULL);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  int r = fd < 0 || fstat(fd, &st) ? dl__fail(-errno, "%s: %s", path, strerror(errno))
                                   : dl__remote_put(url, &o, fd, (uint64_t)st.st_size);
  if (fd >= 0)
    close(fd);
  return r;
}
