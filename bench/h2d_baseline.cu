// The card's own copy rate for one batch of B x 224 x 224 x 3 uint8: plain cudaMemcpyAsync from
// pinned and from pageable memory, timed with events over many copies. The yardstick for the
// loader's copy stage in the same run.
//
// With THREADS, also the ceiling of a loader of raw records at the host's memory speed: THREADS
// threads copy 1 MiB pieces from plain memory (as the kernel copies page-cached file data into a
// read's buffer) into a ring of 4 pinned slots of SLOT_MB, and each full slot is copied to the
// device while the others fill. The loader's raw records from page-cached shards do the same work
// plus the reads' system calls; copying from memory is what "once by the kernel" costs at best.
//
// Usage: h2d_baseline [BATCH] [DEVICE] [THREADS SLOT_MB]; prints one JSON object.
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                                     \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* GB/s of REPS copies of BYTES to DST, from the NSRC sources in turn, after three to warm up. */
static double rate(unsigned char *const *src, int nsrc, void *dst, size_t bytes, cudaStream_t s, int reps) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; i++)
    CHECK(cudaMemcpyAsync(dst, src[i % nsrc], bytes, cudaMemcpyHostToDevice, s));
  CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < reps; i++)
    CHECK(cudaMemcpyAsync(dst, src[i % nsrc], bytes, cudaMemcpyHostToDevice, s));
  CHECK(cudaEventRecord(b, s));
  CHECK(cudaEventSynchronize(b));
  float ms;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return (double)bytes * reps / (ms * 1e6);
}

#define SLOTS 4
#define PIECE ((size_t)1 << 20)
#define SOURCE ((size_t)2 << 30) /* larger than any cache: every piece comes from memory */

/* The ring: slot k holds fill number `seq[k]`; `taken` pieces handed out, `done` copied in. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t work, full;
  unsigned char *slot[SLOTS], *src;
  size_t pieces;
  long seq[SLOTS], taken[SLOTS], done[SLOTS];
  long next_fill, fills; /* the fill the workers take pieces of next; how many in all */
} ring;

static void *filler(void *arg) {
  ring *r = (ring *)arg;
  size_t at = 0;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    int k = 0;
    while (r->next_fill < r->fills) {
      k = (int)(r->next_fill % SLOTS);
      if (r->seq[k] != r->next_fill)
        pthread_cond_wait(&r->work, &r->mu); /* the slot is still on its way to the device */
      else if (r->taken[k] < (long)r->pieces)
        break;
      else
        r->next_fill++; /* every piece of this fill handed out: the next */
    }
    if (r->next_fill >= r->fills)
      break;
    size_t piece = (size_t)r->taken[k]++;
    pthread_mutex_unlock(&r->mu);
    at = (at + PIECE * 7919) % (SOURCE - PIECE); /* wander over the source as reads of many files do */
    memcpy(r->slot[k] + piece * PIECE, r->src + at / 4096 * 4096, PIECE);
    pthread_mutex_lock(&r->mu);
    if (++r->done[k] == (long)r->pieces)
      pthread_cond_broadcast(&r->full);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Fills FILLS slots of SLOT_BYTES with THREADS threads while the device takes them; GB/s delivered
 * after the first ring's worth. Also the device copies alone from the same ring, round robin. */
static void pipeline(int threads, size_t slot_bytes, cudaStream_t s, double *ring_alone, double *filled) {
  ring r;
  memset(&r, 0, sizeof r);
  pthread_mutex_init(&r.mu, NULL);
  pthread_cond_init(&r.work, NULL);
  pthread_cond_init(&r.full, NULL);
  r.pieces = slot_bytes / PIECE;
  slot_bytes = r.pieces * PIECE;
  r.fills = (long)(((size_t)24 << 30) / slot_bytes) + SLOTS; /* about 24 GB after the first ring */
  r.src = (unsigned char *)malloc(SOURCE);
  memset(r.src, 7, SOURCE);
  void *d;
  CHECK(cudaMalloc(&d, slot_bytes));
  for (int k = 0; k < SLOTS; k++) {
    CHECK(cudaHostAlloc((void **)&r.slot[k], slot_bytes, cudaHostAllocPortable));
    memset(r.slot[k], 7, slot_bytes);
    r.seq[k] = k;
  }
  *ring_alone = rate(r.slot, SLOTS, d, slot_bytes, s, 20 * SLOTS);

  pthread_t *t = (pthread_t *)calloc((size_t)threads, sizeof *t);
  for (int i = 0; i < threads; i++)
    if (pthread_create(&t[i], NULL, filler, &r)) {
      fprintf(stderr, "h2d_baseline: could not start filler thread %d\n", i);
      exit(1);
    }
  double t0 = 0;
  for (long f = 0; f < r.fills; f++) {
    int k = (int)(f % SLOTS);
    pthread_mutex_lock(&r.mu);
    while (r.done[k] < (long)r.pieces)
      pthread_cond_wait(&r.full, &r.mu);
    pthread_mutex_unlock(&r.mu);
    if (f == SLOTS)
      t0 = seconds();
    CHECK(cudaMemcpyAsync(d, r.slot[k], slot_bytes, cudaMemcpyHostToDevice, s));
    CHECK(cudaStreamSynchronize(s));
    pthread_mutex_lock(&r.mu); /* the slot is free: it takes fill f + SLOTS */
    r.seq[k] = f + SLOTS;
    r.taken[k] = r.done[k] = 0;
    pthread_cond_broadcast(&r.work);
    pthread_mutex_unlock(&r.mu);
  }
  *filled = (double)slot_bytes * (double)(r.fills - SLOTS) / ((seconds() - t0) * 1e9);
  for (int i = 0; i < threads; i++)
    pthread_join(t[i], NULL);
  free(t);
  for (int k = 0; k < SLOTS; k++)
    cudaFreeHost(r.slot[k]);
  cudaFree(d);
  free(r.src);
}

int main(int argc, char **argv) {
  int batch = argc > 1 ? atoi(argv[1]) : 256;
  int dev = argc > 2 ? atoi(argv[2]) : 0;
  int threads = argc > 3 ? atoi(argv[3]) : 0;
  int slot_mb = argc > 4 ? atoi(argv[4]) : 64;
  if (batch < 1 || dev < 0 || (argc > 3 && (threads < 1 || threads > 1024)) || slot_mb < 1 || slot_mb > 4096) {
    fprintf(stderr, "usage: h2d_baseline [BATCH >= 1] [DEVICE] [THREADS 1-1024 [SLOT_MB 1-4096]]\n");
    return 2;
  }
  size_t bytes = (size_t)batch * 224 * 224 * 3;
  CHECK(cudaSetDevice(dev));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *pinned, *pageable = malloc(bytes), *d;
  CHECK(cudaHostAlloc(&pinned, bytes, cudaHostAllocPortable));
  CHECK(cudaMalloc(&d, bytes));
  memset(pinned, 7, bytes);
  memset(pageable, 7, bytes);
  unsigned char *one[2] = {(unsigned char *)pinned, (unsigned char *)pageable};
  double p = rate(&one[0], 1, d, bytes, s, 50);
  double q = rate(&one[1], 1, d, bytes, s, 10);
  printf("{\"batch_bytes\":%zu,\"pinned_gb_s\":%.3f,\"pageable_gb_s\":%.3f", bytes, p, q);
  if (threads > 0) {
    double alone, filled;
    pipeline(threads, (size_t)slot_mb << 20, s, &alone, &filled);
    printf(",\"threads\":%d,\"slot_mb\":%d,\"ring_pinned_gb_s\":%.3f,\"filled_from_memory_gb_s\":%.3f", threads,
           slot_mb, alone, filled);
  }
  printf("}\n");
  return 0;
}
