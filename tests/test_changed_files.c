/*
 * Shards changed under a running loader, for every io mode: truncated, deleted, overwritten in
 * place, replaced by rename. Nothing crashes or hangs, every sample is either delivered or counted
 * as an error naming the shard and member, and samples read before the change keep their data.
 * With io=mmap a truncated shard would raise SIGBUS on the pages it lost; the fault of one of the
 * loader's reads becomes a per-sample error, and any other SIGBUS still reaches its own handler.
 */
#include "ringfeed.h"
#include "tar_writer.h"
#include "test.h"
#include "test_data.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

enum { SAMPLES = 150, BATCH = 10 };

static char dir[256];
static long sample_end[SAMPLES]; /* where each sample's members end in the last shard written */

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_changed_files: still running after the alarm: a hang\n";
  write(2, msg, sizeof msg - 1);
  _exit(1);
}

/* SAMPLES samples keyed s0000.. with label BASE + i; eight images of other sizes, repeated. */
static void write_shard(const char *path, int base) { test_tar_shard(path, "s", SAMPLES, 8, base, sample_end); }

/* Shards are written once (encoding is the slow part) and copied for each run. */
static char first[600], second[600];

static void copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  ASSERT(in && out);
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0)
    ASSERT_EQ(fwrite(buf, 1, n, out), n);
  fclose(in);
  ASSERT_EQ(fclose(out), 0);
}

static off_t size_of(const char *path) {
  struct stat st;
  ASSERT_EQ(stat(path, &st), 0);
  return st.st_size;
}

typedef enum { TRUNCATE, DELETE, OVERWRITE, RENAME } change;
static const char *const change_names[] = {"truncated", "deleted", "overwritten", "replaced"};

static long cut_at; /* where TRUNCATE cut the shard */

static void apply(change what, const char *path) {
  char other[600];
  snprintf(other, sizeof other, "%s.new", path);
  off_t size = size_of(path);
  cut_at = size / 3;
  switch (what) {
  case TRUNCATE:
    ASSERT_EQ(truncate(path, cut_at), 0);
    break;
  case DELETE:
    ASSERT_EQ(unlink(path), 0);
    break;
  case OVERWRITE: { /* the same inode, size and layout; every byte past the first MiB another */
    int fd = open(path, O_WRONLY);
    ASSERT(fd >= 0);
    static unsigned char junk[1 << 16];
    for (size_t i = 0; i < sizeof junk; i++)
      junk[i] = (unsigned char)(i * 131 + 7);
    for (off_t at = size / 3; at < size; at += (off_t)sizeof junk) {
      size_t n = size - at < (off_t)sizeof junk ? (size_t)(size - at) : sizeof junk;
      ASSERT_EQ(pwrite(fd, junk, n, at), (ssize_t)n);
    }
    close(fd);
    break;
  }
  case RENAME: { /* another shard of the same size and mtime in its place */
    struct stat st;
    ASSERT_EQ(stat(path, &st), 0);
    copy_file(second, other);
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    ASSERT_EQ(utimensat(AT_FDCWD, other, times, 0), 0);
    ASSERT_EQ(rename(other, path), 0);
    break;
  }
  }
}

/* Reads one batch, changes the shard WHAT, reads on to the end; false when IO is not available. */
static bool run(const char *io, change what, const char *on_error) {
  char path[512], opts[256];
  snprintf(path, sizeof path, "%s/shard-%s-%s.tar", dir, io, change_names[what]);
  copy_file(first, path);
  snprintf(opts, sizeof opts, "batch_size=%d workers=2 prefetch=2 shuffle=0 epochs=1 image_size=32 crop=resize "
                              "log=quiet io=%s on_error=%s", BATCH, io, on_error);
  dl_loader *l;
  int r = dl_open(&l, path, opts);
  if (r && strcmp(io, "uring") == 0) {
    printf("io=uring: not available here (%s)\n", dl_last_error());
    return false;
  }
  ASSERT_EQ(r, 0);
  dl_batch *b;
  int good = 0, bad = 0, batches = 0;
  char failure[1024] = "";
  while ((r = dl_next_batch(l, &b)) != DL_EOF) {
    if (r) { /* on_error=fail: the batch with the first bad sample, and the loader goes on */
      ASSERT_STR_EQ(on_error, "fail");
      if (!failure[0])
        snprintf(failure, sizeof failure, "%s", dl_last_error());
      bad += BATCH;
      batches++;
      continue;
    }
    DLTensor label;
    ASSERT_EQ(dl_batch_field(b, "label", &label), 0);
    for (int i = 0; i < dl_batch_size(b); i++) {
      int k = batches * BATCH + i;
      char key[32];
      snprintf(key, sizeof key, "s%04d", k);
      ASSERT_STR_EQ(dl_batch_key(b, i), key); /* the order and keys of the index taken at open */
      if (dl_batch_sample_error(b, i)) {
        bad++;
        continue;
      }
      good++;
      if (k < 3 * BATCH) /* read before the change (the first batch and the two prefetched) */
        ASSERT_EQ(((int64_t *)label.data)[i], k);
    }
    dl_batch_release(b, NULL);
    if (batches++ == 0)
      apply(what, path);
  }
  char stats[4096];
  ASSERT_GT(dl_stats_json(l, stats, sizeof stats), 0);
  dl_close(l);
  ASSERT_EQ(good + bad, SAMPLES);
  switch (what) {
  case TRUNCATE: { /* every sample past the cut is lost and said to be (whole batches with fail) */
    int cut = 0;
    while (cut < SAMPLES && sample_end[cut] <= cut_at)
      cut++;
    int lost = strcmp(on_error, "fail") == 0 ? SAMPLES - cut / BATCH * BATCH : SAMPLES - cut;
    ASSERT_EQ(bad, lost);
    if (strcmp(on_error, "fail") == 0) {
      ASSERT_CONTAINS(failure, path);
      ASSERT_CONTAINS(failure, "member s0");
      ASSERT_CONTAINS(failure, "truncated");
    }
    break;
  }
  case DELETE:
  case RENAME: /* the loader reads the file it opened */
    ASSERT_EQ(bad, 0);
    break;
  case OVERWRITE: /* bytes that are no JPEG: errors, never a crash */
    ASSERT_GT(bad, SAMPLES / 2);
    break;
  }
  printf("io=%-5s %-11s on_error=%-4s: %3d delivered, %3d counted as errors%s%s\n", io, change_names[what],
         on_error, good, bad, failure[0] ? ": " : "", failure);
  unlink(path);
  return true;
}

static void own_handler(int sig) {
  (void)sig;
  _exit(42);
}

/* In a child: a SIGBUS of a mapping that is not the loader's goes to the handler installed before
 * the loader's (or kills the process when there is none), after a loader with io=mmap opened. */
static int foreign_sigbus(bool own) {
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    if (own)
      signal(SIGBUS, own_handler);
    char mine[600];
    dl_loader *l;
    if (dl_open(&l, first, "batch_size=10 workers=1 io=mmap log=quiet"))
      _exit(103);
    snprintf(mine, sizeof mine, "%s/mine-%d", dir, own);
    int fd = open(mine, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, 1 << 16))
      _exit(104);
    volatile unsigned char *p = mmap(NULL, 1 << 16, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED || ftruncate(fd, 0))
      _exit(105);
    unsigned char c = p[8192]; /* past the end now */
    (void)c;
    _exit(106); /* survived */
  }
  int status;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  return status;
}

int main(void) {
  signal(SIGALRM, on_alarm);
  alarm(240);
  snprintf(dir, sizeof dir, "/tmp/ringfeed-changed-%d", (int)getpid());
  ASSERT_EQ(mkdir(dir, 0755), 0);
  snprintf(second, sizeof second, "%s/second.tar", dir);
  write_shard(second, 1000);
  snprintf(first, sizeof first, "%s/first.tar", dir);
  write_shard(first, 0); /* last: sample_end describes it */
  const char *ios[] = {"pread", "uring", "mmap"};
  int modes = (int)(sizeof ios / sizeof *ios);
  for (int m = 0; m < modes; m++)
    for (int c = TRUNCATE; c <= RENAME; c++)
      if (!run(ios[m], (change)c, "skip"))
        break;
  for (int m = 0; m < modes; m++)
    run(ios[m], TRUNCATE, "fail");
  /* Killed by the signal, or under a sanitizer, ended by the sanitizer's report of it. */
  int status = foreign_sigbus(false);
  ASSERT(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) < 100));
  if (WIFSIGNALED(status)) /* SIGABRT: a sanitizer's report with abort_on_error */
    ASSERT(WTERMSIG(status) == SIGBUS || WTERMSIG(status) == SIGABRT);
  status = foreign_sigbus(true);
  ASSERT(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 42);
  printf("a SIGBUS outside the loader's mappings still kills, or reaches the handler installed before\n");
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT_EQ(system(cmd), 0);
  return 0;
}
