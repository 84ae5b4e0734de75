/*
 * io=mmap: shards mapped whole and read in place, and what keeps a shard that shrinks under its
 * mapping from killing the process.
 *
 * A page of a mapping past the file's end raises SIGBUS when touched. A check of the file's size
 * before each read cannot prevent it (the file may shrink just after), so the fault itself is
 * handled: a worker reading a mapped sample names the mapping it reads (a thread-local guard); a
 * SIGBUS inside it puts a page of zeros where the file's page was, marks the file as changed and
 * lets the read go on. The worker then finds the mark and reads the sample again with pread, which
 * reports a truncated member as any other read does; from then on that file is read with pread.
 * Faults anywhere else go to the handler that was installed before.
 */
#include "io/io.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct guard {
  uintptr_t lo, hi;
  _Atomic int *changed;
} guard;

/* Written only by its own thread, read by that thread's signal handler: SIGBUS from a fault is
 * delivered to the thread that faulted. */
static _Thread_local volatile guard tl_guard;
static struct sigaction previous;
static uintptr_t page_size;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int install_err;

static void pass_on(int sig, siginfo_t *si, void *uc) {
  if (previous.sa_flags & SA_SIGINFO) {
    previous.sa_sigaction(sig, si, uc);
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
  } else {
    /* Nobody else handles it: the default action, when the faulting access runs again. */
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
  }
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  uintptr_t at = (uintptr_t)si->si_addr;
  if (tl_guard.changed && at >= tl_guard.lo && at < tl_guard.hi) {
    int saved = errno;
    /* Sequentially consistent, before the zeros can be seen: pairs with the loads in
     * dl__map_usable and dl__map_guard_leave. */
    atomic_store_explicit(tl_guard.changed, 1, memory_order_seq_cst);
    void *page = (void *)(at & ~(page_size - 1));
    void *p = mmap(page, page_size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    errno = saved;
    if (p != MAP_FAILED)
      return;
  }
  pass_on(sig, si, uc);
}

static void install(void) {
  page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
  struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART};
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGBUS, &sa, &previous))
    install_err = -errno;
}

int dl__dataset_map(dl__dataset *ds) {
  pthread_once(&install_once, install);
  if (install_err)
    return dl__fail(install_err, "option io=mmap: cannot handle SIGBUS: %s", strerror(-install_err));
  uint32_t n = ds->nfiles ? ds->nfiles : 1;
  ds->maps = calloc(n, sizeof *ds->maps);
  ds->map_len = calloc(n, sizeof *ds->map_len);
  ds->map_changed = calloc(n, sizeof *ds->map_changed);
  if (!ds->maps || !ds->map_len || !ds->map_changed)
    return dl__fail(-ENOMEM, "out of memory");
  for (uint32_t i = 0; i < ds->nfiles; i++) {
    struct stat st;
    if (ds->fds[i] < 0 || ds->direct[i] || fstat(ds->fds[i], &st) || st.st_size == 0)
      continue; /* files opened per read (ImageFolder) and O_DIRECT shards are read as before */
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, ds->fds[i], 0);
    if (p == MAP_FAILED)
      return dl__fail(-errno, "option io=mmap: cannot map %s: %s", ds->files[i], strerror(errno));
    ds->maps[i] = p;
    ds->map_len[i] = (uint64_t)st.st_size;
  }
  return 0;
}

bool dl__map_usable(const dl__dataset *ds, uint32_t file) {
  return ds->maps && ds->maps[file] && !atomic_load_explicit(&ds->map_changed[file], memory_order_seq_cst);
}

void dl__map_guard_enter(dl__dataset *ds, uint32_t file) {
  tl_guard.lo = (uintptr_t)ds->maps[file];
  tl_guard.hi = tl_guard.lo + ds->map_len[file];
  atomic_signal_fence(memory_order_seq_cst);
  tl_guard.changed = &ds->map_changed[file];
}

bool dl__map_guard_leave(dl__dataset *ds, uint32_t file) {
  tl_guard.changed = NULL;
  atomic_signal_fence(memory_order_seq_cst);
  return atomic_load_explicit(&ds->map_changed[file], memory_order_seq_cst) != 0;
}

void dl__dataset_unmap(dl__dataset *ds) {
  for (uint32_t i = 0; ds->maps && i < ds->nfiles; i++)
    if (ds->maps[i])
      munmap((void *)ds->maps[i], ds->map_len[i]);
  free(ds->maps);
  free(ds->map_len);
  free(ds->map_changed);
  ds->maps = NULL;
  ds->map_len = NULL;
  ds->map_changed = NULL;
}
