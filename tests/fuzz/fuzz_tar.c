/* libFuzzer entry point for the tar scanner: any bytes as a shard, through index building. */
#include "core.h"
#include "fuzz_input.h"

#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = fuzz_input_fd(data, size);
  if (fd < 0)
    return 0;
  dl__log_level = DL__LOG_QUIET;
  dl__dataset ds = {0};
  uint32_t file;
  if (dl__dataset_add_file(&ds, "fuzz.tar", &file) == 0) {
    dl__tar_scan(&ds, file, fd, size, DL__ON_ERROR_SKIP);
    for (size_t i = 0; i < ds.n; i++) /* every sample must lie inside the file */
      if (ds.samples[i].codec != DL__CODEC_NONE && ds.samples[i].offset > size)
        abort();
  }
  dl__dataset_free(&ds);
  close(fd);
  return 0;
}
