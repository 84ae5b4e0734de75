/* libFuzzer entry point for the option parser: any text as dl_open's options; what it accepts
 * must be usable as it stands (sizes positive, indices in range; workers, prefetch and
 * memory_budget 0 mean auto, chosen by dl_open). */
#include "core.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text)
    return 0;
  memcpy(text, data, size);
  text[size] = 0;
  dl__options o;
  if (dl__options_parse(&o, text) == 0) {
    if (o.batch_size < 1 || o.workers < 0 || o.prefetch < 0 || o.memory_budget < 0 || o.height < 1 || o.width < 1 || o.io_depth < 0 ||
        o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size || o.epochs < 0 || o.ndevices < 0 ||
        o.ndevices > DL__MAX_DEVICES || (o.channels != 1 && o.channels != 3) || o.max_pixels < 1 ||
        o.max_member_bytes < 1 || memchr(o.resume, 0, sizeof o.resume) == NULL)
      abort();
  }
  free(text);
  return 0;
}
