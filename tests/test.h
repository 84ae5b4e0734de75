/* Test helpers: every failed comparison prints both values and where; exit 77 means skipped. */
#ifndef RINGFEED_TEST_H
#define RINGFEED_TEST_H

#include <execinfo.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TEST_SKIP 77

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TEST_CRASH_STACK 1
/* A crash says where: the crashing thread's stack, as addresses in the binary and its libraries
 * (addr2line -e FILE resolves them), then the signal's default action. The sanitizers' own
 * handlers say more, and are left in place. */
static void test_crashed(int sig) {
  void *at[64];
  int n = backtrace(at, 64);
  /* Only what a signal handler may call: fixed text and write(). */
  static const char segv[] = "crashed: SIGSEGV; the stack:\n", bus[] = "crashed: SIGBUS; the stack:\n";
  const char *msg = sig == SIGSEGV ? segv : bus;
  if (write(2, msg, strlen(msg)) < 0)
    _exit(128 + sig);
  backtrace_symbols_fd(at, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}
#endif

/* Unbuffered, so a failure's message and the progress before it stay in order in the log. */
__attribute__((constructor)) static void test_unbuffered_stdout(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
#ifdef TEST_CRASH_STACK
  void *warm[1];
  backtrace(warm, 1); /* loads libgcc's unwinder now, not inside the handler */
  signal(SIGSEGV, test_crashed);
  signal(SIGBUS, test_crashed);
#endif
}

#define FAIL_AT(...)                                                                               \
  do {                                                                                             \
    fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                                \
    fprintf(stderr, __VA_ARGS__);                                                                  \
    fprintf(stderr, "\n");                                                                         \
    exit(1);                                                                                       \
  } while (0)

#define ASSERT(cond)                                                                               \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      FAIL_AT("assertion failed: %s", #cond);                                                      \
  } while (0)

#define ASSERT_CMP(a, op, b)                                                                       \
  do {                                                                                             \
    int64_t a_ = (int64_t)(a), b_ = (int64_t)(b);                                                  \
    if (!(a_ op b_))                                                                               \
      FAIL_AT("%s %s %s: %" PRId64 " vs %" PRId64, #a, #op, #b, a_, b_);                          \
  } while (0)
#define ASSERT_EQ(a, b) ASSERT_CMP(a, ==, b)
#define ASSERT_NE(a, b) ASSERT_CMP(a, !=, b)
#define ASSERT_LT(a, b) ASSERT_CMP(a, <, b)
#define ASSERT_LE(a, b) ASSERT_CMP(a, <=, b)
#define ASSERT_GT(a, b) ASSERT_CMP(a, >, b)
#define ASSERT_GE(a, b) ASSERT_CMP(a, >=, b)

#define ASSERT_STR_EQ(a, b)                                                                        \
  do {                                                                                             \
    const char *a_ = (a), *b_ = (b);                                                               \
    if (!a_ || !b_ || strcmp(a_, b_))                                                              \
      FAIL_AT("%s == %s: \"%s\" vs \"%s\"", #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)");      \
  } while (0)

#define ASSERT_CONTAINS(hay, needle)                                                               \
  do {                                                                                             \
    const char *h_ = (hay), *n_ = (needle);                                                        \
    if (!h_ || !strstr(h_, n_))                                                                    \
      FAIL_AT("\"%s\" does not contain \"%s\"", h_ ? h_ : "(null)", n_);                           \
  } while (0)

/* Opens a loader or fails the test with the library's message. */
#define OPEN_OK(l, src, opts)                                                                      \
  do {                                                                                             \
    int r_ = dl_open(&(l), (src), (opts));                                                         \
    if (r_)                                                                                        \
      FAIL_AT("dl_open(%s, \"%s\"): %s: %s", (src), (opts), dl_errname(r_), dl_last_error());      \
  } while (0)

/* What the library writes to stderr, into the file PATH from now on; returns the descriptor that
 * stderr_back() puts back. */
static inline int stderr_into(const char *path) {
  fflush(stderr);
  int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (saved < 0 || fd < 0 || dup2(fd, 2) != 2)
    FAIL_AT("cannot send stderr to %s", path);
  close(fd);
  return saved;
}

static inline void stderr_back(int saved) {
  fflush(stderr);
  if (dup2(saved, 2) != 2)
    FAIL_AT("cannot put stderr back");
  close(saved);
}

/* The folder that make_shards.sh filled, or skip when the third-party test data is not there. */
static inline const char *test_shards(void) {
  const char *d = getenv("DL_TEST_SHARDS");
  char probe[4096];
  snprintf(probe, sizeof probe, "%s/pixels.tsv", d ? d : "");
  FILE *f = d && *d ? fopen(probe, "r") : NULL;
  if (!f) {
    fprintf(stderr, "skipped: no test shards (the third-party test data is absent)\n");
    exit(TEST_SKIP);
  }
  fclose(f);
  return d;
}

#endif
