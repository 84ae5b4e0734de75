/*
 * fork() with a loader open, at moments when its workers are busy (and may hold its lock): the
 * child gets DL_EFORKED from loader calls, can read a batch taken before the fork, releases and
 * closes without hanging, and reads a loader of its own; the parent goes on as if nothing happened.
 */
#include "ringfeed.h"
#include "tar_writer.h"
#include "test.h"
#include "test_data.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

enum { SAMPLES = 60, BATCH = 4, FORKS = 12 };

static char dir[256], shard[512];

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_fork: still running after the alarm: a hang\n";
  write(2, msg, sizeof msg - 1);
  _exit(1);
}

__attribute__((unused)) static int epoch_of(const char *opts) {
  dl_loader *l;
  if (dl_open(&l, shard, opts))
    return -1;
  dl_batch *b;
  int n = 0, r;
  while ((r = dl_next_batch(l, &b)) == 0) {
    n += dl_batch_size(b);
    dl_batch_release(b, NULL);
  }
  dl_close(l);
  return r == DL_EOF ? n : -1;
}

/* The child's part; its exit status says which step failed. */
static int child(dl_loader *l, dl_batch *held, const char *held_key) {
  alarm(30);
  dl_batch *b = NULL;
  if (dl_next_batch(l, &b) != DL_EFORKED || b)
    return 10;
  if (!strstr(dl_last_error(), "fork()"))
    return 11;
  char buf[512];
  if (dl_state_save(l, buf, sizeof buf) != DL_EFORKED || dl_stats_json(l, buf, sizeof buf) != DL_EFORKED)
    return 12;
  if (strcmp(dl_batch_key(held, 0), held_key) != 0)
    return 13;
  dl_batch_release(held, NULL);
  dl_close(l);
/* Not under a sanitizer: ThreadSanitizer cannot follow threads a forked child starts, and this
 * toolchain's AddressSanitizer does not make its allocator fork-safe (a worker in the middle of a
 * malloc at the fork leaves the child's allocator locked). */
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
  if (epoch_of("batch_size=4 workers=2 log=quiet") != SAMPLES)
    return 14;
#endif
  return 0;
}

int main(void) {
  signal(SIGALRM, on_alarm);
  alarm(120);
  snprintf(dir, sizeof dir, "/tmp/ringfeed-fork-%d", (int)getpid());
  ASSERT_EQ(mkdir(dir, 0755), 0);
  snprintf(shard, sizeof shard, "%s/shard.tar", dir);
  test_tar_shard(shard, "k", SAMPLES, SAMPLES, 0, NULL);

  dl_loader *l;
  OPEN_OK(l, shard, "batch_size=4 workers=4 prefetch=2 epochs=0 log=quiet");
  int forks = 0;
  int64_t seen = 0;
  for (int k = 0; forks < FORKS; k++) {
    dl_batch *b;
    ASSERT_EQ(dl_next_batch(l, &b), 0);
    seen += dl_batch_size(b);
    if (k % 3 == 1) { /* the workers are refilling the slot just freed */
      char key[64];
      snprintf(key, sizeof key, "%s", dl_batch_key(b, 0));
      fflush(NULL);
      pid_t pid = fork();
      ASSERT(pid >= 0);
      if (pid == 0)
        _exit(child(l, b, key));
      int status;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAIL_AT("fork %d: child %s %d", forks, WIFEXITED(status) ? "exited with" : "killed by signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      forks++;
    }
    dl_batch_release(b, NULL);
  }
  char stats[4096];
  ASSERT_GT(dl_stats_json(l, stats, sizeof stats), 0);
  dl_close(l);
  printf("%d forks while workers were busy: each child was refused the parent's loader, read its held batch, "
         "closed without a hang and read an epoch of its own; the parent read %lld samples on\n",
         forks, (long long)seen);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT_EQ(system(cmd), 0);
  return 0;
}
