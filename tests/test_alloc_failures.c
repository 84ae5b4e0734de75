/*
 * Allocation failure at every point: for each N, a child process opens a loader, reads an epoch
 * and closes it with the Nth allocation of the process (malloc, calloc, realloc, aligned, anonymous
 * mmap, in the library and in the codecs it calls) failing. Each run ends cleanly: dl_open or
 * dl_next_batch fails with a message about memory, or samples are errors while every other sample
 * is exact; no crash, no hang, and after dl_close every allocation made since dl_open is freed.
 *
 * The allocator is replaced in this executable (glibc supports that; its own functions then use
 * it too). Under a sanitizer, which owns the allocator, the test is skipped.
 */
#include "ringfeed.h"
#include "tar_writer.h"
#include "test.h"
#include "test_data.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
int main(void) {
  printf("skipped: a sanitizer owns the allocator\n");
  return TEST_SKIP;
}
#else

void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);
void *__libc_memalign(size_t align, size_t n);
void __libc_free(void *p);

/* Seen by the shared libraries too (the build hides symbols by default). */
#define PUBLIC __attribute__((visibility("default")))

static atomic_long calls, fail_at;

/* Blocks allocated since tracking began and not yet freed: an open-addressing set of addresses.
 * Blocks from before (one-time set-up, the parent's) are not counted when freed. */
enum { SET = 1 << 16 };
static void *set[SET];
static atomic_flag set_lock = ATOMIC_FLAG_INIT;
static atomic_bool tracking;
static long live;

static size_t slot_of(void *p) { return ((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull >> 48; }

static void track(void *p, bool add) {
  if (!p || !atomic_load_explicit(&tracking, memory_order_relaxed))
    return;
  while (atomic_flag_test_and_set_explicit(&set_lock, memory_order_acquire))
    ;
  size_t i = slot_of(p);
  if (add) {
    while (set[i] && set[i] != (void *)1)
      i = (i + 1) % SET;
    set[i] = p;
    live++;
  } else {
    for (; set[i]; i = (i + 1) % SET)
      if (set[i] == p) {
        set[i] = (void *)1; /* a tombstone keeps later entries of the chain reachable */
        live--;
        break;
      }
  }
  atomic_flag_clear_explicit(&set_lock, memory_order_release);
}

static void track_start(void) {
  memset(set, 0, sizeof set);
  live = 0;
  atomic_store(&tracking, true);
}

static long track_stop(void) {
  atomic_store(&tracking, false);
  return live;
}

static bool fail_now(void) {
  long at = atomic_load_explicit(&fail_at, memory_order_relaxed);
  if (!at)
    return false;
  if (atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed) + 1 != at)
    return false;
  errno = ENOMEM;
  return true;
}

static void *counted(void *p) {
  track(p, true);
  return p;
}

PUBLIC void *malloc(size_t n) { return fail_now() ? NULL : counted(__libc_malloc(n)); }
PUBLIC void *calloc(size_t n, size_t size) { return fail_now() ? NULL : counted(__libc_calloc(n, size)); }
PUBLIC void *aligned_alloc(size_t align, size_t n) { return fail_now() ? NULL : counted(__libc_memalign(align, n)); }
PUBLIC void *memalign(size_t align, size_t n) { return fail_now() ? NULL : counted(__libc_memalign(align, n)); }
PUBLIC int posix_memalign(void **out, size_t align, size_t n) {
  void *p = fail_now() ? NULL : counted(__libc_memalign(align, n));
  if (!p)
    return ENOMEM;
  *out = p;
  return 0;
}
PUBLIC void free(void *p) {
  track(p, false);
  __libc_free(p);
}
PUBLIC void *realloc(void *p, size_t n) {
  if (!p)
    return malloc(n);
  if (n == 0) {
    free(p);
    return NULL;
  }
  if (fail_now())
    return NULL;
  void *q = __libc_realloc(p, n);
  if (q) {
    track(p, false);
    track(q, true);
  }
  return q;
}

/* The batch slots are an anonymous mapping of their own: it fails in its turn and must be unmapped
 * by dl_close. Mappings of files (io=mmap's shards) are not allocations. */
PUBLIC void *mmap(void *at, size_t n, int prot, int flags, int fd, off_t off) {
  if ((flags & MAP_ANONYMOUS) && fail_now())
    return MAP_FAILED;
  void *p = (void *)syscall(SYS_mmap, at, n, prot, flags, fd, off);
  if (p != MAP_FAILED && (flags & MAP_ANONYMOUS))
    track(p, true);
  return p;
}
PUBLIC int munmap(void *p, size_t n) {
  track(p, false);
  return (int)syscall(SYS_munmap, p, n);
}

enum { SAMPLES = 10, MAX_RUNS = 1500 };

typedef struct reference {
  char keys[SAMPLES][64];
  uint64_t hash[SAMPLES];
  int n;
} reference;

static uint64_t fnv(const void *p, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
  return h;
}

static const char *OPTS = "batch_size=4 workers=2 io_depth=2 prefetch=2 shuffle=0 epochs=1 image_size=16 "
                          "crop=resize on_error=skip log=quiet";

/* What a run with a failed allocation showed. */
enum { UNSEEN, OPEN_FAILED, BATCH_FAILED, SAMPLE_FAILED, OUTCOMES, BROKEN = 10 };
static const char *const outcome_names[OUTCOMES] = {"no effect", "dl_open failed", "a batch failed",
                                                    "samples failed"};

/* One epoch of SOURCE, recorded into REF or checked against it: an outcome, or BROKEN + step. */
static int epoch(const char *source, reference *ref, bool record) {
  dl_loader *l;
  int r = dl_open(&l, source, OPTS);
  if (r)
    return strstr(dl_last_error(), "memory") ? OPEN_FAILED : (printf("open: %s\n", dl_last_error()), BROKEN);
  dl_batch *b;
  int k = 0, outcome = UNSEEN;
  while ((r = dl_next_batch(l, &b)) != DL_EOF) {
    if (r) {
      if (!strstr(dl_last_error(), "memory"))
        return printf("batch: %s\n", dl_last_error()), BROKEN + 1;
      k += k + 4 <= SAMPLES ? 4 : SAMPLES - k;
      outcome = BATCH_FAILED;
      continue;
    }
    DLTensor image;
    if (dl_batch_field(b, "image", &image))
      return BROKEN + 2;
    for (int i = 0; i < dl_batch_size(b); i++, k++) {
      uint64_t h = fnv((const uint8_t *)image.data + (size_t)i * 16 * 16 * 3, 16 * 16 * 3);
      if (record) {
        snprintf(ref->keys[k], sizeof ref->keys[k], "%s", dl_batch_key(b, i));
        ref->hash[k] = h;
        ref->n = k + 1;
      } else if (strcmp(dl_batch_key(b, i), ref->keys[k]) != 0 ||
                 (!dl_batch_sample_error(b, i) && h != ref->hash[k])) {
        return printf("sample %d (%s): other pixels than without the failure\n", k, dl_batch_key(b, i)), BROKEN + 3;
      }
      if (dl_batch_sample_error(b, i) && outcome == UNSEEN)
        outcome = SAMPLE_FAILED;
    }
    dl_batch_release(b, NULL);
  }
  if (k != SAMPLES)
    return printf("%d samples of %d delivered or reported\n", k, SAMPLES), BROKEN + 4;
  char token[512];
  if (dl_state_save(l, token, sizeof token) < 0 && !strstr(dl_last_error(), "memory"))
    return BROKEN + 5;
  dl_close(l);
  return outcome;
}

/* Fails allocation N of a run in a child: its exit status (0: clean). */
static int child_run(const char *source, const char *uncache, reference *ref, long n) {
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    alarm(30);
    if (uncache)
      unlink(uncache);
    track_start();
    atomic_store(&calls, 0);
    atomic_store(&fail_at, n);
    int r = epoch(source, ref, false);
    atomic_store(&fail_at, 0);
    long leaked = track_stop();
    if (r < BROKEN && leaked)
      printf("%ld allocations not freed\n", leaked), r = BROKEN + 6;
    fflush(stdout);
    _exit(r);
  }
  int status;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  return status;
}

/* Runs SOURCE failing each allocation in turn (at most MAX_RUNS of them, evenly spread); UNCACHE,
 * a cached index removed before each run so that building it is part of the run. */
static void torture(const char *name, const char *source, const char *uncache) {
  static reference ref;
  memset(&ref, 0, sizeof ref);
  ASSERT_EQ(epoch(source, &ref, true), UNSEEN); /* also the one-time set-up, before any child */
  ASSERT_EQ(ref.n, SAMPLES);
  track_start();
  atomic_store(&calls, 0);
  if (uncache)
    unlink(uncache);
  atomic_store(&fail_at, -1); /* counts, never fails */
  ASSERT_EQ(epoch(source, &ref, false), UNSEEN);
  atomic_store(&fail_at, 0);
  long total = atomic_load(&calls);
  ASSERT_EQ(track_stop(), 0);
  long step = total / MAX_RUNS + 1;
  int runs = 0, seen[OUTCOMES] = {0};
  for (long n = 1; n <= total + 5; n += step, runs++) {
    int status = child_run(source, uncache, &ref, n);
    if (!WIFEXITED(status) || WEXITSTATUS(status) >= OUTCOMES)
      FAIL_AT("%s: with allocation %ld of %ld failing the child %s %d", name, n, total,
              WIFEXITED(status) ? "exited with" : "was killed by signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    seen[WEXITSTATUS(status)]++;
  }
  printf("%-12s %4ld allocations per run, %4d runs each failing one: ", name, total, runs);
  for (int o = 0; o < OUTCOMES; o++)
    printf("%s%s %d", o ? ", " : "", outcome_names[o], seen[o]);
  printf("; no crash, hang, leak or wrong pixel\n");
  ASSERT_GT(seen[OPEN_FAILED], 0);
}

int main(void) {
  char dir[256], tar[300], rfs[300], folder[300];
  snprintf(dir, sizeof dir, "/tmp/ringfeed-alloc-%d", (int)getpid());
  ASSERT_EQ(mkdir(dir, 0755), 0);
  snprintf(tar, sizeof tar, "%s/shard.tar", dir);
  snprintf(rfs, sizeof rfs, "%s/shard.rfs", dir);
  snprintf(folder, sizeof folder, "%s/folder", dir);
  FILE *f = fopen(tar, "wb");
  ASSERT(f);
  dl_writer *w;
  ASSERT_EQ(dl_writer_open(&w, rfs, ""), 0);
  static const char *const classes[] = {"ant", "bee", "cat"}; /* its class table read at every open */
  ASSERT_EQ(dl_writer_classes(w, classes, 3), 0);
  float depth[4][3];
  for (int i = 0; i < SAMPLES; i++) {
    char key[32], name[400];
    unsigned char *jpg;
    unsigned long len;
    snprintf(key, sizeof key, "k%02d", i);
    test_tar_sample(f, key, i, i, &jpg, &len);
    for (int j = 0; j < 12; j++)
      depth[j / 3][j % 3] = (float)(i * 12 + j);
    ASSERT_EQ(dl_writer_begin(w, key, i), 0);
    ASSERT_EQ(dl_writer_field(w, "image", "jpeg", jpg, len), 0);
    unsigned char npy[128 + sizeof depth];
    static const char dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }";
    size_t header = 128 - 10; /* the version-1 preamble and the dict padded to 128 bytes */
    memcpy(npy, "\x93NUMPY\x01\x00", 8);
    npy[8] = (unsigned char)header, npy[9] = 0;
    memset(npy + 10, ' ', header);
    memcpy(npy + 10, dict, sizeof dict - 1);
    npy[10 + header - 1] = '\n';
    memcpy(npy + 128, depth, sizeof depth);
    ASSERT_EQ(dl_writer_field(w, "depth", "zstd", npy, 128 + sizeof depth), 0);
    ASSERT_EQ(dl_writer_end(w), 0);
    snprintf(name, sizeof name, "%s/c%d/%s.jpg", folder, i % 2, key);
    test_write_file(name, jpg, len);
    free(jpg);
  }
  ASSERT_EQ(tar_write_end(f), 0);
  fclose(f);
  ASSERT_EQ(dl_writer_close(w), 0);
  char rm[400];
  snprintf(rm, sizeof rm, "%s.rfidx", tar);
  torture("tar", tar, NULL);
  torture("tar indexed", tar, rm);
  torture("ringfeed", rfs, NULL);
  torture("ImageFolder", folder, NULL);
  snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
  ASSERT_EQ(system(rm), 0);
  return 0;
}
#endif
