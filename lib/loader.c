/*
 * dl_open() and the consumer's side: batches handed out in order, released in any order, and
 * kept alive past dl_close() while exported tensors still point into them.
 *
 * Lock order: l->mu only.
 */
#include "internal.h"
#include "gpu/gpu.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

double dl__now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Pinned host memory held by all loaders of the process, for the stats: a soak test samples it. */
static _Atomic size_t pinned_in_process;

static void free_loader(dl_loader *l) {
  if (l->cuda)
    dl__cuda_stop(l);
  dl__cache_stop(l); /* after the workers, who read its copies */
  for (int s = 0; s < l->nstreams; s++) {
    dl__sampler_free(&l->streams[s].sm);
    dl_batch *slots = l->streams[s].slots;
    for (int i = 0; slots && i < l->o.prefetch; i++) {
      free(slots[i].label);
      free(slots[i].key);
      free(slots[i].sample_err);
      free(slots[i].jobs);
      free(slots[i].on_cpu);
      dl__slot_bytes_free(l, &slots[i]);
    }
    free(slots);
  }
  if (l->cuda)
    atomic_fetch_sub(&pinned_in_process, l->host_mem_bytes);
  if (l->host_mem)
    dl__host_free(l, l->host_mem, l->host_mem_bytes);
  free(l->split.rank);
  dl__cuda_close(l);
  dl__dataset_free(&l->ds);
  dl__jpeg_rows_free(l->jpeg_rows);
  dl__mix_free(&l->mix);
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->work_cv);
  pthread_cond_destroy(&l->ready_cv);
  free(l);
}

/* Many shards stay open for the loader's life: lift the soft limit on descriptors. */
static void raise_fd_limit(void) {
  struct rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

/* CPUs this process may run on (its affinity: taskset, cgroup cpusets), else those online. */
static int usable_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* torchrun's LOCAL_WORLD_SIZE: the ranks of this job on this host, which share its CPUs and memory. */
static int local_ranks(void) {
  const char *v = getenv("LOCAL_WORLD_SIZE");
  int n = v ? atoi(v) : 0;
  return n > 0 ? n : 1;
}

/* workers=auto (the default), chosen once the JPEG decoding is known, and said why: the CPUs this
 * process may use, shared with the other ranks of the host, less one for each GPU that decodes
 * JPEGs. Its copy thread spends most of its time in nvJPEG's host calls (8-16 ms a batch on an
 * H200) and sharing a CPU with a worker slowed both: on an H200 host of 16 CPUs, hybrid decode
 * with 15 workers ran 8-22% faster than with 16 at the same split. */
static void choose_workers(dl_loader *l) {
  if (l->o.workers) {
    snprintf(l->workers_reason, sizeof l->workers_reason, "workers=%d as given", l->o.workers);
    return;
  }
  int cpus = usable_cpus(), ranks = local_ranks(), share = cpus / ranks > 0 ? cpus / ranks : 1;
  bool gpu_decodes = l->decode != DL__DECODE_CPU || l->decode_starting;
  int left = gpu_decodes ? (l->o.ndevices < share ? l->o.ndevices : share - 1) : 0;
  l->o.workers = share - left;
  l->pace.on = l->o.workers > 1;
  l->pace.active = l->o.workers;
  char basis[96];
  if (ranks > 1)
    snprintf(basis, sizeof basis, "the %d CPUs this process may use shared by LOCAL_WORLD_SIZE=%d ranks", cpus, ranks);
  else
    snprintf(basis, sizeof basis, "the CPUs this process may use");
  snprintf(l->workers_reason, sizeof l->workers_reason, "workers=auto: %d, %s%s", l->o.workers, basis,
           !left          ? ""
           : l->o.ndevices > 1 ? ", less one for each GPU's thread feeding its JPEG decoder"
                               : ", less one for the thread feeding the GPU's JPEG decoder");
}

static int64_t memory_budget(const dl_loader *l, int ranks) {
  if (l->o.memory_budget)
    return l->o.memory_budget;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? (int64_t)pages * page / 8 / ranks : INT64_C(1) << 30;
}

/* prefetch=auto (the default), chosen once here and said why: four slots per stream (one being
 * copied or consumed, the rest filling), fewer when memory_budget (auto: an eighth of the host's
 * memory, shared by its ranks) does not hold them, never fewer than two. */
static void choose_prefetch(dl_loader *l) {
  int ranks = local_ranks();
  size_t image = l->has_image ? (size_t)l->o.height * l->o.width * (size_t)l->o.channels * (size_t)l->o.batch_size : 0;
  size_t arena = l->has_image && l->o.ndevices && l->o.decode != DL__DECODE_CPU ? dl__gpu_arena_size(l) : 0;
  size_t slot = (image + l->field_block + arena) * (size_t)l->nstreams; /* one slot of every stream */
  int64_t budget = memory_budget(l, ranks);
  const char *whose = l->o.memory_budget ? "memory_budget"
                      : ranks > 1 ? "memory_budget=auto (an eighth of the host's memory, shared by its ranks)"
                                  : "memory_budget=auto (an eighth of the host's memory)";
  if (l->o.prefetch) {
    snprintf(l->prefetch_reason, sizeof l->prefetch_reason, "prefetch=%d as given: %.1f MB of slots", l->o.prefetch,
             (double)slot * l->o.prefetch / 1e6);
    return;
  }
  int64_t fit = slot ? budget / (int64_t)slot : 4;
  l->o.prefetch = fit >= 4 ? 4 : fit >= 2 ? (int)fit : 2;
  snprintf(l->prefetch_reason, sizeof l->prefetch_reason, "prefetch=auto: %d slots of %.1f MB; %s is %.0f MB%s",
           l->o.prefetch, (double)slot / 1e6, whose, (double)budget / 1e6,
           fit < 2 ? ", less than the two slots a pipeline needs" : fit < 4 ? ", which holds no more" : "");
  if (fit < 2)
    dl__log(DL__LOG_WARN, "%s", l->prefetch_reason);
}

static size_t page_round(size_t n) { return (n + 4095) / 4096 * 4096; }

/* Faulting the slots in 4 KiB at a time cost 2-4% of an epoch of 2 workers on a 2-core machine
 * (39,000 faults for four slots of 256 x 224 x 224 x 3) and 60-100 ms of the first batch; in huge
 * pages, 2,300 faults. Over three epochs of 16 workers on an H200 host it made no difference. */
void *dl__slots_map(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  madvise(p, bytes, MADV_HUGEPAGE); /* a hint: without it the pages are small, nothing else */
  return p;
}

void dl__slots_unmap(void *p, size_t bytes) { munmap(p, bytes); }

static int alloc_slots(dl_loader *l) {
  int ch = l->o.channels;
  l->sample_bytes = l->has_image ? (size_t)l->o.height * l->o.width * ch : 0;
  l->image_bytes = l->sample_bytes * (size_t)l->o.batch_size;
  size_t nslots = (size_t)l->o.prefetch * (size_t)l->nstreams;
  /* A slot's images, its tensor fields, and the compressed JPEGs the GPU decodes, which the
   * workers read into; a slot is one range of pages, so that it can be pinned by itself. What was
   * allocated before a failure is freed with the loader. */
  size_t images = page_round(l->image_bytes), fields = page_round(l->field_block);
  l->slot_stride = images + fields + page_round(l->arena_bytes);
  if (!l->slot_stride)
    l->slot_stride = 4096;
  size_t total = l->slot_stride * nslots;
  if (!(l->host_mem = dl__host_alloc(l, total)))
    return dl__fail(-ENOMEM, "could not allocate %zu bytes of %s batch memory", total,
                    l->o.ndevices ? "pinned" : "host");
  if (l->arena_bytes && !(l->split.rank = calloc((size_t)l->o.batch_size, sizeof *l->split.rank)))
    return dl__fail(-ENOMEM, "out of memory");
  l->host_mem_bytes = total;
  if (l->cuda)
    atomic_fetch_add(&pinned_in_process, l->host_mem_bytes);
  for (int s = 0; s < l->nstreams; s++) {
    dl_batch *slots = calloc((size_t)l->o.prefetch, sizeof *slots);
    l->streams[s].slots = slots;
    if (!slots)
      return dl__fail(-ENOMEM, "out of memory");
    for (int i = 0; i < l->o.prefetch; i++) {
      dl_batch *b = &slots[i];
      uint8_t *at = l->host_mem + l->slot_stride * ((size_t)s * (size_t)l->o.prefetch + (size_t)i);
      b->l = l;
      b->stream = s;
      b->k = -1;
      b->image = at;
      if (l->field_block)
        b->fields = at + images;
      if (l->arena_bytes) {
        b->arena = at + images + fields;
        if (!(b->jobs = calloc((size_t)l->o.batch_size, sizeof *b->jobs)) ||
            !(b->on_cpu = calloc((size_t)l->o.batch_size, sizeof *b->on_cpu)))
          return dl__fail(-ENOMEM, "out of memory");
      }
      b->label = calloc((size_t)l->o.batch_size, sizeof *b->label);
      b->key = calloc((size_t)l->o.batch_size, sizeof *b->key);
      b->sample_err = calloc((size_t)l->o.batch_size, sizeof *b->sample_err);
      if (!b->label || !b->key || !b->sample_err || dl__slot_bytes_alloc(l, b))
        return dl__fail(-ENOMEM, "out of memory");
    }
  }
  return 0;
}

/* shuffle_block: where each shard's samples start, for the sampler's two-level order. */
static int set_blocks(dl_loader *l, dl__sampler *sm) {
  const dl__dataset *ds = &l->ds;
  int64_t *first = calloc((size_t)ds->nfiles + 1, sizeof *first);
  if (!first)
    return dl__fail(-ENOMEM, "out of memory");
  /* Samples are added shard by shard: counts give the starts; out of order leaves first[n] short. */
  uint32_t at = 0;
  int64_t grouped = 0;
  for (size_t i = 0; i < ds->n; i++) {
    uint32_t f = ds->samples[i].file;
    if (f < at)
      break;
    for (; at < f; at++)
      first[at + 1] = (int64_t)i;
    grouped = (int64_t)i + 1;
  }
  for (; at < ds->nfiles; at++)
    first[at + 1] = grouped;
  int r = dl__sampler_set_blocks(sm, (uint32_t)l->o.shuffle_block, ds->nfiles, first);
  free(first);
  return r;
}

int dl_open(dl_loader **out, const char *source, const char *options) {
  double t0 = dl__now();
  if (!out)
    return dl__fail(-EINVAL, "dl_open: no place for the loader (OUT is NULL)");
  *out = NULL;
  dl_loader *l = calloc(1, sizeof *l);
  if (!l)
    return dl__fail(-ENOMEM, "out of memory");
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->work_cv, NULL);
  pthread_cond_init(&l->ready_cv, NULL);
  l->open_time = t0;
  l->pid = getpid();
  int r = dl__options_parse(&l->o, options);
  if (r)
    goto fail;
  dl__log_level = l->o.log_level;
  if (l->o.mean_std_255)
    dl__log(DL__LOG_INFO, "mean and std above 1 are on the 0..255 scale of pixels: divided by 255 "
                          "(torchvision's scale is 0..1)");
  raise_fd_limit();
  dl__io_faults_init();
  if ((r = dl__source_load(&l->ds, source, &l->o)) || (r = dl__fields_schema(l)))
    goto fail;
  l->st.open_index_ms = (dl__now() - t0) * 1e3;
  dl__fields_narrow(l);
  for (int f = 0; f < l->nfields; f++)
    snprintf(l->len_names[f], sizeof l->len_names[f], "%.72s_len", l->fields[f].name);
  l->nstreams = l->o.ndevices > 1 ? l->o.ndevices : 1;
  uint64_t fingerprint = dl__dataset_fingerprint(&l->ds);
  int64_t epoch_len = (int64_t)l->ds.n;
  if (l->o.nrepeat) {
    if (l->o.shuffle_block) {
      r = dl__fail(DL_EOPTION, "options repeat= and shuffle_block=%d do not go together: the parts' copies are "
                   "shuffled over the whole epoch", l->o.shuffle_block);
      goto fail;
    }
    if ((r = dl__mix_init(&l->mix, &l->ds, l->o.repeat, l->o.nrepeat)))
      goto fail;
    epoch_len = l->mix.vfirst[l->mix.nparts];
    fingerprint = dl__hash3(fingerprint, dl__mix_fingerprint(&l->mix), 0x6d6978);
  }
  for (int s = 0; s < l->nstreams; s++) {
    /* Several devices in one process split the data as if each were a rank of its own. */
    r = dl__sampler_init(&l->streams[s].sm, epoch_len, l->o.world_size * l->nstreams,
                         l->o.rank * l->nstreams + s, l->o.batch_size, l->o.drop_last, l->o.shuffle,
                         l->o.seed, l->o.epochs, l->o.start_epoch, l->o.resume, fingerprint);
    l->streams[s].sm.mix = l->o.nrepeat ? &l->mix : NULL;
    if (r || (r = set_blocks(l, &l->streams[s].sm)))
      goto fail;
  }
  /* Opening a finished run is legal (a job restarted after its last epoch), but it is said. */
  if (l->o.epochs && l->streams[0].sm.start_epoch >= l->o.epochs)
    dl__log(DL__LOG_WARN, "the run starts at epoch %" PRId64 " (%s) and ends after epoch %" PRId64
            " (epochs=%" PRId64 "): no batch is left to deliver", l->streams[0].sm.start_epoch,
            l->o.resume[0] ? "from the resume token" : "start_epoch", l->o.epochs - 1, l->o.epochs);
  /* A compressed remote shard (tar or MDS) is read from a local copy. */
  uint32_t remote = 0, copies = 0;
  for (uint32_t i = 0; i < l->ds.nfiles; i++) {
    bool ranged = i < l->ds.nremote && l->ds.remote[i].url;
    remote += ranged;
    copies += !ranged && dl__is_url(l->ds.files[i]);
  }
  if (remote && remote < l->ds.nfiles) {
    const char *mix = copies ? "compressed remote shards (read from local copies) and uncompressed ones "
                               "(read by ranged requests)"
                             : "remote and local shards";
    r = dl__fail(DL_EOPTION, "source %s: %s in one loader (open one loader for each)", source, mix);
    goto fail;
  }
  if (remote && l->o.io != DL__IO_AUTO) {
    r = dl__fail(DL_EOPTION, "option io=%s reads local files; the source is remote (leave io=auto)",
                 l->o.io == DL__IO_URING ? "uring" : l->o.io == DL__IO_PREAD ? "pread" : "mmap");
    goto fail;
  }
  l->remote = remote > 0;
  /* A remote read waits a round trip: more in flight keep the workers busy (at 20 ms of latency,
   * 16 per worker left them waiting a fifth of the time on a 2-core machine; 64 did not). */
  if (!l->o.io_depth)
    l->o.io_depth = l->remote ? 64 : 16;
  if (l->remote) {
    l->io_ops = &dl__io_http_ops;
    snprintf(l->io_reason, sizeof l->io_reason, "remote shards: ranged GETs through libcurl");
  } else {
    l->io_ops = dl__io_choose(l->o.io, l->io_reason, sizeof l->io_reason, &r);
  }
  if (!l->io_ops || (l->o.io == DL__IO_MMAP && (r = dl__dataset_map(&l->ds))))
    goto fail;
  dl__log(DL__LOG_INFO, "reading with %s: %s", l->io_ops->name, l->io_reason);
  choose_prefetch(l);
  /* JPEG row starts (jpeg_rows.c), about 300 bytes an ImageNet image: 512 MB keeps those of 1.7
   * million, and they take no more than an eighth of the memory budget. Without them, JPEGs are
   * decoded as they always were (and gpu_check reads a scan through at every GPU decode). */
  if (l->has_image) {
    int64_t rows_budget = memory_budget(l, local_ranks()) / 8;
    l->jpeg_rows = dl__jpeg_rows_new(l->ds.n > UINT32_MAX ? UINT32_MAX : (uint32_t)l->ds.n,
                                     rows_budget < (INT64_C(512) << 20) ? (uint64_t)rows_budget : UINT64_C(512) << 20);
    if (l->o.ndevices && l->o.decode != DL__DECODE_CPU)
      dl__check_cache_load(l); /* verdicts only a GPU decode asks for */
  }
  double t = dl__now();
  if (l->o.ndevices && (r = dl__cuda_open(l)))
    goto fail;
  l->st.open_cuda_ms = (dl__now() - t) * 1e3;
  t = dl__now();
  if ((r = dl__decode_choose(l)))
    goto fail;
  l->st.open_gpu_decode_ms = (dl__now() - t) * 1e3;
  choose_workers(l);
  dl__log(DL__LOG_INFO, "%s; %s", l->workers_reason, l->prefetch_reason);
  t = dl__now();
  if ((r = alloc_slots(l)))
    goto fail;
  l->st.open_slots_ms = (dl__now() - t) * 1e3;
  /* The workers first: the GPU stage's starter pins the slots in the background, and the workers'
   * io_uring rings and threads, set up beside that, waited on the process's memory map (an H200
   * host, 15-16 workers: 14-28 ms, 1.5-2.5 ms before the starter; the first batch 10-18 ms sooner).
   * The copy stage takes the batches the workers fill from its start on. */
  t = dl__now();
  if ((r = dl__cache_start(l)) || (r = dl__workers_start(l)))
    goto fail;
  l->st.open_workers_ms = (dl__now() - t) * 1e3;
  t = dl__now();
  if (l->cuda && (r = dl__cuda_start(l)))
    goto fail;
  l->st.open_cuda_ms += (dl__now() - t) * 1e3;
  l->st.open_ms = (dl__now() - t0) * 1e3;
  *out = l;
  return 0;
fail:
  if (l->workers)
    dl__workers_stop(l);
  free_loader(l);
  return r;
}

/* A child of fork() has a copy of the loader but none of its threads, and maybe a lock held by one
 * of them: it may not use the loader. */
static int forked(const dl_loader *l) {
  pid_t me = getpid();
  if (me == l->pid)
    return 0;
  return dl__fail(DL_EFORKED,
                  "the loader was opened by process %d and this is its child %d, a fork() without the "
                  "loader's threads: open another loader in the child",
                  (int)l->pid, (int)me);
}

static bool exhausted_out(const dl__stream *s) { return s->sm.total >= 0 && s->next_out >= s->sm.total; }

int dl_next_batch_on(dl_loader *l, int dev, dl_batch **out) { return dl_next_batch_timed(l, dev, -1, out); }

/* Under l->mu: a consumer of device DEV waited WAITED seconds, for a batch it got (HANDED) or in
 * a slice of its wait. A CUDA consumer queues its work ahead of its GPU, so its thread waits here
 * even while its GPU is busy: that part of the waiting is counted apart, and pacing, the hybrid
 * split and the verdict go by the rest. */
static void count_wait(dl_loader *l, int dev, double waited, bool handed) {
  l->st.consumer_wait_s += waited;
  if (waited > 0 && l->cuda && dl__cuda_consumer_busy_locked(l, dev))
    l->st.consumer_wait_gpu_busy_s += waited;
  else if (handed && waited > 0.0005)
    l->st.starved++;
}

#define HELD_WARN_S 5.0

static bool before(const struct timespec *a, const struct timespec *b) {
  return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* Every slot a consumer could get its next batch from holds a batch handed out and not released,
 * B among them handed to another consumer thread, which alone can free it. If it never does (it
 * waits here too, or keeps B's tensors while it waits on something else), every consumer waits
 * for ever: after HELD_WARN_S seconds of this the loader says so, once. True while the consumer
 * should look again within a second. */
static bool held_elsewhere(dl_loader *l, dl__stream *s, const dl_batch *b) {
  double now = dl__now();
  if (!s->held_since)
    s->held_since = now;
  if (!s->held_told && now - s->held_since >= HELD_WARN_S) {
    s->held_told = true;
    dl__log(DL__LOG_WARN,
            "batch %" PRId64 " has waited %.0f s for a slot: all %d hold batches not released, batch %" PRId64
            " among them, handed to another thread: release it (in Python, drop that batch and its "
            "tensors), or raise %s",
            s->next_out, now - s->held_since, s->dslots ? l->o.device_slots : l->o.prefetch, b->k,
            s->dslots ? "device_slots" : "prefetch");
  }
  return !s->held_told;
}

/* Under l->mu, when the next batch has no slot: whether every slot is held by a consumer, and if
 * so the oldest batch held (*OLDEST) and the oldest held by another thread (*OTHER, NULL when this
 * thread holds them all). */
static bool all_held(const dl_batch *slots, int n, int64_t *oldest, const dl_batch **other) {
  *oldest = INT64_MAX;
  *other = NULL;
  for (int i = 0; i < n; i++) {
    const dl_batch *b = &slots[i];
    if (b->state != DL__SLOT_HELD)
      return false;
    *oldest = b->k < *oldest ? b->k : *oldest;
    if (!pthread_equal(b->holder, pthread_self()) && (!*other || b->k < (*other)->k))
      *other = b;
  }
  return true;
}

int dl_next_batch_timed(dl_loader *l, int dev, int timeout_ms, dl_batch **out) {
  if (!out) /* a batch taken with nowhere to put it could never be released */
    return dl__fail(-EINVAL, "dl_next_batch: no place for the batch (OUT is NULL)");
  *out = NULL;
  if (forked(l))
    return DL_EFORKED;
  if (dev < 0 || dev >= l->nstreams)
    return dl__fail(DL_ENODEVICE, "device index %d: the loader has %d", dev, l->nstreams);
  dl__stream *s = &l->streams[dev];
  double t0 = dl__now();
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline); /* the clock of ready_cv */
  deadline.tv_sec += timeout_ms / 1000;
  deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
  if (deadline.tv_nsec >= 1000000000)
    deadline.tv_sec++, deadline.tv_nsec -= 1000000000;
  pthread_mutex_lock(&l->mu);
  l->consumers++;
  int r = 0;
  dl_batch *b = NULL;
  /* The slot is looked up again on every wake: another consumer thread may have taken the batch
   * this one was waiting for. */
  for (;;) {
    if (l->closing) {
      r = dl__fail(DL_ECLOSED, "the loader was closed while waiting for a batch");
      break;
    }
    if (exhausted_out(s)) {
      r = DL_EOF;
      break;
    }
    dl_batch *slots = s->dslots ? s->dslots : s->slots;
    int nslots = s->dslots ? l->o.device_slots : l->o.prefetch;
    b = dl__slot_of(slots, nslots, s->next_out);
    if (b && b->ready) {
      s->held_since = 0, s->held_told = false;
      break;
    }
    /* Every slot held by this very thread: waiting cannot end (it would have to release one
     * first). Some by another consumer thread: that one releases them in its own time
     * (held_elsewhere warns when it takes long). */
    const dl_batch *other;
    int64_t oldest;
    bool stuck = !b && all_held(slots, nslots, &oldest, &other);
    if (stuck && !other) {
      r = dl__fail(DL_EBUSY,
                   "batch %" PRId64 " cannot be filled: all %d slots hold batches held by the consumer, the "
                   "oldest batch %" PRId64 " (release batches sooner, or raise %s)",
                   s->next_out, nslots, oldest, s->dslots ? "device_slots" : "prefetch");
      break;
    }
    bool look = false;
    if (stuck)
      look = held_elsewhere(l, s, other);
    else
      s->held_since = 0, s->held_told = false;
    struct timespec until = deadline;
    if (look) { /* a second on, or the caller's deadline if that comes first */
      struct timespec soon;
      clock_gettime(CLOCK_REALTIME, &soon);
      soon.tv_sec += 1;
      if (timeout_ms < 0 || before(&soon, &deadline))
        until = soon;
    }
    int w = timeout_ms < 0 && !look ? pthread_cond_wait(&l->ready_cv, &l->mu)
                                    : pthread_cond_timedwait(&l->ready_cv, &l->mu, &until);
    if (w == ETIMEDOUT && timeout_ms >= 0 && !before(&until, &deadline)) {
      r = dl__fail(-ETIMEDOUT, "no batch within %d ms", timeout_ms);
      break;
    }
  }
  if (r) {
    if (r == -ETIMEDOUT) /* a consumer waiting in slices (the Python binding) still waited */
      count_wait(l, dev, dl__now() - t0, false);
    if (--l->consumers == 0 && l->closing)
      pthread_cond_broadcast(&l->ready_cv); /* dl_close waits for the last one to leave */
    pthread_mutex_unlock(&l->mu);
    return r;
  }
  b->state = DL__SLOT_HELD;
  b->holder = pthread_self();
  b->ready = false;
  b->refs = 1;
  s->next_out++;
  s->handed = s->next_out;
  l->st.batches++;
  double now = dl__now();
  count_wait(l, dev, now - t0, true);
  dl__pace_locked(l, now);
  l->st.last_batch_s = now - l->open_time;
  if (l->st.batches == 1) {
    l->st.first_batch_ms = (now - l->open_time) * 1000;
    l->st.first_wait_s = dl__consumer_idle_s(&l->st);
  }
  int err = b->err;
  if (err) {
    dl__fail(err, "%s", b->errmsg);
    b->refs = 0;
    dl__slot_free_locked(b);
  }
  if (--l->consumers == 0 && l->closing)
    pthread_cond_broadcast(&l->ready_cv);
  pthread_mutex_unlock(&l->mu);
  if (err)
    return err;
  *out = b;
  return 0;
}

int dl_next_batch(dl_loader *l, dl_batch **out) { return dl_next_batch_timed(l, 0, -1, out); }

int dl_batch_size(const dl_batch *b) { return b ? b->len : 0; }

const char *dl_batch_key(const dl_batch *b, int i) {
  return b && i >= 0 && i < b->len ? b->key[i] : NULL;
}

int dl_batch_sample_error(const dl_batch *b, int i) {
  return b && i >= 0 && i < b->len ? b->sample_err[i] : -EINVAL;
}

int dl_batch_position(const dl_batch *b, int64_t *epoch, int64_t *index) {
  if (epoch)
    *epoch = b->epoch;
  if (index)
    *index = b->index;
  return 0;
}

int dl__batch_describe(const dl_batch *b, const char *name, DLDevice device, DLTensor *t) {
  dl_loader *l = b->l;
  dl_batch *m = (dl_batch *)b;
  memset(t, 0, sizeof *t);
  t->device = device;
  if (l->has_image && !strcmp(name, "image")) {
    static const DLDataType types[] = {{kDLUInt, 8, 1}, {kDLFloat, 32, 1}, {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}};
    t->data = b->image;
    t->ndim = 4;
    t->dtype = device.device_type == kDLCUDA ? types[l->o.dtype] : types[0];
    int64_t *sh = m->image_shape;
    sh[0] = b->len;
    if (l->o.layout == DL__LAYOUT_NCHW)
      sh[1] = l->o.channels, sh[2] = l->o.height, sh[3] = l->o.width;
    else
      sh[1] = l->o.height, sh[2] = l->o.width, sh[3] = l->o.channels;
    t->shape = sh;
    return 0;
  }
  if (!strcmp(name, "label")) {
    t->data = b->label;
    t->ndim = 1;
    t->dtype = (DLDataType){kDLInt, 64, 1};
    m->label_shape[0] = b->len;
    t->shape = m->label_shape;
    return 0;
  }
  for (int f = 0; f < l->nfields; f++) {
    const dl__field *fd = &l->fields[f];
    size_t n = strlen(fd->name);
    if (!strcmp(name, fd->name)) {
      t->data = b->fields + fd->at;
      t->ndim = 1 + fd->ndim;
      t->dtype = fd->dtype;
      m->field_shape[f][0] = b->len;
      memcpy(&m->field_shape[f][1], fd->shape, sizeof(int64_t) * (size_t)fd->ndim);
      t->shape = m->field_shape[f];
      return 0;
    }
    if (l->o.pad && !strncmp(name, fd->name, n) && !strcmp(name + n, "_len")) {
      t->data = b->fields + fd->len_at;
      t->ndim = 1;
      t->dtype = (DLDataType){kDLInt, 64, 1};
      m->len_shape[0] = b->len;
      t->shape = m->len_shape;
      return 0;
    }
  }
  return dl__fail(DL_ENOFIELD, "no field '%s' (see dl_batch_field_name)", name);
}

int dl_batch_field(const dl_batch *b, const char *name, DLTensor *t) {
  if (!b || !name || !t)
    return dl__fail(-EINVAL, "dl_batch_field: %s is NULL", !b ? "the batch" : !name ? "the field name" : "OUT");
  if (b->is_device)
    return dl__cuda_field(b, name, t);
  return dl__batch_describe(b, name, (DLDevice){kDLCPU, 0}, t);
}

int dl_batch_bytes_count(const dl_batch *b) { return b ? b->l->nbfields : 0; }

const char *dl_batch_bytes_name(const dl_batch *b, int f) {
  return b && f >= 0 && f < b->l->nbfields ? b->l->bfields[f].name : NULL;
}

const char *dl_batch_bytes_kind(const dl_batch *b, int f) {
  if (!b || f < 0 || f >= b->l->nbfields)
    return NULL;
  const dl__bfield *bf = &b->l->bfields[f];
  switch (b->l->ds.bytes_kind[bf->ds_index]) {
  case DL__BYTES_TEXT: return "text";
  case DL__BYTES_JSON: return "json";
  case DL__BYTES_RAW: return "bytes";
  }
  const char *dot = strrchr(bf->name, '.');
  const char *ext = dot ? dot + 1 : bf->name;
  return !strcasecmp(ext, "txt") || !strcasecmp(ext, "text") ? "text" : !strcasecmp(ext, "json") ? "json" : "bytes";
}

const void *dl_batch_bytes(const dl_batch *b, const char *name, int i, size_t *len) {
  if (len)
    *len = 0;
  if (!b || !name || i < 0 || i >= b->len)
    return NULL;
  const dl_loader *l = b->l;
  for (int f = 0; f < l->nbfields; f++) {
    if (strcmp(l->bfields[f].name, name))
      continue;
    const dl__bytes_ref *r = &b->brefs[(size_t)i * l->nbfields + f];
    if (!r->present)
      return NULL;
    if (len)
      *len = r->len;
    return b->blobs[i].p + r->at;
  }
  return NULL;
}

int dl_batch_field_count(const dl_batch *b) {
  const dl_loader *l = b->l;
  return (l->has_image ? 1 : 0) + 1 + l->nfields * (l->o.pad ? 2 : 1);
}

const char *dl_batch_field_name(const dl_batch *b, int i) {
  const dl_loader *l = b->l;
  if (i < 0 || i >= dl_batch_field_count(b))
    return NULL;
  if (l->has_image && i-- == 0)
    return "image";
  if (i-- == 0)
    return "label";
  int per = l->o.pad ? 2 : 1;
  const dl__field *fd = &l->fields[i / per];
  if (i % per == 0)
    return fd->name;
  return l->len_names[i / per];
}

/* Visits every batch slot, host and device; stops when FN returns true. */
static bool any_slot(dl_loader *l, bool (*fn)(dl_batch *)) {
  for (int s = 0; s < l->nstreams; s++) {
    dl__stream *st = &l->streams[s];
    for (int i = 0; st->slots && i < l->o.prefetch; i++)
      if (fn(&st->slots[i]))
        return true;
    for (int i = 0; st->dslots && i < l->o.device_slots; i++)
      if (fn(&st->dslots[i]))
        return true;
  }
  return false;
}

static bool has_refs(dl_batch *b) { return b->refs > 0; }

/* The consumer's own hold ends at dl_close(); exported tensors keep their batch alive. */
static bool drop_hold(dl_batch *b) {
  if (b->state == DL__SLOT_HELD)
    b->refs = b->exports;
  return false;
}

/* Under l->mu: the consumer has not released B yet (its hold is the one reference that is not an
 * export's). */
static bool consumer_holds(const dl_batch *b) { return b->state == DL__SLOT_HELD && b->refs - b->exports >= 1; }

static void unref_locked(dl_batch *b, bool *free_now) {
  dl_loader *l = b->l;
  if (--b->refs > 0)
    return;
  if (b->is_device)
    dl__cuda_release_locked(b);
  dl__slot_free_locked(b);
  *free_now = l->closed && !any_slot(l, has_refs);
}

void dl_batch_release(dl_batch *b, void *stream) {
  if (!b)
    return;
  dl_loader *l = b->l;
  bool free_now = false;
  if (getpid() != l->pid)
    return; /* the parent's batch: nothing of it is the child's to release */
  pthread_mutex_lock(&l->mu);
  /* Releasing a batch a second time would free its slot while the workers fill it again or the
   * next batch waits in it, and the consumer would wait for that batch for ever. */
  if (!consumer_holds(b)) {
    pthread_mutex_unlock(&l->mu);
    dl__log(DL__LOG_WARN, "dl_batch_release: this batch was released already; the second release does nothing");
    return;
  }
  b->release_stream = stream;
  unref_locked(b, &free_now);
  pthread_mutex_unlock(&l->mu);
  if (free_now)
    free_loader(l);
}

typedef struct export {
  DLManagedTensor m;
  int64_t shape[4];
} export;

static void export_deleter(DLManagedTensor *m) {
  dl_batch *b = m->manager_ctx;
  free(m);
  dl_loader *l = b->l;
  bool free_now = false;
  if (getpid() != l->pid)
    return; /* the parent's batch: nothing of it is the child's to release */
  pthread_mutex_lock(&l->mu);
  b->exports--;
  unref_locked(b, &free_now);
  pthread_mutex_unlock(&l->mu);
  if (free_now)
    free_loader(l);
}

int dl_batch_export(dl_batch *b, const char *name, DLManagedTensor **out) {
  if (!out)
    return dl__fail(-EINVAL, "dl_batch_export: no place for the tensor (OUT is NULL)");
  export *e = calloc(1, sizeof *e);
  if (!e)
    return dl__fail(-ENOMEM, "out of memory");
  int r = dl_batch_field(b, name, &e->m.dl_tensor);
  if (r) {
    free(e);
    return r;
  }
  memcpy(e->shape, e->m.dl_tensor.shape, sizeof(int64_t) * (size_t)e->m.dl_tensor.ndim);
  e->m.dl_tensor.shape = e->shape;
  e->m.manager_ctx = b;
  e->m.deleter = export_deleter;
  pthread_mutex_lock(&b->l->mu);
  bool held = consumer_holds(b);
  if (held) {
    b->refs++;
    b->exports++;
  }
  pthread_mutex_unlock(&b->l->mu);
  if (!held) { /* its slot may be filling with another batch: a tensor of it would change under the user */
    free(e);
    return dl__fail(-EINVAL, "dl_batch_export: the batch was released already; export before releasing it");
  }
  *out = &e->m;
  return 0;
}

int dl_batch_wait(dl_batch *b, void *stream) {
  if (!b)
    return dl__fail(-EINVAL, "no batch");
  if (b->is_device && forked(b->l))
    return DL_EFORKED;
  return b->is_device ? dl__cuda_wait(b, stream) : 0;
}

int64_t dl_batches_per_epoch(const dl_loader *l) { return l->streams[0].sm.nb; }

int64_t dl_epoch_batches(const dl_loader *l, int64_t epoch) {
  return dl__sampler_epoch_batches(&l->streams[0].sm, epoch);
}

int dl_state_save(dl_loader *l, char *buf, size_t cap) {
  if (forked(l))
    return DL_EFORKED;
  pthread_mutex_lock(&l->mu);
  int64_t handed = l->streams[0].handed;
  pthread_mutex_unlock(&l->mu);
  int r = dl__sampler_token(&l->streams[0].sm, handed, buf, cap);
  return r < 0 ? dl__fail(r, "resume token needs %s", "more room") : r;
}

/* S as the inside of a JSON string (the reasons name files, which may hold anything). */
static const char *json_text(const char *s, char *out, size_t cap) {
  size_t n = 0;
  for (; *s && n + 7 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      n += (size_t)snprintf(out + n, cap - n, "\\%c", c);
    else if (c < 0x20)
      n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
    else
      out[n++] = (char)c;
  }
  out[n] = 0;
  return out;
}

/* "Is my GPU waiting?": which stage holds the consumer back, in one word, and the figures that show
 * it. The consumer's waits count from its first batch (the start-up is first_batch_ms); the
 * workers' time is split between decoding, waiting for reads and waiting for a free slot. */
typedef struct verdict {
  const char *word;
  double consumer, decode, read, slot; /* fractions of the consumer's and the workers' time */
  char why[320];
} verdict;

static void judge(const dl_loader *l, int decode, int64_t batches, double wall, double since_first, double waited,
                  verdict *v) {
  /* Workers set aside (workers=auto) are not counted as idle; one was always at work (the time set
   * aside counts up to now, WALL only to the last batch). */
  double workers = fmax((double)l->o.workers * wall - (double)atomic_load(&l->st.parked_ns) * 1e-9, wall);
  v->decode = workers > 0 ? (double)atomic_load(&l->st.decode_ns) * 1e-9 / workers : 0;
  v->read = workers > 0 ? (double)atomic_load(&l->st.read_wait_ns) * 1e-9 / workers : 0;
  v->slot = workers > 0 ? (double)atomic_load(&l->st.slot_wait_ns) * 1e-9 / workers : 0;
  v->consumer = since_first > 0 ? waited / since_first : 0;
  char workers_did[160];
  snprintf(workers_did, sizeof workers_did, "workers decoding %.0f%% of their time, waiting for reads %.0f%%, "
           "for a free slot %.0f%%", 100 * v->decode, 100 * v->read, 100 * v->slot);
  if (batches < 3 || since_first <= 0) {
    v->word = "unknown";
    snprintf(v->why, sizeof v->why, "too early: %" PRId64 " batch%s", batches, batches == 1 ? "" : "es");
    return;
  }
  if (v->consumer < 0.05) {
    v->word = "consumer";
    snprintf(v->why, sizeof v->why, "the consumer waited %.1f%% of the time since its first batch: the loader keeps "
             "up (%s)", 100 * v->consumer, workers_did);
    return;
  }
  const char *gpu_stage = decode == DL__DECODE_CPU ? "its copies" : "its copies and JPEG decoding";
  if (l->cuda && v->slot >= v->decode && v->slot >= v->read) {
    v->word = "copy";
    snprintf(v->why, sizeof v->why, "the consumer waited %.0f%% of the time while the GPU stage (%s) held the "
             "slots: %s", 100 * v->consumer, gpu_stage, workers_did);
  } else if (v->read > v->decode) {
    v->word = "read";
    snprintf(v->why, sizeof v->why, "the consumer waited %.0f%% of the time, the workers mostly for reads: %s",
             100 * v->consumer, workers_did);
  } else {
    v->word = "decode";
    snprintf(v->why, sizeof v->why, "the consumer waited %.0f%% of the time, the workers mostly decoding: %s",
             100 * v->consumer, workers_did);
  }
}

int dl_stats_json(dl_loader *l, char *buf, size_t cap) {
  if (forked(l))
    return DL_EFORKED;
  static const char *const decoders[] = {"auto", "cpu", "gpu", "hybrid"};
  char device[64] = "cpu";
  if (l->o.ndevices) {
    int n = snprintf(device, sizeof device, "cuda:");
    for (int i = 0; i < l->o.ndevices && n < (int)sizeof device - 8; i++)
      n += snprintf(device + n, sizeof device - (size_t)n, "%s%d", i ? "," : "", l->o.device_ids[i]);
  }
  pthread_mutex_lock(&l->mu);
  int64_t batches = l->st.batches;
  double wait = dl__consumer_idle_s(&l->st), first = l->st.first_batch_ms;
  double share = l->share, wait_busy = l->st.consumer_wait_gpu_busy_s, stream_wait = l->st.consumer_stream_wait_s;
  double balanced = l->split.balanced, split_gpu_ms = l->split.gpu_ms, split_cpu_ms = l->split.cpu_ms;
  int64_t split_moves = l->split.moves, split_holds = l->split.holds;
  double first_wait = l->st.first_wait_s, last = l->st.last_batch_s;
  int decode = l->decode; /* decode=auto changes it once nvJPEG has started */
  char decode_now[sizeof l->decode_reason], pace_why[sizeof l->pace.why];
  memcpy(decode_now, l->decode_reason, sizeof decode_now);
  memcpy(pace_why, l->pace.why, sizeof pace_why);
  int active = l->pace.on ? l->pace.active : l->o.workers;
  pthread_mutex_unlock(&l->mu);
  double wall = dl__now() - l->open_time;
  verdict v; /* over the time batches were handed out: a run's stats read later say the same */
  /* The stream's wait stays out: added to the thread's, a wait of both at once counts twice (an
   * H200, a consumer with no GPU work of its own: 115% of the time). */
  judge(l, decode, batches, last, batches ? last - first / 1000 : 0, wait - first_wait, &v);
  char why[400];
  char gpu[1536] = "", io_reason[320], decode_reason[512], workers_reason[320], prefetch_reason[400], active_why[240];
  if (l->cuda)
    dl__cuda_stats(l, gpu, sizeof gpu);
  int n = snprintf(
      buf, cap,
      "{\"samples\":%" PRId64 ",\"batches\":%" PRId64 ",\"errors\":%" PRId64 ",\"bytes_read\":%" PRId64
      ",\"wall_s\":%.6f,\"first_batch_ms\":%.3f,\"open_ms\":%.3f,\"open_index_ms\":%.3f,\"open_cuda_ms\":%.3f"
      ",\"open_gpu_decode_ms\":%.3f,\"open_slots_ms\":%.3f,\"open_workers_ms\":%.3f,\"consumer_wait_s\":%.6f"
      ",\"consumer_wait_gpu_busy_s\":%.6f,\"consumer_stream_wait_s\":%.6f,\"decode_s\":%.6f"
      ",\"read_wait_s\":%.6f,\"workers\":%d,\"workers_active\":%d,\"workers_active_why\":\"%s\",\"parked_s\":%.6f,\"prefetch\":%d,\"batch_size\":%d,\"dataset_samples\":%zu,\"epoch_samples\":%" PRId64
      ",\"workers_reason\":\"%s\",\"prefetch_reason\":\"%s\",\"io_backend\":\"%s\",\"io_reason\":\"%s\",\"device\":\"%s\",\"decode_backend\":\"%s\""
      ",\"decode_reason\":\"%s\",\"cpu_decoded\":%" PRId64 ",\"gpu_decoded\":%" PRId64 ",\"gpu_fallbacks\":%" PRId64
      ",\"gpu_share\":%.4f,\"gpu_share_balanced\":%.4f,\"gpu_share_moves\":%" PRId64 ",\"gpu_share_holds\":%" PRId64
      ",\"split_gpu_ms_per_image\":%.4f,\"split_cpu_ms_per_image\":%.4f,\"arena_mb\":%.1f,\"host_batch_bytes\":%zu"
      ",\"pinned_bytes_in_process\":%zu,\"requests\":%" PRId64 ",\"retries\":%" PRId64
      ",\"cache_hits\":%" PRId64 ",\"cache_fetches\":%" PRId64 ",\"cache_fetch_bytes\":%" PRId64
      ",\"tensors_read_in_place\":%" PRId64 ",\"tensors_read_again\":%" PRId64
      ",\"jpeg_rows_skipped\":%" PRIu64 ",\"jpeg_row_index_mb\":%.1f,\"gpu_check_read\":%" PRIu64
      ",\"gpu_check_kept\":%" PRId64 ","
      "\"slot_wait_s\":%.6f,\"bottleneck\":\"%s\",\"bottleneck_why\":\"%s\",\"consumer_wait_frac\":%.4f"
      ",\"worker_decode_frac\":%.4f,\"worker_read_frac\":%.4f,\"worker_slot_wait_frac\":%.4f%s}",
      atomic_load(&l->st.samples), batches, atomic_load(&l->st.errors), atomic_load(&l->st.bytes_read),
      wall, first, l->st.open_ms, l->st.open_index_ms, l->st.open_cuda_ms, l->st.open_gpu_decode_ms,
      l->st.open_slots_ms, l->st.open_workers_ms, wait + wait_busy, wait_busy, stream_wait, atomic_load(&l->st.decode_ns) * 1e-9,
      atomic_load(&l->st.read_wait_ns) * 1e-9, l->o.workers, active, json_text(pace_why, active_why, sizeof active_why),
      atomic_load(&l->st.parked_ns) * 1e-9, l->o.prefetch, l->o.batch_size, l->ds.n, l->streams[0].sm.n,
      json_text(l->workers_reason, workers_reason, sizeof workers_reason),
      json_text(l->prefetch_reason, prefetch_reason, sizeof prefetch_reason),
      l->o.io == DL__IO_MMAP ? "mmap" : l->io_ops->name, json_text(l->io_reason, io_reason, sizeof io_reason),
      device, decoders[decode], json_text(decode_now, decode_reason, sizeof decode_reason),
      atomic_load(&l->st.cpu_decoded), atomic_load(&l->st.gpu_decoded), atomic_load(&l->st.gpu_fallbacks),
      decode == DL__DECODE_CPU ? 0.0 : share, balanced, split_moves, split_holds, split_gpu_ms, split_cpu_ms,
      (double)l->arena_bytes * l->o.prefetch * l->nstreams / 1048576.0, l->host_mem_bytes,
      atomic_load(&pinned_in_process), atomic_load(&l->st.requests), atomic_load(&l->st.retries),
      atomic_load(&l->st.cache_hits), atomic_load(&l->st.cache_fetches) + l->ds.cache_fetches,
      atomic_load(&l->st.cache_fetch_bytes) + l->ds.cache_fetch_bytes,
      atomic_load(&l->st.placed), atomic_load(&l->st.placed_again), dl__jpeg_rows_skipped(l->jpeg_rows),
      (double)dl__jpeg_rows_bytes(l->jpeg_rows) / 1048576.0, dl__jpeg_rows_walked(l->jpeg_rows), l->st.check_kept, atomic_load(&l->st.slot_wait_ns) * 1e-9, v.word, json_text(v.why, why, sizeof why), v.consumer, v.decode,
      v.read, v.slot, gpu);
  return n < 0 || (size_t)n >= cap ? dl__fail(-ENOSPC, "stats need %d bytes", n + 1) : n;
}

void dl_close(dl_loader *l) {
  /* In a child of fork() the loader's memory is a copy that goes with the process; its pinned and
   * device memory and its threads are the parent's. */
  if (!l || getpid() != l->pid)
    return;
  /* Consumers waiting on other threads leave first, with DL_ECLOSED. */
  pthread_mutex_lock(&l->mu);
  l->closing = 1;
  pthread_cond_broadcast(&l->ready_cv);
  while (l->consumers > 0)
    pthread_cond_wait(&l->ready_cv, &l->mu);
  pthread_mutex_unlock(&l->mu);
  dl__workers_stop(l);
  if (l->cuda)
    dl__cuda_stop(l);
  dl__check_cache_save(l);
  pthread_mutex_lock(&l->mu);
  l->closed = 1;
  any_slot(l, drop_hold);
  bool held = any_slot(l, has_refs);
  pthread_mutex_unlock(&l->mu);
  if (!held)
    free_loader(l);
}
