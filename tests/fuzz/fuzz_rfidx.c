/* libFuzzer entry point for cached tar indexes (.rfidx): any bytes as a cache file. The target
 * takes the shard identity from the input's own header and writes today's magic and its checksum,
 * so inputs (and seeds made under an older magic) reach the records instead of stopping at the
 * magic, identity or hash check. A table it accepts must lie
 * inside the shard it describes. */
#include "core.h"

#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 80)
    return 0;
  uint8_t *p = malloc(size);
  if (!p)
    return 0;
  memcpy(p, data, size);
  memcpy(p, DL__INDEX_FILE_MAGIC, 8);
  uint64_t sum = XXH64(p, size - 8, 0);
  memcpy(p + size - 8, &sum, 8);
  dl__shard_id id = {.size = get64(p + 8), .mtime_ns = (int64_t)get64(p + 16), .ctime_ns = (int64_t)get64(p + 24),
                     .ino = get64(p + 32), .edges = get64(p + 40)};
  dl__dataset ds = {0};
  if (dl__index_file_parse(&ds, 0, p, size, &id) == 0) {
    for (size_t i = 0; i < ds.n; i++) {
      const dl__sample *s = &ds.samples[i];
      if (s->offset + s->size > id.size || (uint64_t)s->image_at + s->image_len > s->size ||
          s->name >= ds.pool_len || s->key >= ds.pool_len || s->first_ref + s->nrefs > ds.nrefs)
        abort();
      for (uint32_t r = s->first_ref; r < s->first_ref + s->nrefs; r++)
        if ((uint64_t)ds.refs[r].at + ds.refs[r].len > s->size || ds.refs[r].name >= ds.nfield_names)
          abort();
    }
  }
  dl__dataset_free(&ds);
  free(p);
  return 0;
}
