/*
 * dl_open(): the planning at open (how many workers and slots, what the GPU stage takes, where
 * everything starts) and the loader's memory; freeing it once the last batch is given back.
 *
 * Lock order: l->mu only.
 */
#include "core.h"

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

/* Pinned host memory held by all loaders of the process, for the stats: a soak test samples it. */
_Atomic size_t dl__pinned_in_process;

void dl__loader_free(dl_loader *l) {
  if (l->cuda)
    dl__cuda_stop(l);
  dl__shard_cache_stop(&l->cache); /* after the workers, who read its copies */
  for (int s = 0; s < l->nstreams; s++) {
    dl__sampler_free(&l->streams[s].sm);
    dl_batch *slots = l->streams[s].slots;
    for (int i = 0; slots && i < l->o.prefetch; i++) {
      free(slots[i].key);
      dl__buf_free(&slots[i].key_text);
      free(slots[i].sample_err);
      free(slots[i].jobs);
      free(slots[i].on_cpu);
      dl__slot_bytes_free(l, &slots[i]);
    }
    free(slots);
  }
  if (l->cuda)
    atomic_fetch_sub_explicit(&dl__pinned_in_process, l->host_mem_bytes, memory_order_relaxed);
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
  int cpus = usable_cpus(), ranks = l->o.host_ranks, share = cpus / ranks > 0 ? cpus / ranks : 1;
  bool gpu_decodes = dl__decode_feeds_gpu(l);
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
  int ranks = l->o.host_ranks;
  size_t image = l->has_image ? (size_t)l->o.height * l->o.width * (size_t)l->o.channels *
                                    (size_t)(l->o.ndevices ? 1 : dl__dtype_bytes(l->o.dtype)) * (size_t)l->o.batch_size
                              : 0;
  size_t arena = l->has_image && dl__decode_may_use_gpu(l) ? dl__gpu_arena_size(l) : 0;
  size_t labels = (size_t)l->o.batch_size * sizeof(int64_t); /* in the slot too (alloc_slots) */
  size_t slot = (image + l->field_block + labels + arena) * (size_t)l->nstreams; /* one slot of every stream */
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
  /* With a device, host slots hold uint8 and the GPU converts; on the CPU, the dtype itself. */
  l->host_float = !l->o.ndevices && l->o.dtype != DL__DTYPE_UINT8;
  l->affine = dl__affine_of(l->o.mean, l->o.std);
  l->sample_bytes = l->has_image ? (size_t)l->o.height * l->o.width * ch * (l->host_float ? dl__dtype_bytes(l->o.dtype) : 1)
                                 : 0;
  l->image_bytes = l->sample_bytes * (size_t)l->o.batch_size;
  size_t nslots = (size_t)l->o.prefetch * (size_t)l->nstreams;
  /* A slot's images, its tensor fields, its labels, and the compressed JPEGs the GPU decodes,
   * which the workers read into; a slot is one range of pages, so that it can be pinned by itself
   * (the labels too: a copy from pageable memory goes through the driver's staging buffers). What
   * was allocated before a failure is freed with the loader. */
  size_t images = page_round(l->image_bytes), fields = page_round(l->field_block);
  size_t labels = page_round((size_t)l->o.batch_size * sizeof(int64_t));
  l->slot_stride = images + fields + labels + page_round(l->arena_bytes);
  size_t total = l->slot_stride * nslots;
  if (!(l->host_mem = dl__host_alloc(l, total)))
    return dl__fail(-ENOMEM, "could not allocate %zu bytes of %s batch memory", total,
                    l->o.ndevices ? "pinned" : "host");
  if (l->arena_bytes && !(l->split.rank = calloc((size_t)l->o.batch_size, sizeof *l->split.rank)))
    return dl__fail(-ENOMEM, "out of memory");
  l->host_mem_bytes = total;
  if (l->cuda)
    atomic_fetch_add_explicit(&dl__pinned_in_process, l->host_mem_bytes, memory_order_relaxed);
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
      b->label = (int64_t *)(at + images + fields);
      if (l->arena_bytes) {
        b->arena = at + images + fields + labels;
        if (!(b->jobs = calloc((size_t)l->o.batch_size, sizeof *b->jobs)) ||
            !(b->on_cpu = calloc((size_t)l->o.batch_size, sizeof *b->on_cpu)))
          return dl__fail(-ENOMEM, "out of memory");
      }
      b->key = calloc((size_t)l->o.batch_size, sizeof *b->key);
      b->sample_err = calloc((size_t)l->o.batch_size, sizeof *b->sample_err);
      if (!b->key || !b->sample_err || dl__slot_bytes_alloc(l, b))
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
  l->io_env = (dl__io_env){.ds = &l->ds, .o = &l->o, .cancel = &l->cancel, .read_failures = &l->read_failures,
                           .counts = &l->st.io};
  l->image_spec = dl__image_spec_of(&l->o, &l->cancel);
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
    int64_t rows_budget = memory_budget(l, l->o.host_ranks) / 8;
    l->jpeg_rows = dl__jpeg_rows_new(l->ds.n > UINT32_MAX ? UINT32_MAX : (uint32_t)l->ds.n,
                                     rows_budget < (INT64_C(512) << 20) ? (uint64_t)rows_budget : UINT64_C(512) << 20);
    if (dl__decode_may_use_gpu(l))
      dl__check_verdicts_load(l); /* verdicts only a GPU decode asks for */
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
  dl__upcoming up = dl__ring_upcoming(l);
  if ((r = dl__shard_cache_start(&l->io_env, l->remote, &up, &l->cache)))
    goto fail;
  l->io_env.cache = l->cache;
  if ((r = dl__workers_start(l)))
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
  dl__loader_free(l);
  return r;
}


/* A child of fork() has a copy of the loader but none of its threads, and maybe a lock held by one
 * of them: it may not use the loader. */
int dl__forked(const dl_loader *l) {
  pid_t me = getpid();
  if (me == l->pid)
    return 0;
  return dl__fail(DL_EFORKED,
                  "the loader was opened by process %d and this is its child %d, a fork() without the "
                  "loader's threads: open another loader in the child",
                  (int)l->pid, (int)me);
}

