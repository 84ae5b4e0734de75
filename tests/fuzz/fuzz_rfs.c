/* libFuzzer entry point for the ringfeed shard reader: any bytes as a .rfs file, through the
 * trailer, index, record and class table checks; every record it accepts must lie inside the file,
 * and every class it names have a name. */
#include "core.h"
#include "fuzz_input.h"

#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = fuzz_input_fd(data, size);
  if (fd < 0)
    return 0;
  dl__rfs r;
  char why[256];
  if (dl__rfs_open(&r, fd, size, why, sizeof why) == 0) {
    for (uint64_t i = 0; i < r.nrecords; i++) {
      const dl__rfs_record *rec = &r.records[i];
      if (rec->offset + rec->size > size || rec->key >= r.keys_len)
        abort();
      for (uint16_t f = 0; f < rec->nfields; f++) {
        const dl__rfs_field *fd_ = &r.fields[rec->first_field + f];
        if ((uint64_t)fd_->offset + fd_->size > rec->size || fd_->name >= r.nnames)
          abort();
      }
    }
    for (uint32_t c = 0; c < r.nclasses; c++)
      if (!r.classes[c] || !*r.classes[c])
        abort();
    dl__rfs_free(&r);
  }
  close(fd);
  return 0;
}
