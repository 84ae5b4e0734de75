/*
 * Faults injected into raw reads, so tests can prove what the readers promise: interrupted and
 * short reads are continued, an error or an early end of file becomes a per-sample error (or a
 * failed open) naming the file, and nothing crashes, hangs or is lost without being counted.
 *
 * DL_IO_FAULTS="KIND:N[,KIND:N...]", read once per process: every Nth read (counted over the
 * process, pread and io_uring alike) gets KIND instead of its result. KIND is eintr or eagain (the
 * read did not happen), short (half the bytes), zero (0 bytes: the file seems to end) or eio. The
 * first KIND whose N divides the count wins. Unset, a read pays one relaxed atomic load.
 */
#include "util/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { EINTR_, EAGAIN_, SHORT_, ZERO_, EIO_, KINDS };
static const char *const kind_names[KINDS] = {"eintr", "eagain", "short", "zero", "eio"};

static uint64_t every[KINDS];
static atomic_bool enabled;
static atomic_uint_least64_t reads;
static pthread_once_t parse_once = PTHREAD_ONCE_INIT;

static void parse(void) {
  const char *spec = getenv("DL_IO_FAULTS");
  bool any = false;
  while (spec && *spec) {
    size_t n = strcspn(spec, ":");
    for (int k = 0; k < KINDS && spec[n] == ':'; k++)
      if (strlen(kind_names[k]) == n && strncmp(spec, kind_names[k], n) == 0) {
        every[k] = strtoull(spec + n + 1, NULL, 10);
        any |= every[k] > 0;
      }
    spec = strchr(spec, ',');
    spec = spec ? spec + 1 : NULL;
  }
  if (any)
    dl__log(DL__LOG_WARN, "DL_IO_FAULTS=%s: reads fail on purpose", getenv("DL_IO_FAULTS"));
  atomic_store_explicit(&enabled, any, memory_order_relaxed); /* EVERY is read after pthread_once */
}

void dl__io_faults_init(void) { pthread_once(&parse_once, parse); }

int64_t dl__io_fault(int64_t res) {
  if (!atomic_load_explicit(&enabled, memory_order_relaxed))
    return res;
  uint64_t n = atomic_fetch_add_explicit(&reads, 1, memory_order_relaxed) + 1;
  for (int k = 0; k < KINDS; k++) {
    if (!every[k] || n % every[k])
      continue;
    switch (k) {
    case EINTR_:
      return -EINTR;
    case EAGAIN_:
      return -EAGAIN;
    case SHORT_:
      return res > 1 ? res / 2 : res;
    case ZERO_:
      return res > 0 ? 0 : res;
    default:
      return -EIO;
    }
  }
  return res;
}
