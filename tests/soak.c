/*
 * Soak: many epochs through one loader, then as many loaders opened, read and closed one after
 * another, with the process's resident memory, open descriptors, threads and the pinned memory the
 * library holds sampled after each. They must stay flat once warm: a leak of a few bytes per batch
 * or one descriptor per loader shows up here long before it takes a training run down.
 *
 *   soak [--epochs N] [--device cuda] [SOURCE]
 *
 * Without SOURCE it writes its own shard (256 samples). `make soak` runs 50 epochs; make test runs
 * a short one.
 */
#include "ringfeed.h"
#include "tar_writer.h"
#include "test.h"
#include "test_data.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct sample {
  double rss_mb;
  int fds, threads;
  long long pinned;
} sample;

static double rss_mb(void) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2)
    resident = 0;
  if (f)
    fclose(f);
  return (double)resident * (double)sysconf(_SC_PAGESIZE) / 1048576.0;
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)))
    n += e->d_name[0] != '.';
  if (d)
    closedir(d);
  return n - 1; /* the descriptor of the listing itself, or the thread doing it */
}

static long long pinned_of(dl_loader *l) {
  char stats[8192];
  if (!l || dl_stats_json(l, stats, sizeof stats) <= 0)
    return 0;
  const char *p = strstr(stats, "\"pinned_bytes_in_process\":");
  return p ? atoll(p + 26) : -1;
}

static sample take(dl_loader *l) {
  return (sample){rss_mb(), count_entries("/proc/self/fd"), count_entries("/proc/self/task") + 1, pinned_of(l)};
}

/* A sample after dl_close: a thread it joined can stay listed under /proc for a moment after
 * pthread_join returns (the kernel lets the joiner go before it unlists the task), so the count is
 * read again for up to a second until it is down to the process's own THREADS; one still there
 * after that is a thread the loader left running. */
static sample take_closed(int threads) {
  sample s = take(NULL);
  for (int i = 0; i < 1000 && s.threads > threads; i++) {
    usleep(1000);
    s.threads = count_entries("/proc/self/task") + 1;
  }
  return s;
}

static void print(const char *what, int i, sample s) {
  printf("%-8s %4d  rss %8.1f MB  fds %3d  threads %3d  pinned %lld\n", what, i, s.rss_mb, s.fds, s.threads,
         s.pinned);
}

/* Flat: descriptors, threads and pinned bytes exactly, memory within SLACK_MB of the warm sample
 * (not under a sanitizer, whose quarantine and shadow memory grow by design; its leak check
 * covers what this one would). */
static void flat(const char *what, sample warm, sample last, double slack_mb) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  slack_mb = 1e9;
#endif
  if (last.fds != warm.fds || last.threads != warm.threads || last.pinned != warm.pinned ||
      last.rss_mb > warm.rss_mb + slack_mb)
    FAIL_AT("%s: not flat: warm rss %.1f MB fds %d threads %d pinned %lld, last rss %.1f MB fds %d threads %d "
            "pinned %lld", what, warm.rss_mb, warm.fds, warm.threads, warm.pinned, last.rss_mb, last.fds,
            last.threads, last.pinned);
}

/* Reads one epoch (or the rest of the current one); returns the samples. */
static long epoch_of(dl_loader *l, int64_t batches) {
  long n = 0;
  dl_batch *b;
  for (int64_t k = 0; k < batches; k++) {
    int r = dl_next_batch(l, &b);
    if (r)
      FAIL_AT("batch %lld: %s", (long long)k, dl_last_error());
    n += dl_batch_size(b);
    dl_batch_release(b, NULL);
  }
  return n;
}

int main(int argc, char **argv) {
  int epochs = 50;
  const char *device = "cpu", *source = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--epochs") && i + 1 < argc)
      epochs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--device") && i + 1 < argc)
      device = argv[++i];
    else
      source = argv[i];
  }
  ASSERT_GE(epochs, 4);
  alarm(3600);
  char dir[256], shard[300];
  snprintf(dir, sizeof dir, "/tmp/ringfeed-soak-%d", (int)getpid());
  if (!source) {
    ASSERT_EQ(mkdir(dir, 0755), 0);
    snprintf(shard, sizeof shard, "%s/soak.tar", dir);
    test_tar_shard(shard, "s", 256, 8, 0, NULL);
    source = shard;
  }
  char opts[512], once[512];
  static const char *const common = "batch_size=32 workers=4 prefetch=4 image_size=64 crop=random_resized flip=1 "
                                    "drop_last=1 log=quiet";
  snprintf(opts, sizeof opts, "%s device=%s epochs=%d", common, device, epochs);
  snprintf(once, sizeof once, "%s device=%s epochs=1", common, device);
  sample before = take(NULL);
  print("start", 0, before);

  /* One loader, EPOCHS epochs. */
  dl_loader *l;
  if (dl_open(&l, source, opts))
    FAIL_AT("%s", dl_last_error());
  int64_t per_epoch = dl_batches_per_epoch(l);
  sample warm = {0}, s = {0}, last_running = {0};
  for (int e = 0; e < epochs; e++) {
    epoch_of(l, per_epoch);
    s = take(l);
    if (e == 1)
      warm = s;
    if (e == epochs - 2)
      last_running = s; /* after the last epoch the workers have finished and left */
    if (e < 3 || e >= epochs - 2 || e % 10 == 0)
      print("epoch", e, s);
  }
  flat("epochs of one loader", warm, last_running, 4);
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), DL_EOF);
  dl_close(l);
  sample closed = take_closed(before.threads);
  print("closed", 0, closed);

  /* EPOCHS loaders, one after another: sampled with each loader open (its pinned memory is all
   * there is) and after it closed. */
  for (int c = 0; c < epochs; c++) {
    if (dl_open(&l, source, once))
      FAIL_AT("%s", dl_last_error());
    epoch_of(l, dl_batches_per_epoch(l));
    long long pinned = pinned_of(l);
    dl_close(l);
    s = take_closed(before.threads);
    s.pinned = pinned;
    if (c == 1)
      warm = s;
    if (c < 3 || c == epochs - 1 || c % 10 == 0)
      print("reopen", c, s);
  }
  flat("loaders opened and closed", warm, s, 4);
  /* Everything the loaders started is gone: their threads and descriptors. */
  ASSERT_EQ(s.threads, before.threads);
  ASSERT_EQ(s.fds, before.fds);
  printf("soak: %d epochs of one loader and %d loaders in turn: memory, descriptors, threads and pinned "
         "bytes flat\n", epochs, epochs);
  if (source == shard) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ASSERT_EQ(system(cmd), 0);
  }
  return 0;
}
