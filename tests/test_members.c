/* Members other than the image, label and tensors (captions, JSON, binary) as bytes fields:
 * aligned with their samples under shuffling, several workers and rank splits; absent members
 * NULL; fields= keeps only what it names. */
#include "members_check.h"

#include <sys/stat.h>
#include <unistd.h>

int main(void) {
  char dir[256], path[300];
  snprintf(dir, sizeof dir, "/tmp/ringfeed-members-%d", (int)getpid());
  ASSERT_EQ(mkdir(dir, 0755), 0);
  snprintf(path, sizeof path, "%s/members.tar", dir);
  members_write(path);
  ASSERT_EQ(members_run(path, "batch_size=7 workers=4 image_size=16 shuffle=1 seed=9 log=quiet"), MEMBERS_SAMPLES);
  int seen = 0;
  for (int r = 0; r < 3; r++) {
    char opts[200];
    snprintf(opts, sizeof opts, "batch_size=4 workers=2 image_size=16 rank=%d world_size=3 log=quiet", r);
    seen += members_run(path, opts);
  }
  ASSERT_EQ(seen, MEMBERS_SAMPLES);
  /* fields=: only the named field, the rest not even read. */
  dl_loader *l;
  OPEN_OK(l, path, "batch_size=8 image_size=16 fields=caption.txt log=quiet");
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  ASSERT_EQ(dl_batch_bytes_count(b), 1);
  ASSERT_STR_EQ(dl_batch_bytes_name(b, 0), "caption.txt");
  ASSERT(dl_batch_bytes(b, "bin", 0, NULL) == NULL);
  dl_batch_release(b, NULL);
  dl_close(l);
  ASSERT_EQ(dl_open(&l, path, "fields=caption log=quiet"), DL_EOPTION);
  ASSERT_CONTAINS(dl_last_error(), "caption.txt");
  ASSERT_EQ(dl_open(&l, path, "fields=a,,b log=quiet"), DL_EOPTION);
  printf("captions, JSON and binary members reach their samples; absent ones are NULL; fields= filters\n");
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT_EQ(system(cmd), 0);
  return 0;
}
