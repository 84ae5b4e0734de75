/*
 * Where nvJPEG's start goes (0.65-0.9 s on H100 and H200 hosts: what decode=auto spends on the CPU
 * alone and decode=gpu|hybrid wait for in dl_open), in a fresh process: CUDA's own start, then the
 * hardware backend's handle and its JPEG state, as the loader makes them, with the memory nvJPEG
 * asks for through allocators that count it (none, at start). Variants, one a process:
 *   --backend cuda|default  the first start makes nvJPEG's CUDA decoder (GPU_HYBRID, or DEFAULT),
 *                           not the engines: whether its start waits as theirs does (with
 *                           --again-alive, the engines are then started while it lives). The
 *                           environment's CUDA_MODULE_LOADING is printed beside it
 *   --beside cuda|hw        a second thread starts nvJPEG's CUDA decoder (or another engine
 *                           handle) meanwhile: whether the two starts share a cost or overlap
 *   --twice                 the same start again after the first is destroyed: what is paid once a
 *                           process, not once a handle
 *   --again-alive           the same start again while the first is still alive: what is paid once
 *                           while the process holds a handle
 *   --info before|after|beside   the engines counted (nvjpegGetHardwareDecoderInfo) between the
 *                           handle and the state, after the state (the loader's order), or on a
 *                           second thread while the state is made
 *   --plain                 nvJPEG's own allocators, not the counting ones
 *   --busy                  beside kernels that keep every SM busy (bench/busy_gpu.cu), as when the
 *                           workers' batches are copied and resized while nvJPEG starts
 *   --spin N                beside N threads that keep a CPU busy each, as the workers do
 *   --copies                beside a thread copying 16 MB from pinned memory to the device over and
 *                           over, as decode=auto's copy thread does while nvJPEG starts
 *   --register              beside a thread pinning and unpinning 16 MB over and over, as the GPU
 *                           stage's starter pins the slots
 *   --queries               beside a thread asking CUDA whether a stream is idle over and over
 *   --blocking              beside a thread waiting for a small copy over and over on an event made
 *                           with cudaEventBlockingSync, as the copy thread waits for its batches
 *   --mallocs               beside a thread taking and freeing 2 MB of device memory over and over
 *   --every MS              a pause of MS milliseconds between the rounds of any of the five above
 *   --delay MS              MS milliseconds between CUDA's start and nvJPEG's, as in a training
 *                           script that built its model before opening the loader
 *   --gap MS                MS milliseconds between the handle and the state: whether the state's
 *                           wait is a period counted from the handle's end, or a wake-up missed
 *                           when the state is asked for at once
 *   --prefault MB           MB of memory touched and given back before nvJPEG starts, as the loader's
 *                           slots and workers touch theirs before decode=auto's start: whether the
 *                           start waits on the kernel handing out fresh pages
 *   --sample                every millisecond of the start, where each of the process's threads is:
 *                           its system call (or running) and the kernel function it sleeps in,
 *                           counted, and how long each of the starting thread's futex waits lasts;
 *                           for each futex wait, whether it has a timeout (and how much of it was
 *                           left when first seen), where its word lies, and the libraries named by
 *                           the words on the waiting thread's stack
 * It also names who made and joined threads meanwhile (this program's pthread_create and
 * pthread_join stand before libc's).
 * Each part reports the starting thread's CPU time, context switches and page faults, and the
 * process's, so that a part spent sleeping or faulting shows as such.
 * Prints one JSON object of milliseconds.
 */
#include "gpu/nvjpeg.h"
#include "core.h"
#include "busy_gpu.h"
#include "thread_waits.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static const dl__nvjpeg *nv;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static double dev_ms, pinned_ms;
static size_t dev_bytes, pinned_bytes;
static int dev_calls, pinned_calls;

static int dev_malloc(void **p, size_t n) {
  double t = dl__now();
  cudaError_t e = cudaMalloc(p, n);
  pthread_mutex_lock(&mu);
  dev_ms += (dl__now() - t) * 1e3, dev_bytes += n, dev_calls++;
  pthread_mutex_unlock(&mu);
  return e;
}

static int dev_free(void *p) {
  return cudaFree(p);
}

static int pinned_malloc(void **p, size_t n, unsigned flags) {
  double t = dl__now();
  cudaError_t e = cudaHostAlloc(p, n, flags);
  pthread_mutex_lock(&mu);
  pinned_ms += (dl__now() - t) * 1e3, pinned_bytes += n, pinned_calls++;
  pthread_mutex_unlock(&mu);
  return e;
}

static int pinned_free(void *p) {
  return cudaFreeHost(p);
}

static int spinning; /* the threads beside the start run while it is set */

static void *spin_run(void *arg) {
  (void)arg;
  while (__atomic_load_n(&spinning, __ATOMIC_RELAXED))
    ;
  return NULL;
}

/* A thread beside the start that keeps CUDA's driver at work without the SMs. */
typedef enum {
  CHORE_NONE,
  CHORE_COPIES,
  CHORE_REGISTER,
  CHORE_QUERIES,
  CHORE_BLOCKING,
  CHORE_MALLOC
} chore_kind;
static int chore_every_ms; /* a pause between the chore's rounds; 0: none */

static void *chore_run(void *arg) {
  chore_kind k = (chore_kind)(intptr_t)arg;
  cudaSetDevice(0);
  bool copies = k == CHORE_COPIES || k == CHORE_BLOCKING;
  size_t n = k == CHORE_BLOCKING ? 64 << 10 : 16 << 20;
  void *host = NULL, *dev = NULL;
  cudaStream_t s;
  cudaEvent_t done;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&done, cudaEventDisableTiming | cudaEventBlockingSync);
  if (copies && (cudaHostAlloc(&host, n, cudaHostAllocPortable) || cudaMalloc(&dev, n)))
    return NULL;
  if (k == CHORE_REGISTER && !(host = malloc(n)))
    return NULL;
  while (__atomic_load_n(&spinning, __ATOMIC_RELAXED)) {
    if (copies)
      cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s);
    if (k == CHORE_COPIES) {
      cudaStreamSynchronize(s);
    } else if (k == CHORE_BLOCKING) {
      cudaEventRecord(done, s);
      cudaEventSynchronize(done);
    } else if (k == CHORE_REGISTER) {
      cudaHostRegister(host, n, cudaHostRegisterPortable);
      cudaHostUnregister(host);
    } else if (k == CHORE_MALLOC) {
      void *m = NULL;
      if (cudaMalloc(&m, 2 << 20) == cudaSuccess)
        cudaFree(m);
    } else {
      cudaStreamQuery(s);
    }
    if (chore_every_ms)
      nanosleep(&(struct timespec){chore_every_ms / 1000, (long)(chore_every_ms % 1000) * 1000000}, NULL);
  }
  if (copies)
    cudaFreeHost(host), cudaFree(dev);
  else
    free(host);
  cudaEventDestroy(done);
  cudaStreamDestroy(s);
  return NULL;
}

static nvjpegDevAllocator_t dev_alloc = {dev_malloc, dev_free};
static nvjpegPinnedAllocator_t pinned_alloc = {pinned_malloc, pinned_free};

typedef enum { INFO_NONE, INFO_BEFORE, INFO_AFTER, INFO_BESIDE } info_when;

/* What a part of the start cost beyond its wall time, for its thread and for the whole process. */
typedef struct usage {
  double cpu_ms, all_cpu_ms;     /* the thread's user and system time; the process's */
  long waits, preempted, faults; /* the thread's voluntary and involuntary switches, minor faults */
  long all_faults;
} usage;

static double cpu_ms(const struct rusage *r) {
  return (r->ru_utime.tv_sec + r->ru_stime.tv_sec) * 1e3 + (r->ru_utime.tv_usec + r->ru_stime.tv_usec) / 1e3;
}

static usage usage_now(void) {
  struct rusage t, p;
  getrusage(RUSAGE_THREAD, &t);
  getrusage(RUSAGE_SELF, &p);
  return (usage){cpu_ms(&t), cpu_ms(&p), t.ru_nvcsw, t.ru_nivcsw, t.ru_minflt, p.ru_minflt};
}

static usage usage_since(usage a) {
  usage b = usage_now();
  return (usage){b.cpu_ms - a.cpu_ms,       b.all_cpu_ms - a.all_cpu_ms, b.waits - a.waits,
                 b.preempted - a.preempted, b.faults - a.faults,         b.all_faults - a.all_faults};
}

static void usage_print(const char *name, usage u) {
  printf(",\"%s_cpu_ms\":%.1f,\"%s_all_cpu_ms\":%.1f,\"%s_waits\":%ld,\"%s_preempted\":%ld,\"%s_faults\":%ld,"
         "\"%s_all_faults\":%ld",
         name, u.cpu_ms, name, u.all_cpu_ms, name, u.waits, name, u.preempted, name, u.faults, name,
         u.all_faults);
}

typedef struct start {
  nvjpegBackend_t backend;
  bool counted; /* through the counting allocators */
  bool sampled; /* the start the sampler watches */
  info_when info;
  unsigned engines, cores;
  double handle_ms, state_ms, info_ms;
  usage handle_use, state_use;
  nvjpegHandle_t h;
  nvjpegJpegState_t st;
  int status;
} start;

static void *info_run(void *arg) {
  start *s = arg;
  cudaSetDevice(0);
  double t = dl__now();
  nv->GetHardwareDecoderInfo(s->h, &s->engines, &s->cores);
  s->info_ms = (dl__now() - t) * 1e3;
  return NULL;
}

static int gap_ms;

static void *start_run(void *arg) {
  start *s = arg;
  cudaSetDevice(0);
  if (s->sampled)
    waits_starter(), waits_part(1);
  double t = dl__now();
  usage u = usage_now();
  s->status =
      nv->CreateEx(s->backend, s->counted ? &dev_alloc : NULL, s->counted ? &pinned_alloc : NULL,
                   NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE | NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, &s->h);
  s->handle_ms = (dl__now() - t) * 1e3;
  s->handle_use = usage_since(u);
  if (s->status)
    return NULL;
  if (s->info == INFO_BEFORE)
    info_run(s);
  if (gap_ms > 0)
    nanosleep(&(struct timespec){gap_ms / 1000, (long)(gap_ms % 1000) * 1000000}, NULL);
  pthread_t beside;
  bool two = s->info == INFO_BESIDE && pthread_create(&beside, NULL, info_run, s) == 0;
  if (s->sampled)
    waits_part(2);
  t = dl__now();
  u = usage_now();
  s->status = nv->JpegStateCreate(s->h, &s->st);
  s->state_ms = (dl__now() - t) * 1e3;
  s->state_use = usage_since(u);
  if (s->sampled)
    waits_part(0);
  if (two)
    pthread_join(beside, NULL);
  if (s->info == INFO_AFTER)
    info_run(s);
  return NULL;
}

static void stop(start *s) {
  if (s->st)
    nv->JpegStateDestroy(s->st);
  if (s->h)
    nv->Destroy(s->h);
  s->st = NULL, s->h = NULL;
}

int main(int argc, char **argv) {
  const char *beside = NULL, *first = "hw";
  bool twice = false, alive = false, counted = true, busy = false, sample = false;
  int spin = 0;
  chore_kind chore = CHORE_NONE;
  int delay_ms = 0, prefault_mb = 0;
  info_when info = INFO_NONE;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--beside") && i + 1 < argc)
      beside = argv[++i];
    else if (!strcmp(argv[i], "--backend") && i + 1 < argc &&
             (!strcmp(argv[i + 1], "hw") || !strcmp(argv[i + 1], "cuda") || !strcmp(argv[i + 1], "default")))
      first = argv[++i];
    else if (!strcmp(argv[i], "--twice"))
      twice = true;
    else if (!strcmp(argv[i], "--again-alive"))
      twice = alive = true;
    else if (!strcmp(argv[i], "--plain"))
      counted = false;
    else if (!strcmp(argv[i], "--busy"))
      busy = true;
    else if (!strcmp(argv[i], "--spin") && i + 1 < argc)
      spin = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--delay") && i + 1 < argc)
      delay_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--gap") && i + 1 < argc)
      gap_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--sample"))
      sample = true;
    else if (!strcmp(argv[i], "--prefault") && i + 1 < argc)
      prefault_mb = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--copies"))
      chore = CHORE_COPIES;
    else if (!strcmp(argv[i], "--register"))
      chore = CHORE_REGISTER;
    else if (!strcmp(argv[i], "--mallocs"))
      chore = CHORE_MALLOC;
    else if (!strcmp(argv[i], "--every") && i + 1 < argc)
      chore_every_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--queries"))
      chore = CHORE_QUERIES;
    else if (!strcmp(argv[i], "--blocking"))
      chore = CHORE_BLOCKING;
    else if (!strcmp(argv[i], "--info") && i + 1 < argc && !strcmp(argv[i + 1], "before"))
      info = INFO_BEFORE, i++;
    else if (!strcmp(argv[i], "--info") && i + 1 < argc && !strcmp(argv[i + 1], "after"))
      info = INFO_AFTER, i++;
    else if (!strcmp(argv[i], "--info") && i + 1 < argc && !strcmp(argv[i + 1], "beside"))
      info = INFO_BESIDE, i++;
    else {
      fprintf(stderr, "usage: nvjpeg_start [--backend hw|cuda|default] [--beside cuda|hw]\n"
                      "  [--twice|--again-alive] [--plain] [--info before|after|beside] [--busy] [--spin N]\n"
                      "  [--delay MS] [--gap MS] [--prefault MB] [--copies|--register|--queries|--blocking|--mallocs]\n"
                      "  [--every MS] [--sample]\n");
      return 2;
    }
  }
  double t0 = dl__now();
  char why[400];
  if (!(nv = dl__nvjpeg_load(why, sizeof why))) {
    fprintf(stderr, "nvjpeg_start: %s\n", why);
    return 77;
  }
  double load_ms = (dl__now() - t0) * 1e3, t = dl__now();
  if (cudaFree(0) != cudaSuccess) {
    fprintf(stderr, "nvjpeg_start: no CUDA device\n");
    return 77;
  }
  double cuda_ms = (dl__now() - t) * 1e3;
  if (delay_ms > 0)
    nanosleep(&(struct timespec){delay_ms / 1000, (long)(delay_ms % 1000) * 1000000}, NULL);
  double prefault_ms = 0;
  if (prefault_mb > 0) { /* touched, then unmapped: the pages go back to the kernel, not to the host */
    t = dl__now();
    size_t n = (size_t)prefault_mb << 20;
    char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      for (size_t k = 0; k < n; k += 4096)
        m[k] = 1;
      munmap(m, n);
    }
    prefault_ms = (dl__now() - t) * 1e3;
  }
  if (busy && busy_gpu_start()) {
    fprintf(stderr, "nvjpeg_start: no GPU to keep busy\n");
    return 77;
  }
  pthread_t spinners[64];
  __atomic_store_n(&spinning, 1, __ATOMIC_RELAXED);
  if (spin > 64)
    spin = 64;
  for (int i = 0; i < spin; i++)
    if (pthread_create(&spinners[i], NULL, spin_run, NULL))
      spin = i;
  pthread_t chorer;
  bool chores = chore != CHORE_NONE && pthread_create(&chorer, NULL, chore_run, (void *)(intptr_t)chore) == 0;
  /* The first start's backend: the CUDA decoders' too wait on the GPU's side, or only the engines'? */
  nvjpegBackend_t backend = !strcmp(first, "cuda")      ? NVJPEG_BACKEND_GPU_HYBRID
                            : !strcmp(first, "default") ? NVJPEG_BACKEND_DEFAULT
                                                        : NVJPEG_BACKEND_HARDWARE;
  start a = {.backend = backend, .counted = counted, .info = info, .sampled = sample};
  bool sampler_on = sample && waits_sampler_start();
  start b = {.backend = beside && !strcmp(beside, "hw") ? NVJPEG_BACKEND_HARDWARE : NVJPEG_BACKEND_GPU_HYBRID,
             .counted = counted};
  pthread_t other;
  t = dl__now();
  bool two = beside && pthread_create(&other, NULL, start_run, &b) == 0;
  start_run(&a);
  double a_ms = (dl__now() - t) * 1e3;
  if (two)
    pthread_join(other, NULL);
  double both_ms = (dl__now() - t) * 1e3;
  if (sampler_on)
    waits_sampler_stop();
  __atomic_store_n(&spinning, 0, __ATOMIC_RELAXED);
  for (int i = 0; i < spin; i++)
    pthread_join(spinners[i], NULL);
  if (chores)
    pthread_join(chorer, NULL);
  const char *busy_why = busy ? busy_gpu_stop() : NULL;
  if (busy_why)
    fprintf(stderr, "nvjpeg_start: %s\n", busy_why);
  const char *loading = getenv("CUDA_MODULE_LOADING");
  printf("{\"backend\":\"%s\",\"module_loading\":\"%s\",\"prefault_mb\":%d,\"prefault_ms\":%.1f,"
         "\"delay_ms\":%d,\"gap_ms\":%d,\"chore\":%d,\"busy\":%d,\"spin\":%d,\"nvjpeg\":\"%s\",\"load_ms\":%.1f,"
         "\"cuda_ms\":%.1f,\"hw_handle_ms\":%.1f,\"hw_state_ms\":%.1f,"
         "\"hw_info_ms\":%.1f,\"engines\":%u,\"hw_ms\":%.1f,\"status\":%d",
         first, loading ? loading : "", prefault_mb, prefault_ms, delay_ms, gap_ms, (int)chore, busy, spin,
         nv->version, load_ms, cuda_ms, a.handle_ms, a.state_ms, a.info_ms, a.engines, a_ms, a.status);
  usage_print("hw_handle", a.handle_use);
  usage_print("hw_state", a.state_use);
  if (sampler_on)
    waits_print("hw_handle", 1), waits_print("hw_state", 2);
  if (two)
    printf(",\"beside\":\"%s\",\"beside_handle_ms\":%.1f,\"beside_state_ms\":%.1f,\"both_ms\":%.1f,"
           "\"beside_status\":%d",
           beside, b.handle_ms, b.state_ms, both_ms, b.status);
  printf(",\"dev_calls\":%d,\"dev_mb\":%.1f,\"dev_ms\":%.1f,\"pinned_calls\":%d,\"pinned_mb\":%.1f,\"pinned_"
         "ms\":%.1f",
         dev_calls, dev_bytes / 1e6, dev_ms, pinned_calls, pinned_bytes / 1e6, pinned_ms);
  if (twice) {
    if (!alive)
      stop(&a);
    start c = {.backend = NVJPEG_BACKEND_HARDWARE, .counted = counted, .info = info};
    t = dl__now();
    start_run(&c);
    printf(",\"again_handle_ms\":%.1f,\"again_state_ms\":%.1f", c.handle_ms, c.state_ms);
    stop(&c);
  }
  waits_threads_print();
  printf("}\n");
  stop(&a);
  stop(&b);
  return a.status ? 1 : 0;
}
