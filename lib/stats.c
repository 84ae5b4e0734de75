/*
 * What a loader says of itself: the epoch's batches, the resume token, and the stats with the
 * verdict on what holds the consumer back.
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

int64_t dl_batches_per_epoch(const dl_loader *l) { return l->streams[0].sm.nb; }

const char *dl_class_name(const dl_loader *l, int64_t label) {
  const dl__dataset *ds = &l->ds;
  return !ds->classes_differ && label >= 0 && label < ds->nclasses ? ds->classes[label] : NULL;
}

int64_t dl_epoch_batches(const dl_loader *l, int64_t epoch) {
  return dl__sampler_epoch_batches(&l->streams[0].sm, epoch);
}

int dl_state_save(dl_loader *l, char *buf, size_t cap) {
  if (dl__forked(l))
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
  char why[512];
} verdict;

static void judge(const dl_loader *l, int decode, int64_t batches, double wall, double since_first, double waited,
                  const char *split, verdict *v) {
  /* Workers set aside (workers=auto) are not counted as idle; one was always at work (the time set
   * aside counts up to now, WALL only to the last batch). */
  double workers = fmax((double)l->o.workers * wall - (double)atomic_load_explicit(&l->st.parked_ns, memory_order_relaxed) * 1e-9, wall);
  v->decode = workers > 0 ? (double)atomic_load_explicit(&l->st.decode_ns, memory_order_relaxed) * 1e-9 / workers : 0;
  v->read = workers > 0 ? (double)atomic_load_explicit(&l->st.read_wait_ns, memory_order_relaxed) * 1e-9 / workers : 0;
  v->slot = workers > 0 ? (double)atomic_load_explicit(&l->st.slot_wait_ns, memory_order_relaxed) * 1e-9 / workers : 0;
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
             "slots: %s%s", 100 * v->consumer, gpu_stage, workers_did, split);
  } else if (v->read > v->decode) {
    v->word = "read";
    snprintf(v->why, sizeof v->why, "the consumer waited %.0f%% of the time, the workers mostly for reads: %s",
             100 * v->consumer, workers_did);
  } else {
    v->word = "decode";
    snprintf(v->why, sizeof v->why, "the consumer waited %.0f%% of the time, the workers mostly decoding: %s%s",
             100 * v->consumer, workers_did, split);
  }
}

int dl_stats_json(dl_loader *l, char *buf, size_t cap) {
  if (dl__forked(l))
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
  double split_walk_ms = l->split.walk_ms;
  int64_t split_moves = l->split.moves, split_holds = l->split.holds;
  double first_wait = l->st.first_wait_s, last = l->st.last_batch_s;
  int decode = l->decode; /* decode=auto changes it once nvJPEG has started */
  char decode_now[sizeof l->decode_reason], pace_why[sizeof l->pace.why];
  memcpy(decode_now, l->decode_reason, sizeof decode_now);
  memcpy(pace_why, l->pace.why, sizeof pace_why);
  int active = l->pace.on ? l->pace.active : l->o.workers;
  pthread_mutex_unlock(&l->mu);
  /* Hybrid: which side of the split a slow batch waits for, as the verdict's last words. */
  double gpu_part = 0, cpu_part = 0;
  const char *limit = decode == DL__DECODE_HYBRID
                          ? dl__split_limit(share, l->o.batch_size, split_gpu_ms, split_cpu_ms, split_walk_ms,
                                            (double)active / l->nstreams, &gpu_part, &cpu_part)
                          : NULL;
  char split[200] = "";
  if (limit)
    snprintf(split, sizeof split, "; at hybrid's GPU share %.3f the GPU's part of a batch takes %.1f ms, the "
             "workers' %.1f ms: %s", share, gpu_part, cpu_part,
             !strcmp(limit, "gpu")   ? "the GPU's JPEG decoding limits it"
             : !strcmp(limit, "cpu") ? "the workers limit it"
                                     : "at the balance, both sides limit it alike");
  double wall = dl__now() - l->open_time;
  verdict v; /* over the time batches were handed out: a run's stats read later say the same */
  /* The stream's wait stays out: added to the thread's, a wait of both at once counts twice (an
   * H200, a consumer with no GPU work of its own: 115% of the time). */
  judge(l, decode, batches, last, batches ? last - first / 1000 : 0, wait - first_wait, split, &v);
  char why[768];
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
      ",\"split_gpu_ms_per_image\":%.4f,\"split_cpu_ms_per_image\":%.4f,\"split_walk_ms_per_image\":%.4f,\"arena_mb\":%.1f,\"host_batch_bytes\":%zu"
      ",\"pinned_bytes_in_process\":%zu,\"requests\":%" PRId64 ",\"retries\":%" PRId64
      ",\"cache_hits\":%" PRId64 ",\"cache_fetches\":%" PRId64 ",\"cache_fetch_bytes\":%" PRId64
      ",\"tensors_read_in_place\":%" PRId64 ",\"tensors_read_again\":%" PRId64
      ",\"jpeg_rows_skipped\":%" PRIu64 ",\"jpeg_row_index_mb\":%.1f,\"gpu_check_read\":%" PRIu64
      ",\"gpu_check_kept\":%" PRId64 ",\"gpu_check_from_shards\":%" PRId64 ","
      "\"slot_wait_s\":%.6f,\"bottleneck\":\"%s\",\"bottleneck_why\":\"%s\",\"split_limit\":\"%s\",\"consumer_wait_frac\":%.4f"
      ",\"worker_decode_frac\":%.4f,\"worker_read_frac\":%.4f,\"worker_slot_wait_frac\":%.4f%s}",
      atomic_load_explicit(&l->st.samples, memory_order_relaxed), batches, atomic_load_explicit(&l->st.errors, memory_order_relaxed), atomic_load_explicit(&l->st.bytes_read, memory_order_relaxed),
      wall, first, l->st.open_ms, l->st.open_index_ms, l->st.open_cuda_ms, l->st.open_gpu_decode_ms,
      l->st.open_slots_ms, l->st.open_workers_ms, wait + wait_busy, wait_busy, stream_wait, atomic_load_explicit(&l->st.decode_ns, memory_order_relaxed) * 1e-9,
      atomic_load_explicit(&l->st.read_wait_ns, memory_order_relaxed) * 1e-9, l->o.workers, active, json_text(pace_why, active_why, sizeof active_why),
      atomic_load_explicit(&l->st.parked_ns, memory_order_relaxed) * 1e-9, l->o.prefetch, l->o.batch_size, l->ds.n, l->streams[0].sm.n,
      json_text(l->workers_reason, workers_reason, sizeof workers_reason),
      json_text(l->prefetch_reason, prefetch_reason, sizeof prefetch_reason),
      l->o.io == DL__IO_MMAP ? "mmap" : l->io_ops->name, json_text(l->io_reason, io_reason, sizeof io_reason),
      device, decoders[decode], json_text(decode_now, decode_reason, sizeof decode_reason),
      atomic_load_explicit(&l->st.cpu_decoded, memory_order_relaxed), atomic_load_explicit(&l->st.gpu_decoded, memory_order_relaxed), atomic_load_explicit(&l->st.gpu_fallbacks, memory_order_relaxed),
      decode == DL__DECODE_CPU ? 0.0 : share, balanced, split_moves, split_holds, split_gpu_ms, split_cpu_ms, split_walk_ms,
      (double)l->arena_bytes * l->o.prefetch * l->nstreams / 1048576.0, l->host_mem_bytes,
      atomic_load_explicit(&dl__pinned_in_process, memory_order_relaxed), atomic_load_explicit(&l->st.io.requests, memory_order_relaxed), atomic_load_explicit(&l->st.io.retries, memory_order_relaxed),
      atomic_load_explicit(&l->st.io.cache_hits, memory_order_relaxed), atomic_load_explicit(&l->st.io.cache_fetches, memory_order_relaxed) + l->ds.cache_fetches,
      atomic_load_explicit(&l->st.io.cache_fetch_bytes, memory_order_relaxed) + l->ds.cache_fetch_bytes,
      atomic_load_explicit(&l->st.placed, memory_order_relaxed), atomic_load_explicit(&l->st.placed_again, memory_order_relaxed), dl__jpeg_rows_skipped(l->jpeg_rows),
      (double)dl__jpeg_rows_bytes(l->jpeg_rows) / 1048576.0, dl__jpeg_rows_walked(l->jpeg_rows), l->st.check_kept, l->st.check_shards, atomic_load_explicit(&l->st.slot_wait_ns, memory_order_relaxed) * 1e-9, v.word, json_text(v.why, why, sizeof why), limit ? limit : "", v.consumer, v.decode,
      v.read, v.slot, gpu);
  return n < 0 || (size_t)n >= cap ? dl__fail(-ENOSPC, "stats need %d bytes", n + 1) : n;
}

