/* Which backend reads local files: io_uring where it can be set up, else blocking pread. */
#include "io/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const dl__io_ops *dl__io_choose(int mode, char *reason, size_t cap, int *err) {
  *err = 0;
  const char *env = getenv("DL_IO");
  if (env && !strcmp(env, "pread")) {
    snprintf(reason, cap, "DL_IO=pread in the environment");
    return &dl__io_pread_ops;
  }
  if (mode == DL__IO_PREAD || mode == DL__IO_MMAP) {
    /* With io=mmap only files opened per sample are read, and those with pread. */
    snprintf(reason, cap, mode == DL__IO_PREAD ? "io=pread was asked for" : "io=mmap: shards mapped, read in place");
    return &dl__io_pread_ops;
  }
  dl__io probe = {0};
  int r = dl__io_uring_ops.init(&probe, 4);
  if (r == 0) {
    dl__io_uring_ops.fini(&probe);
    snprintf(reason, cap, "io_uring is available");
    return &dl__io_uring_ops;
  }
#ifdef DL_WITH_IO_URING
  snprintf(reason, cap, "io_uring could not be set up (%s)", strerror(-r));
#else
  snprintf(reason, cap, "built without io_uring");
#endif
  if (mode == DL__IO_URING) {
    *err = dl__fail(r, "option io=uring: %s", reason);
    return NULL;
  }
  return &dl__io_pread_ops;
}
