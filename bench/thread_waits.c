/* Where a process's threads wait, for bench/nvjpeg_start --sample: see thread_waits.h. */
#include "thread_waits.h"
#include "core.h"

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* Which part runs (0: none), whether the sampler runs, and the thread whose waits are timed. */
static int phase, sampling;
static pid_t start_tid;
static pthread_t sampler;

enum { PLACES = 48 };
typedef struct place {
  char what[224];
  int n;
} place;
static place places[3][PLACES];

static const char *syscall_name(const char *nr) {
  static const struct {
    int nr;
    const char *name;
  } known[] = {{0, "read"},         {1, "write"},      {7, "poll"},    {9, "mmap"},
               {10, "mprotect"},    {11, "munmap"},    {16, "ioctl"},  {23, "select"},
               {24, "sched_yield"}, {35, "nanosleep"}, {202, "futex"}, {230, "clock_nanosleep"},
               {232, "epoll_wait"}, {257, "openat"},   {271, "ppoll"}, {281, "epoll_pwait"}};
  if (!strncmp(nr, "running", 7))
    return "running";
  int n = atoi(nr);
  for (size_t i = 0; i < sizeof known / sizeof *known; i++)
    if (known[i].nr == n)
      return known[i].name;
  return nr;
}

/* The first line of the file at PATH, without its newline ("" where it cannot be read). */
static void read_line(const char *path, char *buf, size_t cap) {
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f)
    return;
  if (!fgets(buf, (int)cap, f))
    buf[0] = 0;
  fclose(f);
  buf[strcspn(buf, "\n")] = 0;
}

/* The futex the starting thread waits on, as its first sample saw it: the operation, the time its
 * timeout had left (-1: none), and the library whose static data holds the futex word (else the
 * mapping that does: its file, or anonymous, and its permissions). A wait whose timeout runs out
 * each time is a poll, not the GPU's work. */
typedef struct futex_seen {
  unsigned long op;
  double left_ms;
  char in[96];
  char stack[320]; /* the first words on its stack that point into a library other than libc */
} futex_seen;

static double timespec_ms(const struct timespec *t) {
  return (double)t->tv_sec * 1e3 + (double)t->tv_nsec / 1e6;
}

static futex_seen futex_look(const char *line, bool with_stack) {
  futex_seen f = {.left_ms = -1};
  unsigned long word = 0, timeout = 0, sp = 0;
  if (sscanf(line, "%*s %lx %lx %*s %lx %*s %*s %lx", &word, &f.op, &timeout, &sp) < 3)
    return f;
  /* A guess at the callers: 16 KB of the waiting thread's stack, read whole, and the words in it
   * that fall in a library's mapped image (return addresses among them), libc's left out. */
  static uintptr_t words[2048];
  struct iovec to = {words, sizeof words}, from = {(void *)sp, sizeof words};
  size_t at = 0;
  ssize_t got = sp && with_stack ? process_vm_readv(getpid(), &to, 1, &from, 1, 0) : -1;
  for (ssize_t i = 0; got > 0 && i < got / (ssize_t)sizeof *words && at + 48 < sizeof f.stack; i++) {
    Dl_info d;
    if (!words[i] || !dladdr((void *)words[i], &d) || !d.dli_fname || strstr(d.dli_fname, "libc.so"))
      continue;
    const char *slash = strrchr(d.dli_fname, '/');
    at +=
        (size_t)snprintf(f.stack + at, sizeof f.stack - at, "%s%s+0x%lx", at ? " " : "",
                         slash ? slash + 1 : d.dli_fname, (unsigned long)(words[i] - (uintptr_t)d.dli_fbase));
  }
  struct timespec t;
  struct iovec mine = {&t, sizeof t}, theirs = {(void *)timeout, sizeof t};
  if (timeout && process_vm_readv(getpid(), &mine, 1, &theirs, 1, 0) == (ssize_t)sizeof t) {
    if ((f.op & 127) == 0) { /* FUTEX_WAIT: a relative timeout */
      f.left_ms = timespec_ms(&t);
    } else { /* FUTEX_WAIT_BITSET and others: a deadline, CLOCK_REALTIME (flag 256) or CLOCK_MONOTONIC */
      struct timespec now;
      clock_gettime(f.op & 256 ? CLOCK_REALTIME : CLOCK_MONOTONIC, &now);
      f.left_ms = timespec_ms(&t) - timespec_ms(&now);
    }
  }
  Dl_info where;
  if (dladdr((void *)word, &where) && where.dli_fname) {
    const char *slash = strrchr(where.dli_fname, '/');
    snprintf(f.in, sizeof f.in, "%s", slash ? slash + 1 : where.dli_fname);
    return f;
  }
  /* Elsewhere: the mapping that holds it, by its file (or none: anonymous) and its permissions,
   * whose fourth letter says whether it is shared with other processes ('s') or private ('p'). */
  FILE *maps = fopen("/proc/self/maps", "r");
  char line_[512];
  while (maps && fgets(line_, sizeof line_, maps)) {
    unsigned long from, to;
    char perms[8], file[256] = "";
    if (sscanf(line_, "%lx-%lx %7s %*s %*s %*s %255s", &from, &to, perms, file) >= 3 && word >= from &&
        word < to) {
      snprintf(f.in, sizeof f.in, "%s %s", file[0] ? file : "anonymous", perms);
      break;
    }
  }
  if (maps)
    fclose(maps);
  return f;
}

static futex_seen starter_futex; /* the starting thread's, at the last sample */
static bool starter_futex_on;    /* the starter waited on a futex at the last sample */
static double others_left_ms[3];
static futex_seen others_seen[3]; /* the other thread's wait with the longest timeout left */

/* Returns whether the starting thread was waiting on a futex. */
static bool sample_once(int ph, pid_t me) {
  bool waiting = false;
  pid_t starter = __atomic_load_n(&start_tid, __ATOMIC_RELAXED);
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  while (d && (e = readdir(d))) {
    pid_t tid = atoi(e->d_name);
    if (tid <= 0 || tid == me)
      continue;
    char path[64], nr[64], wchan[64], what[224];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", tid);
    char line[256], req[24] = "";
    read_line(path, line, sizeof line); /* the call's number and arguments, or "running" */
    snprintf(nr, sizeof nr, "%.*s", (int)strcspn(line, " "), line);
    if (!strcmp(nr, "16")) /* ioctl: its request, the third field */
      sscanf(line, "%*s %*s %23s", req);
    snprintf(path, sizeof path, "/proc/self/task/%d/wchan", tid);
    read_line(path, wchan, sizeof wchan);
    char held[128] = ""; /* a futex: timed or not, and whose static data holds its word */
    if (!strcmp(nr, "202")) {
      /* The stack where it is new: the starter's first sample of a wait, another's longer timeout. */
      futex_seen f = futex_look(line, tid == starter && !starter_futex_on);
      snprintf(held, sizeof held, " %s%s%s", f.left_ms >= 0 ? "timed" : "untimed", f.in[0] ? " in " : "",
               f.in);
      if (tid == starter)
        waiting = true, starter_futex = f;
      else if (f.left_ms > others_left_ms[ph] + 1) /* the longest timeout another thread's wait had left */
        others_left_ms[ph] = f.left_ms, others_seen[ph] = futex_look(line, true);
    }
    char comm[32];
    snprintf(path, sizeof path, "/proc/self/task/%d/comm", tid);
    read_line(path, comm, sizeof comm);
    snprintf(what, sizeof what, "%s %s %s%s%s %s%s", tid == starter ? "start" : "other", comm,
             syscall_name(nr), req[0] ? " " : "", req, wchan, held);
    for (int i = 0; i < PLACES; i++)
      if (!places[ph][i].n || !strcmp(places[ph][i].what, what)) {
        snprintf(places[ph][i].what, sizeof places[ph][i].what, "%s", what);
        places[ph][i].n++;
        break;
      }
  }
  if (d)
    closedir(d);
  starter_futex_on = waiting;
  return waiting;
}

/* Each of the starting thread's futex waits, in milliseconds, as the samples saw it begin and end. */
enum { WAITS = 32 };
static double waits_ms[3][WAITS];
static futex_seen waits_seen[3][WAITS];
static int nwaits[3];

static void *sample_run(void *arg) {
  (void)arg;
  pid_t me = (pid_t)syscall(SYS_gettid);
  double from = -1;
  int was = 0;
  futex_seen first = {0};
  while (__atomic_load_n(&sampling, __ATOMIC_RELAXED)) {
    int ph = __atomic_load_n(&phase, __ATOMIC_RELAXED);
    bool waiting = ph && sample_once(ph, me);
    double now = dl__now();
    if (from >= 0 && (!waiting || ph != was)) {
      if (nwaits[was] < WAITS) {
        waits_seen[was][nwaits[was]] = first;
        waits_ms[was][nwaits[was]++] = (now - from) * 1e3;
      }
      from = -1;
    }
    if (waiting && from < 0)
      from = now, first = starter_futex;
    was = ph;
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  return NULL;
}

void waits_print(const char *name, int ph) {
  printf(",\"%s_places\":{", name);
  for (int k = 0, first = 1; k < 8; k++) { /* the eight most seen, most first */
    int best = -1;
    for (int i = 0; i < PLACES && places[ph][i].n; i++)
      if (places[ph][i].n > 0 && (best < 0 || places[ph][i].n > places[ph][best].n))
        best = i;
    if (best < 0)
      break;
    printf("%s\"%s\":%d", first ? "" : ",", places[ph][best].what, places[ph][best].n);
    places[ph][best].n = -places[ph][best].n; /* printed */
    first = 0;
  }
  printf("},\"%s_futex_waits_ms\":[", name);
  for (int i = 0; i < nwaits[ph]; i++)
    printf("%s%.1f", i ? "," : "", waits_ms[ph][i]);
  printf("],\"%s_others_timeout_left_ms\":%.1f,\"%s_other_timed\":{\"op\":\"0x%lx\",\"word_in\":\"%s\","
         "\"stack\":\"%s\"},\"%s_futexes\":[",
         name, others_left_ms[ph], name, others_seen[ph].op, others_seen[ph].in, others_seen[ph].stack, name);
  for (int i = 0; i < nwaits[ph]; i++)
    printf("%s{\"ms\":%.1f,\"op\":\"0x%lx\",\"timeout_left_ms\":%.1f,\"word_in\":\"%s\",\"stack\":\"%s\"}",
           i ? "," : "", waits_ms[ph][i], waits_seen[ph][i].op, waits_seen[ph][i].left_ms,
           waits_seen[ph][i].in, waits_seen[ph][i].stack);
  printf("]");
}

/* Threads made and joined while nvJPEG starts, and by whom: this program's pthread_create and
 * pthread_join stand before libc's for every library, so that a wait in a join is named by the
 * library that joins and the one whose code the thread ran (a library and an offset in it). */
enum { MADE = 32 };
typedef struct thread_seen {
  void *by, *routine;
  int phase;
  double ms; /* a join's length */
} thread_seen;
static thread_seen made[MADE], joined[MADE];
static int nmade, njoined;

static void where_in(void *at, char *buf, size_t cap) {
  Dl_info d;
  if (!at || !dladdr(at, &d) || !d.dli_fname) {
    snprintf(buf, cap, "%p", at);
    return;
  }
  const char *slash = strrchr(d.dli_fname, '/');
  snprintf(buf, cap, "%s+0x%lx%s%s", slash ? slash + 1 : d.dli_fname,
           (unsigned long)((char *)at - (char *)d.dli_fbase), d.dli_sname ? " " : "",
           d.dli_sname ? d.dli_sname : "");
}

__attribute__((visibility("default"))) int pthread_create(pthread_t *t, const pthread_attr_t *attr,
                                                          void *(*fn)(void *), void *arg) {
  static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
  if (!real)
    *(void **)&real = dlsym(RTLD_NEXT, "pthread_create");
  int i = __atomic_fetch_add(&nmade, 1, __ATOMIC_RELAXED);
  if (i < MADE)
    made[i] = (thread_seen){.by = __builtin_return_address(0), .routine = (void *)fn,
                            .phase = __atomic_load_n(&phase, __ATOMIC_RELAXED)};
  return real(t, attr, fn, arg);
}

__attribute__((visibility("default"))) int pthread_join(pthread_t t, void **ret) {
  static int (*real)(pthread_t, void **);
  if (!real)
    *(void **)&real = dlsym(RTLD_NEXT, "pthread_join");
  int ph = __atomic_load_n(&phase, __ATOMIC_RELAXED);
  double t0 = dl__now();
  int rc = real(t, ret);
  int i = __atomic_fetch_add(&njoined, 1, __ATOMIC_RELAXED);
  if (i < MADE)
    joined[i] = (thread_seen){__builtin_return_address(0), NULL, ph, (dl__now() - t0) * 1e3};
  return rc;
}

void waits_threads_print(void) {
  char by[160], routine[160];
  printf(",\"threads_made\":[");
  for (int i = 0; i < nmade && i < MADE; i++) {
    where_in(made[i].by, by, sizeof by);
    where_in(made[i].routine, routine, sizeof routine);
    printf("%s{\"by\":\"%s\",\"runs\":\"%s\",\"phase\":%d}", i ? "," : "", by, routine, made[i].phase);
  }
  printf("],\"threads_joined\":[");
  for (int i = 0; i < njoined && i < MADE; i++) {
    where_in(joined[i].by, by, sizeof by);
    printf("%s{\"by\":\"%s\",\"ms\":%.1f,\"phase\":%d}", i ? "," : "", by, joined[i].ms, joined[i].phase);
  }
  printf("]");
}

void waits_starter(void) {
  __atomic_store_n(&start_tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELAXED);
}

void waits_part(int part) {
  __atomic_store_n(&phase, part, __ATOMIC_RELAXED);
}

bool waits_sampler_start(void) {
  __atomic_store_n(&sampling, 1, __ATOMIC_RELAXED);
  return pthread_create(&sampler, NULL, sample_run, NULL) == 0;
}

void waits_sampler_stop(void) {
  __atomic_store_n(&sampling, 0, __ATOMIC_RELAXED);
  pthread_join(sampler, NULL);
}
