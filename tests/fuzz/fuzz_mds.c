/* libFuzzer entry point for MosaicML Streaming's MDS datasets: an input is an index.json, a NUL,
 * then the bytes of shard.00000.mds (what an index's "raw_data" usually names), written into a
 * folder of this process's own and opened as a source (an index naming it as zip_data has it
 * decompressed). Every sample handed on must lie inside its shard, and every tensor value it
 * names must parse to data inside it, or fail cleanly. */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64], index_path[96], shard_path[96];

static void remove_folder(void) {
  char cached[128];
  snprintf(cached, sizeof cached, "%s.rfidx", shard_path); /* the sample table's cache */
  unlink(index_path);
  unlink(shard_path);
  unlink(cached);
  rmdir(dir);
}

static bool put(const char *path, const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "wb");
  bool ok = f && fwrite(p, 1, n, f) == n;
  return f && !fclose(f) && ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!dir[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%.40s/fuzz-mds-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
      abort();
    snprintf(index_path, sizeof index_path, "%s/index.json", dir);
    snprintf(shard_path, sizeof shard_path, "%s/shard.00000.mds", dir);
    atexit(remove_folder);
  }
  const uint8_t *nul = memchr(data, 0, size);
  size_t index_len = nul ? (size_t)(nul - data) : size;
  const uint8_t *shard = nul ? nul + 1 : data + size;
  size_t shard_len = (size_t)(data + size - shard);
  if (!put(index_path, data, index_len) || !put(shard_path, shard, shard_len))
    abort();
  static dl__options o;
  if (!o.max_pixels && dl__options_parse(&o, ""))
    abort();
  dl__dataset ds = {0};
  if (dl__mds_load(&ds, dir, &o) == 0) {
    for (size_t i = 0; i < ds.n; i++) {
      const dl__sample *s = &ds.samples[i];
      /* The shard as written, or its decompressed copy when the index names it compressed. */
      struct stat st;
      if (fstat(ds.fds[s->file], &st) || s->offset + s->size > (uint64_t)st.st_size ||
          (uint64_t)s->image_at + s->image_len > s->size)
        abort();
      uint8_t *sample = malloc(s->size ? s->size : 1);
      if (!sample || dl__pread_full(ds.fds[s->file], sample, s->size, s->offset) != (int64_t)s->size)
        abort();
      for (uint8_t r = 0; r < s->nrefs; r++) {
        const dl__fref *ref = &ds.refs[s->first_ref + r];
        if ((uint64_t)ref->at + ref->len > s->size)
          abort();
        if (ref->kind != DL__REF_MDS)
          continue;
        const uint8_t *p = sample + ref->at;
        dl__npy v;
        dl__err e = {0};
        if (!dl__mds_parse(&ds.mds[ref->name], p, ref->len, &v, &e) && (v.data < p || v.data + v.bytes > p + ref->len))
          abort();
      }
      free(sample);
    }
  }
  dl__dataset_free(&ds);
  return 0;
}
