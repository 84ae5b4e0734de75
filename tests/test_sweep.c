/*
 * Every third-party test file goes through the loader as a member of a shard (GNU tar and Python
 * tarfile): well-formed 8-bit JPEGs and PNGs decode, 12/16-bit and lossless JPEGs are refused as
 * unsupported, and everything else fails alone with a message naming shard, member and reason.
 * Run under ASan/UBSan too: no crash, no leak, whatever the bytes.
 */
#include "ringfeed.h"
#include "test.h"

#include <stdbool.h>

typedef struct row {
  char member[32], path[1024], kind[32], attrs[512], check[512];
} row;

static int expected(const row *r) {
  /* Files from crash and fuzz corpora are malformed on purpose even where their structure looks
   * right; any outcome but a crash is acceptable. */
  if (strstr(r->path, "crash") || strstr(r->path, "fuzz"))
    return -1;
  /* Its entropy-coded data breaks off before a restart marker: an error here, not grey pixels. */
  if (strstr(r->path, "hopper_bad_exif.jpg"))
    return DL_ECORRUPT;
  if (!strcmp(r->kind, "png"))
    return strcmp(r->check, "ok") ? -1 : 0;
  if (!strcmp(r->kind, "jpeg")) {
    if (strcmp(r->check, "ok"))
      return -1;
    if (strstr(r->attrs, "lossless") || (strstr(r->attrs, "bit") && !strstr(r->attrs, " 8bit")))
      return DL_EUNSUPPORTED;
    return strstr(r->attrs, "jpeg:") ? 0 : -1;
  }
  return -1; /* anything else: some error, never a crash */
}

int main(void) {
  const char *dir = test_shards();
  char path[4096];
  snprintf(path, sizeof path, "%s/sweep.tsv", dir);
  FILE *f = fopen(path, "r");
  ASSERT(f);
  row *rows = calloc(2000, sizeof *rows);
  int n = 0;
  char line[4096];
  while (n < 2000 && fgets(line, sizeof line, f)) {
    row *r = &rows[n];
    char *fields[5] = {r->member, r->path, r->kind, r->attrs, r->check};
    size_t caps[5] = {32, 1024, 32, 512, 512};
    char *p = line;
    for (int i = 0; i < 5; i++) {
      char *end = strpbrk(p, i < 4 ? "\t" : "\n");
      if (end)
        *end = 0;
      snprintf(fields[i], caps[i], "%s", p);
      p = end ? end + 1 : p + strlen(p);
    }
    n++;
  }
  fclose(f);
  ASSERT_GT(n, 1000);
  const char *shards[] = {"sweep-gnu.tar", "sweep-py.tar"};
  int mismatches = 0;
  for (int s = 0; s < 2; s++) {
    char shard[4096];
    snprintf(shard, sizeof shard, "%s/%s", dir, shards[s]);
    dl_loader *l;
    OPEN_OK(l, shard, "batch_size=50 workers=2 shuffle=0 crop=resize image_size=24 max_pixels=40000000");
    int seen = 0, ok = 0, bad = 0;
    dl_batch *b;
    while (dl_next_batch(l, &b) == 0) {
      for (int i = 0; i < dl_batch_size(b); i++, seen++) {
        ASSERT_LT(seen, n);
        const row *r = &rows[seen];
        char key[32];
        snprintf(key, sizeof key, "%.6s", r->member);
        ASSERT_STR_EQ(dl_batch_key(b, i), key);
        DLTensor lab;
        dl_batch_field(b, "label", &lab);
        ASSERT_EQ(((int64_t *)lab.data)[i], seen + 1);
        int err = dl_batch_sample_error(b, i), want = expected(r);
        err ? bad++ : ok++;
        bool match = want == -1 ? true : want == 0 ? err == 0 : err == want;
        if (!match) {
          fprintf(stderr, "%s: %s [%s] [%s]: got %s\n", shards[s], r->path, r->attrs, r->check,
                  dl_errname(err));
          mismatches++;
        }
      }
      dl_batch_release(b, NULL);
    }
    ASSERT_EQ(seen, n);
    char stats[2048];
    ASSERT_GT(dl_stats_json(l, stats, sizeof stats), 0);
    char want_errors[64];
    snprintf(want_errors, sizeof want_errors, "\"errors\":%d,", bad);
    ASSERT_CONTAINS(stats, want_errors);
    dl_close(l);
    printf("%s: %d samples, %d decoded, %d refused\n", shards[s], seen, ok, bad);
  }
  ASSERT_EQ(mismatches, 0);

  /* With on_error=fail each bad sample is the batch's error, and its message names the member. */
  char shard[4096];
  snprintf(shard, sizeof shard, "%s/sweep-gnu.tar", dir);
  dl_loader *l;
  OPEN_OK(l, shard, "batch_size=1 workers=2 shuffle=0 crop=resize image_size=24 on_error=fail log=quiet");
  int failures = 0;
  for (int i = 0; i < n; i++) {
    dl_batch *b;
    int r = dl_next_batch(l, &b);
    if (r == 0) {
      dl_batch_release(b, NULL);
      continue;
    }
    ASSERT_LT(r, 0);
    failures++;
    ASSERT_CONTAINS(dl_last_error(), shard);
    ASSERT_CONTAINS(dl_last_error(), rows[i].member);
    ASSERT_CONTAINS(dl_last_error(), "offset");
  }
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), DL_EOF);
  dl_close(l);
  ASSERT_GT(failures, 100);
  printf("on_error=fail: %d samples failed, each with its member named\n", failures);
  free(rows);
  return 0;
}
