/* The token source ("tokens:PATHS"): pretraining corpora as flat files of token ids. */
#include "source/source.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Token files: flat arrays of uint16 or uint32 tokens, as pretraining pipelines write them. Each
 * file gives (tokens - 1) / L windows of L + 1 tokens (inputs and shifted targets), never across
 * files. */
int dl__tokens_load(dl__dataset *ds, const char *paths, int token_bytes, int seq_len) {
  int field = dl__dataset_field(ds, "tokens", 6);
  if (field < 0)
    return dl__fail(-ENOMEM, "out of memory");
  char **list = NULL;
  size_t n = 0;
  int r = dl__source_paths(paths, &list, &n);
  for (size_t i = 0; i < n && !r; i++) {
    const char *path = list[i];
    uint32_t file;
    struct stat st;
    if (dl__is_url(path)) {
      r = dl__fail(DL_EUNSUPPORTED, "source tokens:%s: token files are read from local disk only", path);
      break;
    }
    int fd = dl__open_regular(path, "source tokens:", &st);
    if (fd < 0) {
      r = fd;
      break;
    }
    if ((r = dl__dataset_add_file(ds, path, &file))) {
      close(fd);
      break;
    }
    ds->fds[file] = fd;
    uint64_t tokens = (uint64_t)st.st_size / (uint64_t)token_bytes;
    uint64_t windows = tokens > 1 ? (tokens - 1) / (uint64_t)seq_len : 0;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (uint64_t w = 0; w < windows && !r; w++) {
      char key[300];
      int kl = snprintf(key, sizeof key, "%.250s:%llu", base, (unsigned long long)w);
      uint32_t size = (uint32_t)((uint64_t)(seq_len + 1) * (uint64_t)token_bytes);
      dl__sample s = {.offset = w * (uint64_t)seq_len * (uint64_t)token_bytes, .size = size, .label = -1,
                      .file = file, .first_ref = (uint32_t)ds->nrefs, .nrefs = 1};
      dl__fref ref = {.name = (uint16_t)field, .kind = DL__REF_TOKENS, .at = 0, .len = size};
      s.key = s.name = dl__dataset_intern(ds, key, (size_t)kl);
      if (s.key == UINT32_MAX || dl__dataset_add_ref(ds, &ref) || dl__dataset_push(ds, &s))
        r = dl__fail(-ENOMEM, "out of memory listing tokens:%s", path);
    }
  }
  for (size_t i = 0; i < n; i++)
    free(list[i]);
  free(list);
  if (!r && ds->n == 0)
    r = dl__fail(DL_ENOSAMPLES, "source tokens:%s: no window of seq_len=%d + 1 tokens", paths, seq_len);
  return r;
}
