/*
 * The loader end to end over shards this test writes: the same stream whatever the worker count
 * or I/O backend, disjoint equal rank splits, resume tokens at the same and at another world size,
 * sources (lists, braces, globs, tar dialects, ImageFolder), the index cache, truncated shards,
 * layout=channels_last's strides, the consumer holding every slot, tensors that outlive the loader,
 * and workers whose I/O rings cannot be set up.
 */
#include "ringfeed.h"
#include "tar_writer.h"
#include "test.h"
#include "test_data.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <stdbool.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

enum { SHARDS = 4, PER_SHARD = 30, N = SHARDS * PER_SHARD };
static char dir[256];

static void write_shards(void) {
  char path[512];
  for (int s = 0; s < SHARDS; s++) {
    snprintf(path, sizeof path, "%s/part-%03d.tar", dir, s);
    FILE *f = fopen(path, "wb");
    ASSERT(f);
    for (int i = 0; i < PER_SHARD; i++) {
      long id = s * PER_SHARD + i;
      unsigned char *jpg;
      unsigned long len;
      char key[32], file[600];
      snprintf(key, sizeof key, "s%04ld", id);
      test_tar_sample(f, key, id, id % 10, &jpg, &len);
      if (id < 9) { /* an ImageFolder of the first images: three classes */
        snprintf(file, sizeof file, "%s/folder/class%ld/img%ld.jpg", dir, id % 3, id);
        test_write_file(file, jpg, len);
      }
      free(jpg);
    }
    tar_write_end(f);
    fclose(f);
  }
}

static char source[512];

typedef struct run {
  int batches;
  uint64_t digest[64];
  char keys[64][8][16];
  int len[64];
  int64_t epoch[64], index[64]; /* dl_batch_position's */
  char token[128];
} run;

static uint64_t batch_digest(dl_batch *b) {
  DLTensor img, lab;
  ASSERT_EQ(dl_batch_field(b, "image", &img), 0);
  ASSERT_EQ(dl_batch_field(b, "label", &lab), 0);
  size_t bytes = 1;
  for (int d = 0; d < img.ndim; d++)
    bytes *= (size_t)img.shape[d];
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, img.data, bytes);
  XXH3_64bits_update(&st, lab.data, (size_t)lab.shape[0] * 8);
  return XXH3_64bits_digest(&st);
}

/* Runs SRC with OPTS for at most MAX batches, recording digests and the first keys. */
static void collect(const char *src, const char *opts, int max, run *r) {
  memset(r, 0, sizeof *r);
  dl_loader *l;
  OPEN_OK(l, src, opts);
  dl_batch *b;
  while (r->batches < max) {
    int rc = dl_next_batch(l, &b);
    if (rc == DL_EOF)
      break;
    if (rc)
      FAIL_AT("dl_next_batch(%s): %s: %s", opts, dl_errname(rc), dl_last_error());
    ASSERT_LT(r->batches, 64);
    r->digest[r->batches] = batch_digest(b);
    r->len[r->batches] = dl_batch_size(b);
    ASSERT_EQ(dl_batch_position(b, &r->epoch[r->batches], &r->index[r->batches]), 0);
    for (int i = 0; i < dl_batch_size(b) && i < 8; i++)
      snprintf(r->keys[r->batches][i], 16, "%s", dl_batch_key(b, i));
    ASSERT_EQ(dl_batch_sample_error(b, 0), 0);
    r->batches++;
    dl_batch_release(b, NULL);
  }
  ASSERT_GT(dl_state_save(l, r->token, sizeof r->token), 0);
  dl_close(l);
}

/* Every key of a run, for set arithmetic over ranks. */
static int all_keys(const char *src, const char *opts, int stop_after, char keys[][16], int cap, char *token) {
  dl_loader *l;
  OPEN_OK(l, src, opts);
  int n = 0, batches = 0;
  dl_batch *b;
  while ((stop_after < 0 || batches < stop_after) && dl_next_batch(l, &b) == 0) {
    for (int i = 0; i < dl_batch_size(b); i++) {
      ASSERT_LT(n, cap);
      snprintf(keys[n++], 16, "%s", dl_batch_key(b, i));
    }
    batches++;
    dl_batch_release(b, NULL);
  }
  if (token)
    dl_state_save(l, token, 128);
  dl_close(l);
  return n;
}

static void determinism(void) {
  run a, b, c, d;
  const char *base = "batch_size=16 image_size=64 crop=random_resized flip=1 seed=5 epochs=2";
  char o1[256], o2[256], o3[256];
  snprintf(o1, sizeof o1, "%s workers=1 io=pread prefetch=1", base);
  snprintf(o2, sizeof o2, "%s workers=4 io=uring io_depth=3", base);
  snprintf(o3, sizeof o3, "%s workers=3 prefetch=2", base);
  collect(source, o1, 64, &a);
  dl_loader *probe;
  int have_uring = dl_open(&probe, source, "io=uring workers=1") == 0;
  if (have_uring)
    dl_close(probe);
  collect(source, have_uring ? o2 : o3, 64, &b);
  collect(source, o3, 64, &c);
  run m;
  char o4[256];
  snprintf(o4, sizeof o4, "%s workers=2 io=mmap", base);
  collect(source, o4, 64, &m);
  ASSERT_EQ(m.batches, a.batches);
  for (int i = 0; i < a.batches; i++)
    ASSERT_EQ(m.digest[i], a.digest[i]);
  ASSERT_EQ(a.batches, 2 * ((N + 15) / 16));
  ASSERT_EQ(b.batches, a.batches);
  ASSERT_EQ(c.batches, a.batches);
  for (int i = 0; i < a.batches; i++) {
    ASSERT_EQ(a.digest[i], b.digest[i]);
    ASSERT_EQ(a.digest[i], c.digest[i]);
  }
  ASSERT_EQ(a.len[a.batches - 1], N % 16);
  /* Another seed is another stream; epochs differ from each other. */
  collect(source, "batch_size=16 image_size=64 flip=1 seed=6 epochs=2 workers=2", 64, &d);
  ASSERT_NE(a.digest[0], d.digest[0]);
  ASSERT_NE(a.digest[0], a.digest[a.batches / 2]);
  printf("determinism: %d batches identical over worker counts and backends%s\n", a.batches,
         have_uring ? "" : " (io_uring unavailable here: pread only)");
}

static void order_and_epochs(void) {
  run r;
  collect(source, "batch_size=8 image_size=32 shuffle=0 workers=2 epochs=0", 40, &r);
  ASSERT_EQ(r.batches, 40); /* epochs=0: runs past the first epoch */
  ASSERT_STR_EQ(r.keys[0][0], "s0000");
  ASSERT_STR_EQ(r.keys[1][3], "s0011");
  ASSERT_STR_EQ(r.keys[15][0], "s0000"); /* epoch 2 starts again in index order */
  collect(source, "batch_size=50 image_size=32 drop_last=1 workers=2", 64, &r);
  ASSERT_EQ(r.batches, 2);
  collect(source, "batch_size=50 image_size=32 layout=NCHW channels=1 crop=center workers=2", 64, &r);
  ASSERT_EQ(r.batches, 3);
  printf("order: shuffle=0, epochs=0, drop_last, NCHW grey ok\n");
}

/* layout=channels_last: NHWC's bytes under NCHW's shape, the strides saying so, in the batch and in
 * an export that outlives the batch's own description. */
static void channels_last(void) {
  run nhwc, cl;
  const char *base = "batch_size=8 image_size=24 shuffle=0 workers=2 epochs=1";
  char opts[200];
  collect(source, base, 64, &nhwc);
  snprintf(opts, sizeof opts, "%s layout=channels_last", base);
  collect(source, opts, 64, &cl);
  ASSERT_EQ(cl.batches, nhwc.batches);
  for (int i = 0; i < cl.batches; i++)
    ASSERT_EQ(cl.digest[i], nhwc.digest[i]);
  dl_loader *l;
  OPEN_OK(l, source, opts);
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  DLTensor t;
  ASSERT_EQ(dl_batch_field(b, "image", &t), 0);
  const int64_t shape[4] = {8, 3, 24, 24}, strides[4] = {24 * 24 * 3, 1, 24 * 3, 3};
  ASSERT(t.strides);
  for (int d = 0; d < 4; d++)
    ASSERT(t.shape[d] == shape[d] && t.strides[d] == strides[d]);
  DLManagedTensor *m;
  ASSERT_EQ(dl_batch_export(b, "image", &m), 0);
  ASSERT(m->dl_tensor.strides && m->dl_tensor.strides != t.strides);
  ASSERT_EQ(dl_batch_field(b, "label", &t), 0);
  ASSERT(!t.strides); /* compact */
  dl_batch_release(b, NULL);
  for (int d = 0; d < 4; d++)
    ASSERT(m->dl_tensor.strides[d] == strides[d]);
  m->deleter(m);
  dl_close(l);
  printf("layout=channels_last: NHWC's bytes, NCHW's shape, strides in batch and export\n");
}

static int cmp_key(const void *a, const void *b) { return strcmp(a, b); }

static void ranks_and_resume(void) {
  static char keys[8][N][16];
  /* Disjoint, equal-length rank splits. */
  for (int W = 2; W <= 4; W++) {
    int total = 0, len0 = -1;
    static char all[N][16];
    for (int r = 0; r < W; r++) {
      char opts[256];
      snprintf(opts, sizeof opts, "batch_size=7 image_size=16 workers=2 seed=9 rank=%d world_size=%d", r, W);
      int n = all_keys(source, opts, -1, keys[r], N, NULL);
      if (len0 < 0)
        len0 = n;
      ASSERT_EQ(n, len0);
      memcpy(all[total], keys[r], sizeof(keys[r][0]) * (size_t)n);
      total += n;
    }
    ASSERT_EQ(total, N - N % W);
    qsort(all, (size_t)total, 16, cmp_key);
    for (int i = 1; i < total; i++)
      ASSERT(strcmp(all[i - 1], all[i]) != 0);
  }
  /* Resume at the same world size: the rest of the stream, byte for byte. */
  run full, head, tail;
  const char *o = "batch_size=16 image_size=48 workers=3 seed=11 epochs=2 flip=1";
  collect(source, o, 64, &full);
  collect(source, o, 5, &head);
  char opts[512];
  snprintf(opts, sizeof opts, "%s resume=%s", o, head.token);
  collect(source, opts, 64, &tail);
  ASSERT_EQ(tail.batches, full.batches - 5);
  /* ... each batch at its place in its whole epoch, as the run that was not stopped had it. */
  for (int i = 0; i < tail.batches; i++) {
    ASSERT_EQ(tail.digest[i], full.digest[i + 5]);
    ASSERT_EQ(tail.epoch[i], full.epoch[i + 5]);
    ASSERT_EQ(tail.index[i], full.index[i + 5]);
  }
  ASSERT_EQ(tail.index[0], 5);
  /* A token taken at an epoch's end resumes at the next epoch. */
  collect(source, o, 8, &head);
  snprintf(opts, sizeof opts, "%s resume=%s", o, head.token);
  collect(source, opts, 64, &tail);
  ASSERT_EQ(tail.batches, full.batches - 8);
  ASSERT_EQ(tail.digest[0], full.digest[8]);
  /* Save at 2 ranks, resume at 3: the epoch's rest is split anew, nothing lost or repeated. */
  static char seen[N * 2][16];
  int n = 0;
  char token[128] = "";
  for (int r = 0; r < 2; r++) {
    snprintf(opts, sizeof opts, "batch_size=5 image_size=16 workers=2 seed=3 rank=%d world_size=2", r);
    n += all_keys(source, opts, 4, seen + n, N, r == 0 ? token : NULL);
  }
  ASSERT_EQ(n, 2 * 4 * 5);
  int before = n;
  for (int r = 0; r < 3; r++) {
    snprintf(opts, sizeof opts, "batch_size=5 image_size=16 workers=2 seed=3 rank=%d world_size=3 resume=%s",
             r, token);
    n += all_keys(source, opts, -1, seen + n, N, NULL);
  }
  ASSERT_EQ(n, N - (N - before) % 3);
  qsort(seen, (size_t)n, 16, cmp_key);
  for (int i = 1; i < n; i++)
    ASSERT(strcmp(seen[i - 1], seen[i]) != 0);
  printf("ranks and resume: disjoint splits, exact resume, 2 -> 3 ranks with no repeat\n");
}

/* FMT with the test's folder for each %s (at most two). */
static const char *fmt_path(const char *fmt) {
  static char path[1024];
  snprintf(path, sizeof path, fmt, dir, dir);
  return path;
}

/* Source SRC's class names for labels 0 and 1 (NULL: none). */
static void expect_classes(const char *src, const char *c0, const char *c1) {
  dl_loader *l;
  OPEN_OK(l, src, "batch_size=9 image_size=16 workers=1 log=quiet");
  const char *got[2] = {dl_class_name(l, 0), dl_class_name(l, 1)}, *want[2] = {c0, c1};
  for (int i = 0; i < 2; i++)
    if (want[i] ? !got[i] || strcmp(got[i], want[i]) : got[i] != NULL)
      FAIL_AT("%s: class %d is %s, not %s", src, i, got[i] ? got[i] : "none", want[i] ? want[i] : "none");
  dl_close(l);
}

static void sources(void) {
  char src[1024];
  dl_loader *l;
  run r;
  snprintf(src, sizeof src, "%s/part-00{0..1}.tar::%s/part-00[23].tar", dir, dir);
  collect(src, "batch_size=200 image_size=16 workers=2", 64, &r);
  ASSERT_EQ(r.len[0], N);
  snprintf(src, sizeof src, "%s/part-{000..003}.tar", dir);
  collect(src, "batch_size=200 image_size=16 workers=2", 64, &r);
  ASSERT_EQ(r.len[0], N);
  /* The indexes saved beside the shards (opened above) match a glob over their folder, or are
   * named in a list: left out, with no warning; named alone, the error names their shard. */
  snprintf(src, sizeof src, "%s/part-000.tar.rfidx", dir);
  ASSERT_EQ(access(src, R_OK), 0);
  ASSERT_EQ(dl_open(&l, src, "log=quiet"), DL_ENOSAMPLES);
  ASSERT_CONTAINS(dl_last_error(), "index saved beside shard");
  ASSERT_CONTAINS(dl_last_error(), "part-000.tar, not a shard");
  snprintf(src, sizeof src, "%s/part-*::%s/part-000.tar.rfidx", dir, dir);
  collect(src, "batch_size=200 image_size=16 workers=2 on_error=fail", 64, &r);
  ASSERT_EQ(r.len[0], N);
  snprintf(src, sizeof src, "%s/folder", dir);
  OPEN_OK(l, src, "batch_size=9 image_size=16 shuffle=0 workers=2");
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  ASSERT_EQ(dl_batch_size(b), 9);
  ASSERT_STR_EQ(dl_batch_key(b, 0), "class0/img0");
  ASSERT_STR_EQ(dl_batch_key(b, 3), "class1/img1");
  const char *const *keys = dl_batch_keys(b); /* all at once, the same */
  for (int i = 0; i < 9; i++)
    ASSERT(keys[i] == dl_batch_key(b, i));
  ASSERT(!dl_batch_keys(NULL));
  size_t text_len = 0; /* joined in one string, each ended by its NUL; the same again */
  for (int again = 0; again < 2; again++) {
    const char *text = dl_batch_keys_text(b, &text_len), *at = text;
    for (int i = 0; i < 9; at += strlen(at) + 1, i++)
      ASSERT_STR_EQ(at, dl_batch_key(b, i));
    ASSERT_EQ((long)text_len, (long)(at - text));
  }
  ASSERT(!dl_batch_keys_text(NULL, &text_len));
  DLTensor lab;
  dl_batch_field(b, "label", &lab);
  ASSERT_EQ(((int64_t *)lab.data)[0], 0);
  ASSERT_EQ(((int64_t *)lab.data)[8], 2);
  ASSERT_EQ(dl_batch_sample_error(b, 8), 0);
  dl_batch_release(b, NULL);
  /* Its classes by name, a label indexing them (torchvision's ImageFolder.classes). */
  ASSERT_STR_EQ(dl_class_name(l, 0), "class0");
  ASSERT_STR_EQ(dl_class_name(l, 2), "class2");
  ASSERT(!dl_class_name(l, 3) && !dl_class_name(l, -1));
  dl_close(l);
  /* A list of folders with the same classes keeps them; with shards, or a folder of other
   * classes, no name holds for every label, and none is given. */
  char other[600], img[600], link[700];
  snprintf(other, sizeof other, "%s/other", dir);
  mkdir(other, 0755);
  snprintf(other, sizeof other, "%s/other/zebra", dir);
  mkdir(other, 0755);
  snprintf(img, sizeof img, "%s/folder/class0/img0.jpg", dir);
  snprintf(link, sizeof link, "%s/a.jpg", other);
  ASSERT_EQ(symlink(img, link), 0);
  expect_classes(fmt_path("%s/folder::%s/folder"), "class0", "class1");
  expect_classes(fmt_path("%s/other"), "zebra", NULL);
  expect_classes(fmt_path("%s/folder::%s/part-000.tar"), NULL, NULL);
  expect_classes(fmt_path("%s/folder::%s/other"), NULL, NULL);
  expect_classes(fmt_path("%s/part-000.tar::%s/part-001.tar"), NULL, NULL);
  /* Tar dialects built by GNU tar and Python's tarfile: long names, pax, ustar prefix. */
  const char *shards = getenv("DL_TEST_SHARDS");
  const char *dialects[] = {"format-tar-gnu", "format-tar-pax", "format-py-gnu", "format-py-pax", "format-tar-ustar"};
  for (int i = 0; shards && i < 5; i++) {
    snprintf(src, sizeof src, "%s/%s.tar", shards, dialects[i]);
    if (access(src, R_OK))
      continue;
    OPEN_OK(l, src, "batch_size=4 image_size=16 shuffle=0 workers=1");
    ASSERT_EQ(dl_next_batch(l, &b), 0);
    ASSERT_EQ(dl_batch_size(b), i == 4 ? 1 : 2);
    const char *k = dl_batch_key(b, 0);
    ASSERT(strlen(k) > 100);
    dl_batch_field(b, "label", &lab);
    ASSERT_EQ(((int64_t *)lab.data)[0], 7);
    ASSERT_EQ(dl_batch_sample_error(b, 0), 0);
    dl_batch_release(b, NULL);
    dl_close(l);
  }
  printf("sources: lists, braces, globs, ImageFolder, tar dialects ok\n");
}

static void copy_file(const char *from, const char *to, long limit) {
  FILE *a = fopen(from, "rb"), *z = fopen(to, "wb");
  ASSERT(a && z);
  char buf[65536];
  size_t n;
  long done = 0;
  while ((n = fread(buf, 1, sizeof buf, a)) > 0 && (limit < 0 || done < limit)) {
    if (limit >= 0 && done + (long)n > limit)
      n = (size_t)(limit - done);
    fwrite(buf, 1, n, z);
    done += (long)n;
  }
  fclose(a);
  fclose(z);
}

/* Offset of member I's data (0-based) in a tar this test wrote. */
static long member_data(const char *path, int member) {
  FILE *f = fopen(path, "rb");
  unsigned char h[512];
  long at = -1;
  for (int i = 0; fread(h, 1, 512, f) == 512 && h[0]; i++) {
    long size = strtol((char *)h + 124, NULL, 8);
    if (i == member) {
      at = ftell(f);
      break;
    }
    fseek(f, (size + 511) / 512 * 512, SEEK_CUR);
  }
  fclose(f);
  ASSERT_GT(at, 0);
  return at;
}

static void damaged_shards_and_cache(void) {
  char src[512], part[512], idx[600];
  snprintf(part, sizeof part, "%s/part-000.tar", dir);
  snprintf(src, sizeof src, "%s/cut.tar", dir);
  struct stat st;
  stat(part, &st);
  /* Cut inside the 20th image: 19 samples survive, the cut one fails by name. */
  long cut = member_data(part, 38) + 1000;
  copy_file(part, src, cut);
  dl_loader *l;
  OPEN_OK(l, src, "batch_size=32 image_size=16 shuffle=0 workers=2 log=quiet");
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  ASSERT_EQ(dl_batch_size(b), 20);
  ASSERT_EQ(dl_batch_sample_error(b, 18), 0);
  ASSERT_EQ(dl_batch_sample_error(b, 19), DL_ECORRUPT);
  dl_batch_release(b, NULL);
  dl_close(l);
  ASSERT_EQ(dl_open(&l, src, "on_error=fail log=quiet"), DL_ECORRUPT);
  ASSERT_CONTAINS(dl_last_error(), "cut.tar");
  ASSERT_CONTAINS(dl_last_error(), "truncated");
  /* A corrupt header: fail names the shard at open; skip keeps what precedes it. */
  copy_file(part, src, -1);
  int fd = open(src, O_WRONLY);
  ASSERT_EQ(pwrite(fd, "garbage!", 8, member_data(part, 10) - 512 + 148), 8);
  close(fd);
  snprintf(idx, sizeof idx, "%s.rfidx", src);
  unlink(idx);
  ASSERT_EQ(dl_open(&l, src, "on_error=fail log=quiet"), DL_ECORRUPT);
  ASSERT_CONTAINS(dl_last_error(), "cut.tar");
  ASSERT_CONTAINS(dl_last_error(), "checksum");
  OPEN_OK(l, src, "batch_size=64 image_size=16 workers=1 log=quiet");
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  ASSERT_LT(dl_batch_size(b), PER_SHARD);
  dl_batch_release(b, NULL);
  dl_close(l);

  /* The index cache: written beside the shard, used, and redone when the shard changes. */
  copy_file(part, src, -1);
  unlink(idx);
  OPEN_OK(l, src, "workers=1");
  dl_close(l);
  ASSERT_EQ(access(idx, R_OK), 0);
  struct stat is;
  stat(idx, &is);
  ASSERT_GT(is.st_size, 0);
  /* A damaged cache is ignored and rewritten. */
  fd = open(idx, O_WRONLY);
  ASSERT_EQ(pwrite(fd, "\xff\xff", 2, 60), 2);
  close(fd);
  run r;
  collect(src, "batch_size=64 image_size=16 workers=1 shuffle=0", 4, &r);
  ASSERT_EQ(r.len[0], PER_SHARD);
  ASSERT_STR_EQ(r.keys[0][1], "s0001");
  /* A shard whose folder is read-only has its index in the cache folder. */
  char ro[512], rosrc[600];
  snprintf(ro, sizeof ro, "%s/ro", dir);
  mkdir(ro, 0755);
  snprintf(rosrc, sizeof rosrc, "%s/p.tar", ro);
  copy_file(part, rosrc, -1);
  chmod(ro, 0555);
  if (access(ro, W_OK) != 0) { /* root can write anyway; then there is nothing to check */
    collect(rosrc, "batch_size=64 image_size=16 workers=1", 4, &r);
    ASSERT_EQ(r.len[0], PER_SHARD);
    char cachedir[600];
    snprintf(cachedir, sizeof cachedir, "%s/ringfeed", getenv("XDG_CACHE_HOME"));
    ASSERT_EQ(access(cachedir, R_OK), 0);
  }
  chmod(ro, 0755);
  printf("damage and cache: truncated and corrupt shards reported by name, cache kept valid\n");
}

static void slots_and_lifetimes(void) {
  dl_loader *l;
  OPEN_OK(l, source, "batch_size=4 image_size=16 workers=2 prefetch=2 epochs=0");
  dl_batch *a, *b, *c;
  ASSERT_EQ(dl_next_batch(l, &a), 0);
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  ASSERT_EQ(dl_next_batch(l, &c), DL_EBUSY);
  ASSERT_CONTAINS(dl_last_error(), "held by the consumer");
  dl_batch_release(a, NULL);
  /* A batch kept costs one slot: the consumer goes on with the other, whichever batch it held. */
  for (int i = 0; i < 10; i++) {
    ASSERT_EQ(dl_next_batch(l, &c), 0);
    int64_t epoch, index;
    ASSERT_EQ(dl_batch_position(c, &epoch, &index), 0);
    ASSERT_EQ(epoch * dl_batches_per_epoch(l) + index, i + 2);
    dl_batch_release(c, NULL);
  }
  ASSERT_EQ(dl_next_batch(l, &c), 0);
  /* Exports keep a batch alive past release and past dl_close. */
  DLManagedTensor *img, *lab, *none = NULL, *lab2;
  ASSERT_EQ(dl_batch_export(c, "image", &img), 0);
  ASSERT_EQ(dl_batch_export(c, "label", &lab), 0);
  ASSERT_EQ(dl_batch_export(c, "nonesuch", &none), DL_ENOFIELD);
  ASSERT(none == NULL);
  ASSERT_EQ(dl_batch_export(c, "label", &lab2), 0);
  /* A copy is the caller's own, equal to the field, and asked of a held batch only. */
  int64_t labels[4], two[2];
  uint8_t *pixels = malloc(4 * 16 * 16 * 3);
  ASSERT_EQ(dl_batch_copy(c, "label", labels, sizeof labels, NULL), 0);
  ASSERT(memcmp(labels, lab->dl_tensor.data, sizeof labels) == 0);
  ASSERT_EQ(dl_batch_copy(c, "image", pixels, 4 * 16 * 16 * 3, NULL), 0);
  ASSERT(memcmp(pixels, img->dl_tensor.data, 4 * 16 * 16 * 3) == 0);
  free(pixels);
  ASSERT_EQ(dl_batch_copy(c, "label", two, sizeof two, NULL), -EINVAL);
  ASSERT_CONTAINS(dl_last_error(), "field 'label' is 32 bytes, more than the 16 of DST");
  ASSERT_EQ(dl_batch_copy(c, "label", NULL, sizeof labels, NULL), -EINVAL);
  ASSERT_EQ(dl_batch_copy(c, "nonesuch", labels, sizeof labels, NULL), DL_ENOFIELD);
  dl_batch_release(c, NULL);
  dl_batch_release(b, NULL);
  uint8_t first = ((uint8_t *)img->dl_tensor.data)[0];
  dl_close(l);
  uint64_t sum = 0;
  for (int64_t i = 0; i < img->dl_tensor.shape[0] * 16 * 16 * 3; i++)
    sum += ((uint8_t *)img->dl_tensor.data)[i];
  ASSERT_EQ(((uint8_t *)img->dl_tensor.data)[0], first);
  ASSERT_GT(sum, 0);
  ASSERT_EQ(lab->dl_tensor.shape[0], 4);
  img->deleter(img);
  lab->deleter(lab);
  lab2->deleter(lab2);
  /* Closing with batches held (not exported) frees them with the loader. */
  OPEN_OK(l, source, "batch_size=4 image_size=16 workers=2 prefetch=3");
  ASSERT_EQ(dl_next_batch(l, &a), 0);
  dl_close(l);
  /* Closing early, while workers are busy, stops them cleanly. */
  OPEN_OK(l, source, "batch_size=64 image_size=128 workers=3 epochs=0");
  dl_close(l);
  printf("slots: DL_EBUSY when every slot is held, a kept batch costs one slot, exports outlive the loader\n");
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct consumer {
  dl_loader *l;
  _Atomic int waiting; /* about to make its one call (wait_once) */
  int batches, result;
  char keys[N][16];
  int nkeys;
} consumer;

static void *consume(void *arg) {
  consumer *c = arg;
  dl_batch *b;
  while ((c->result = dl_next_batch(c->l, &b)) == 0) {
    for (int i = 0; i < dl_batch_size(b) && c->nkeys < N; i++)
      snprintf(c->keys[c->nkeys++], sizeof c->keys[0], "%s", dl_batch_key(b, i));
    c->batches++;
    dl_batch_release(b, NULL);
  }
  return NULL;
}

/* One call that waits for the first batch: dl_close must end it. (Only one: a second call after
 * the loader closed would be the caller's error.) */
static void *wait_once(void *arg) {
  consumer *c = arg;
  dl_batch *b;
  atomic_store(&c->waiting, 1);
  c->result = dl_next_batch(c->l, &b);
  if (c->result == 0)
    dl_batch_release(b, NULL);
  return NULL;
}

/* A batch released twice: the second release does nothing. It used to free the slot while the
 * next batch waited in it, and the consumer then waited for that batch for ever. Exporting a
 * released batch fails rather than handing out a tensor whose slot is filling again. */
static void released_twice(void) {
  dl_loader *l;
  OPEN_OK(l, source, "batch_size=4 image_size=16 workers=2 prefetch=2 epochs=1");
  ASSERT_GE(dl_batches_per_epoch(l), 5);
  dl_batch *a, *b, *c;
  ASSERT_EQ(dl_next_batch(l, &a), 0);
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  dl_batch_release(a, NULL);
  usleep(300 * 1000); /* a's slot fills with batch 2 meanwhile */
  dl_batch_release(a, NULL);
  DLManagedTensor *t = NULL;
  ASSERT_EQ(dl_batch_export(a, "image", &t), -EINVAL);
  ASSERT(t == NULL);
  ASSERT_CONTAINS(dl_last_error(), "released already");
  int64_t labels[4];
  ASSERT_EQ(dl_batch_copy(a, "label", labels, sizeof labels, NULL), -EINVAL);
  ASSERT_CONTAINS(dl_last_error(), "copy before releasing it");
  ASSERT(!dl_batch_keys_text(a, NULL)); /* the slot holds batch 2's keys now */
  ASSERT_CONTAINS(dl_last_error(), "read its keys before releasing it");
  dl_batch_release(b, NULL);
  for (int64_t want = 2; want < 5; want++) {
    int64_t epoch, index;
    ASSERT_EQ(dl_next_batch_timed(l, 0, 10000, &c), 0);
    ASSERT_EQ(dl_batch_position(c, &epoch, &index), 0);
    ASSERT_EQ(index, want);
    dl_batch_release(c, NULL);
  }
  dl_close(l);
  printf("released twice: the second release ignored with a warning, the next batches in order\n");
}

/* NULL where the API writes its result, or for a field name: -EINVAL naming it, not a crash. */
static void null_arguments(void) {
  dl_loader *l;
  ASSERT_EQ(dl_open(NULL, source, "batch_size=4"), -EINVAL);
  ASSERT_CONTAINS(dl_last_error(), "OUT is NULL");
  OPEN_OK(l, source, "batch_size=4 image_size=16 workers=1");
  ASSERT_EQ(dl_next_batch(l, NULL), -EINVAL);
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  DLTensor t;
  ASSERT_EQ(dl_batch_field(b, NULL, &t), -EINVAL);
  ASSERT_CONTAINS(dl_last_error(), "field name");
  ASSERT_EQ(dl_batch_field(b, "image", NULL), -EINVAL);
  ASSERT_EQ(dl_batch_field(NULL, "image", &t), -EINVAL);
  ASSERT_EQ(dl_batch_export(b, "image", NULL), -EINVAL);
  int64_t label;
  ASSERT_EQ(dl_batch_copy(NULL, "label", &label, sizeof label, NULL), -EINVAL);
  ASSERT_EQ(dl_batch_field(b, "image", &t), 0); /* the batch is still the consumer's */
  dl_batch_release(b, NULL);
  dl_close(l);
  printf("NULL arguments: -EINVAL naming them\n");
}

/* One thread keeps batches 0 and 1 while another consumes (prefetch=2): the consumer's wait for
 * batch 2 lasts until one is released, and after 5 s the loader says which batch holds it up. */
static void held_by_another_thread(void) {
  dl_loader *l;
  OPEN_OK(l, source, "batch_size=4 image_size=16 workers=2 prefetch=2 epochs=1 log=warn"); /* whatever DL_LOG_LEVEL says */
  dl_batch *kept, *kept2;
  ASSERT_EQ(dl_next_batch(l, &kept), 0);
  ASSERT_EQ(dl_next_batch(l, &kept2), 0);
  char log[600];
  snprintf(log, sizeof log, "%s/held.log", dir);
  int saved = stderr_into(log);
  static consumer c;
  memset(&c, 0, sizeof c);
  c.l = l;
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, consume, &c), 0);
  sleep(6);
  ASSERT_EQ(c.batches, 0);
  dl_batch_release(kept2, NULL); /* one slot is enough to go on */
  pthread_join(t, NULL);
  stderr_back(saved);
  dl_batch_release(kept, NULL);
  ASSERT_EQ(c.result, DL_EOF);
  ASSERT_EQ(c.batches, dl_batches_per_epoch(l) - 2);
  dl_close(l);
  char text[2048] = {0};
  FILE *f = fopen(log, "r");
  ASSERT(f);
  ASSERT_GT(fread(text, 1, sizeof text - 1, f), 0);
  fclose(f);
  ASSERT_CONTAINS(text, "batch 2 has waited 5 s for a slot: all 2 hold batches not released, batch 0 among them");
  printf("held by another thread: the consumer waited for it, warned after 5 s, and went on once released\n");
}

/* Several consumer threads share one loader; dl_close from another thread ends their waits. */
static void consumer_threads(void) {
  dl_loader *l;
  OPEN_OK(l, source, "batch_size=4 image_size=16 workers=2 prefetch=3 shuffle=1 seed=5");
  static consumer c[3];
  pthread_t t[3];
  for (int i = 0; i < 3; i++) {
    memset(&c[i], 0, sizeof c[i]);
    c[i].l = l;
    ASSERT_EQ(pthread_create(&t[i], NULL, consume, &c[i]), 0);
  }
  int batches = 0, nkeys = 0;
  static char all[N][16];
  for (int i = 0; i < 3; i++) {
    pthread_join(t[i], NULL);
    ASSERT_EQ(c[i].result, DL_EOF); /* never a spurious DL_EBUSY, never a hang */
    batches += c[i].batches;
    for (int k = 0; k < c[i].nkeys; k++)
      memcpy(all[nkeys++], c[i].keys[k], sizeof all[0]);
  }
  dl_close(l);
  ASSERT_EQ(batches, N / 4);
  ASSERT_EQ(nkeys, N);
  qsort(all, (size_t)nkeys, sizeof all[0], cmp_key);
  for (int k = 1; k < nkeys; k++)
    ASSERT(strcmp(all[k - 1], all[k]) != 0);
  /* A consumer waiting for a slow batch (one worker, large images) when another thread closes. */
  OPEN_OK(l, source, "batch_size=64 image_size=256 workers=1 prefetch=1 log=quiet");
  static consumer w;
  memset(&w, 0, sizeof w);
  w.l = l;
  pthread_t waiter;
  ASSERT_EQ(pthread_create(&waiter, NULL, wait_once, &w), 0);
  while (!atomic_load(&w.waiting)) /* a loaded machine may start the thread late */
    sched_yield();
  struct timespec pause = {0, 20 * 1000000};
  nanosleep(&pause, NULL);
  double t0 = now_s();
  dl_close(l);
  double closed = now_s() - t0;
  pthread_join(waiter, NULL);
  ASSERT_EQ(w.result, DL_ECLOSED);
  printf("consumer threads: 3 threads took %d batches, each key once; a waiting consumer is released "
         "by dl_close from another thread (DL_ECLOSED, close took %.0f ms)\n", batches, closed * 1000);
}

static double stat_number(const char *stats, const char *key) {
  char k[80];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *p = strstr(stats, k);
  ASSERT(p);
  return atof(p + strlen(k));
}

/* The stats account for dl_open's time by step, and the first batch comes after it. */
static void open_time_split(void) {
  dl_loader *l;
  OPEN_OK(l, source, "batch_size=8 image_size=32 workers=2");
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  dl_batch_release(b, NULL);
  char stats[8192];
  ASSERT_GT(dl_stats_json(l, stats, sizeof stats), 0);
  double open = stat_number(stats, "open_ms"), index = stat_number(stats, "open_index_ms");
  double parts = index + stat_number(stats, "open_cuda_ms") + stat_number(stats, "open_gpu_decode_ms") +
                 stat_number(stats, "open_slots_ms") + stat_number(stats, "open_workers_ms");
  ASSERT(index > 0 && stat_number(stats, "open_workers_ms") > 0 && parts <= open &&
         open <= stat_number(stats, "first_batch_ms"));
  ASSERT_EQ(stat_number(stats, "open_cuda_ms"), 0); /* no device */
  ASSERT_EQ(stat_number(stats, "consumer_wait_gpu_busy_s"), 0); /* a host consumer: all of its wait counts */
  dl_close(l);
  printf("dl_open's time split: %.2f ms, %.2f of it the index, %.2f starting the workers; first batch at %.2f ms\n",
         open, index, stat_number(stats, "open_workers_ms"), stat_number(stats, "first_batch_ms"));
}

static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  ASSERT(d);
  int n = 0;
  while (readdir(d))
    n++;
  closedir(d);
  return n;
}

/* A child under a hard limit of LIMIT descriptors (dl_open lifts only the soft one): opens the
 * loader and takes a batch. Exits 0 when it ran, 1 when dl_open failed in a worker's ring setup
 * (the message in FD), 2 for another failure, 3 when a descriptor was left open. */
static void limited_child(rlim_t limit, int fd) {
  int before = open_fds();
  struct rlimit lim = {limit, limit};
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lim), 0);
  dl_loader *l;
  int r = dl_open(&l, source, "batch_size=8 image_size=32 workers=8 io=uring log=quiet");
  if (r == 0) {
    dl_batch *b;
    ASSERT_EQ(dl_next_batch(l, &b), 0);
    dl_batch_release(b, NULL);
    dl_close(l);
  } else {
    ASSERT(write(fd, dl_last_error(), strlen(dl_last_error())) > 0);
  }
  _exit(open_fds() != before ? 3 : r == 0 ? 0 : strstr(dl_last_error(), "io_uring setup failed") ? 1 : 2);
}

/* With too few file descriptors left for every worker's io_uring ring, dl_open fails naming the
 * worker and the reason, and leaves nothing behind. */
static void ring_setup_failure(void) {
  dl_loader *l;
  if (dl_open(&l, source, "batch_size=8 image_size=32 workers=8 io=uring log=quiet")) {
    printf("ring setup failure: io_uring not available here (%s)\n", dl_last_error());
    return;
  }
  dl_close(l);
  int fds = open_fds(), failed = 0, opened = 0;
  char why[512] = "";
  for (int extra = 0; extra < 24; extra++) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
      close(p[0]);
      limited_child((rlim_t)(fds + extra), p[1]);
    }
    close(p[1]);
    char msg[512] = "";
    ssize_t n = read(p[0], msg, sizeof msg - 1);
    msg[n > 0 ? n : 0] = 0;
    close(p[0]);
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT(WIFEXITED(status));
    ASSERT(WEXITSTATUS(status) != 3); /* a descriptor left open */
    opened += WEXITSTATUS(status) == 0;
    if (WEXITSTATUS(status) == 1) {
      failed++;
      snprintf(why, sizeof why, "%s", msg);
    }
  }
  ASSERT_GT(failed, 0);
  ASSERT_GT(opened, 0);
  ASSERT(strstr(why, "worker ") && strstr(why, strerror(EMFILE)));
  printf("ring setup failure: %d of 24 descriptor limits failed dl_open in a worker's ring setup (\"%s\"), "
         "%d opened and ran; no descriptor left open\n", failed, why, opened);
}

/* The nice of each of this process's threads: how many are at NICE. */
static int threads_at_nice(int nice) {
  DIR *d = opendir("/proc/self/task");
  ASSERT(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.')
      continue;
    char path[300], buf[1024];
    snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f)
      continue; /* a thread that ended meanwhile */
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = 0;
    /* Fields after the command's closing parenthesis: state is 3rd, nice the 19th. */
    const char *p = strrchr(buf, ')');
    int field = 2, value = 0;
    for (; p && *p; p++)
      if (*p == ' ' && ++field == 19) {
        value = atoi(p + 1);
        break;
      }
    n += field == 19 && value == nice;
  }
  closedir(d);
  return n;
}

/* Whether one of this process's threads is called NAME (its comm, as top -H and gdb show it). */
static bool thread_named(const char *name) {
  DIR *d = opendir("/proc/self/task");
  ASSERT(d);
  bool found = false;
  struct dirent *e;
  while (!found && (e = readdir(d))) {
    char path[300], comm[32] = "";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = e->d_name[0] == '.' ? NULL : fopen(path, "r");
    if (f && fgets(comm, sizeof comm, f))
      found = strcspn(comm, "\n") == strlen(name) && !strncmp(comm, name, strlen(name));
    if (f)
      fclose(f);
  }
  closedir(d);
  return found;
}

/* The workers run below the process's priority, so a training loop's thread wins a shared core;
 * the thread that opened the loader keeps its own. Each worker carries its name. */
static void workers_below_the_process(void) {
  errno = 0;
  int base = getpriority(PRIO_PROCESS, 0);
  ASSERT(errno == 0 && base <= 12);
  dl_loader *l;
  OPEN_OK(l, source, "batch_size=4 workers=3 worker_nice=7 log=quiet");
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  /* One worker may fill the first batch before the others are scheduled at all (two loaded cores):
   * each lowers itself as its first step, so wait for them to start. */
  for (int i = 0; i < 200 && threads_at_nice(base + 7) < 3; i++)
    usleep(10000);
  ASSERT_EQ(threads_at_nice(base + 7), 3);
  ASSERT_EQ(getpriority(PRIO_PROCESS, 0), base);
  ASSERT(thread_named("rf-worker-0") && thread_named("rf-worker-2") && !thread_named("rf-worker-3"));
  dl_batch_release(b, NULL);
  dl_close(l);
  OPEN_OK(l, source, "batch_size=4 workers=2 worker_nice=0 log=quiet");
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  ASSERT_EQ(threads_at_nice(base + 7), 0);
  dl_batch_release(b, NULL);
  dl_close(l);
  printf("workers at nice +7 (worker_nice=7) and named rf-worker-N, the opening thread at %d\n", base);
}

int main(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/ringfeed-test-loader-XXXXXX", tmp ? tmp : "/tmp");
  ASSERT(mkdtemp(dir));
  char folder[300];
  snprintf(folder, sizeof folder, "%s/folder", dir);
  mkdir(folder, 0755);
  write_shards();
  snprintf(source, sizeof source, "%s/part-*.tar", dir);
  determinism();
  order_and_epochs();
  channels_last();
  ranks_and_resume();
  sources();
  damaged_shards_and_cache();
  slots_and_lifetimes();
  released_twice();
  null_arguments();
  held_by_another_thread();
  consumer_threads();
  open_time_split();
  ring_setup_failure();
  workers_below_the_process();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT_EQ(system(cmd), 0);
  return 0;
}
