// gpu_check's read of a JPEG's scan on the device, for a first run's JPEGs whose verdict no earlier
// run kept: a thread block a JPEG, a thread a span of its scan (decode/jpeg_span.h), over the
// bytes of the host slot's arena copied to the device. The engines decode meanwhile; the copy
// thread takes the verdicts after, and an image that does not read clean is decoded again on the
// CPU, which reports it as a worker would. A worker so spends nothing on the scans of the GPU's
// images: reading them took a first epoch's workers about 0.55 of a decode each. One thread a
// whole scan, tried first, took about 26 ms for a q90 image: far behind the engines. A clean
// scan's row starts come back too, as a worker's walk left them for the later epochs' decodes.
#include "decode/jpeg_span.h"
#include "gpu/kernels.h"

#include <cuda_runtime.h>

namespace {

// An image's room in device memory: its spans' findings, and what comes before each.
struct room_of_one {
  span_end out[SPAN_MAX];
  span_base base[SPAN_MAX];
};

// A scan with restart markers (decode/jpeg_span.h's span_intervals_whole): each thread counts the
// markers in its piece of the data, then reads the interval after each one it found, knowing its
// number from the counts before; thread 0 also reads the first. FOUND: room for SPAN_MAX counts.
__device__ void read_intervals(const scan *s, const uint8_t *d, size_t rest, size_t piece, dl__walk_job *job,
                               uint32_t *found, int *bad) {
  int t = (int)threadIdx.x;
  size_t from = (size_t)t * piece, to = from + piece < rest ? from + piece : rest;
  uint32_t mine = 0;
  for (size_t j = from; j < to; j++)
    mine += span_restart_code(d, rest, j);
  found[t] = mine;
  uint64_t total = (uint64_t)s->mcu_rows * s->mcus_per_row, intervals = (total + s->restart - 1) / s->restart;
  __syncthreads();
  if (t == 0) {
    uint64_t before = 0;
    for (int k = 0; k < SPAN_MAX; k++) {
      uint32_t here = found[k];
      found[k] = (uint32_t)before;
      before += here;
    }
    *bad = before + 1 < intervals || !span_interval(s, d, rest, 0, 0, total); // markers missing, or the first
  }
  __syncthreads();
  for (uint64_t m = found[t], j = from; j < to && m + 1 < intervals; j++)
    if (span_restart_code(d, rest, j)) {
      if (!span_restart_expected(d, j, m) || !span_interval(s, d, rest, j + 1, m + 1, total))
        *bad = 1;
      m++;
    }
  __syncthreads();
  if (t == 0)
    job->verdict = !*bad;
}

__global__ void __launch_bounds__(SPAN_MAX) read_scans(const uint8_t *arena, dl__walk_job *jobs, room_of_one *room,
                                                       row_start *rows) {
  __shared__ scan s; // 42 KB of tables: with the spans' entries, within a block's 48 KB
  __shared__ span_cut c;
  __shared__ span_at at[SPAN_MAX];
  __shared__ size_t entropy_at;
  __shared__ uint32_t end;
  __shared__ int ok, changed[2], verdict;
  dl__walk_job *job = &jobs[blockIdx.x];
  const uint8_t *p = arena + job->at;
  size_t len = job->len;
  span_end *out = room[blockIdx.x].out;
  int t = (int)threadIdx.x;
  if (t == 0) {
    ok = !(len > UINT32_MAX / 8 || scan_parse(p, len, &s, &entropy_at));
    end = UINT32_MAX;
    job->rows = 0;
    if (!ok)
      job->verdict = -1; // not a file for the walker: the CPU reads it
  }
  __syncthreads();
  if (!ok)
    return;
  if (t < s.comps)
    huff_lookups(&s.dc[t], false);
  else if (t >= 32 && t < 32 + s.comps)
    huff_lookups(&s.ac[t - 32], true);
  const uint8_t *d = p + entropy_at;
  size_t rest = len - entropy_at, piece = (rest + SPAN_MAX - 1) / SPAN_MAX;
  if (s.restart) {
    read_intervals(&s, d, rest, piece, job, c.from, &verdict);
    return;
  }
  // The data ends at its first marker: each thread looks in a piece of it.
  for (size_t j = (size_t)t * piece; j < rest && j < (size_t)(t + 1) * piece; j++)
    if (span_marker(d, rest, j)) {
      atomicMin(&end, (uint32_t)j);
      break;
    }
  __syncthreads();
  if (t == 0) {
    c.d = d;
    c.n = end == UINT32_MAX ? (uint32_t)rest : end;
    c.count = span_count(c.n);
    c.from[c.count] = c.n;
  }
  __syncthreads();
  int i = t; // this thread's span
  if (i < c.count)
    c.from[i] = span_from(c.d, c.n, c.count, i);
  __syncthreads();
  if (i < c.count)
    c.bit[i + 1] = span_stuffed(c.d, c.from[i], c.from[i + 1]); // each span's, summed below
  __syncthreads();
  if (t == 0) {
    uint32_t stuffed = 0;
    c.bit[0] = 0;
    for (int k = 1; k <= c.count; k++) {
      stuffed += c.bit[k];
      c.bit[k] = (c.from[k] - stuffed) * 8;
    }
  }
  __syncthreads();
  if (i < c.count) {
    at[i] = span_at{c.bit[i], 0, 0};
    out[i] = span_read(&s, &c, i, at[i], UINT32_MAX, NULL);
  }
  for (int round = 1;; round++) {
    __syncthreads(); // the round before's reads written
    span_at e = i > 0 && i < c.count ? span_entry(&c, out, i) : span_at{0, 0, 0};
    bool again = i > 0 && i < c.count && !span_same(&s, e, at[i]);
    if (t == 0)
      changed[round & 1] = 0;
    __syncthreads(); // every entry taken before a read is written
    if (again) {
      at[i] = e;
      out[i] = span_read(&s, &c, i, e, UINT32_MAX, NULL);
      changed[round & 1] = 1;
    }
    __syncthreads();
    if (!changed[round & 1])
      break; // by round SPAN_MAX at the latest (decode/jpeg_span.h)
  }
  if (s.shared) { // the entries' bits settled: their blocks from the blocks ended before each
    uint8_t was = i < c.count ? at[i].b : 0;
    __syncthreads(); // every thread has its entry's block before thread 0 puts them right
    if (t == 0)
      span_blocks(&s, &c, out, at);
    __syncthreads();
    if (i < c.count && at[i].b != was)
      out[i] = span_read(&s, &c, i, at[i], UINT32_MAX, NULL);
    __syncthreads();
  }
  span_base *base = room[blockIdx.x].base;
  if (t == 0) {
    verdict = job->verdict = span_join(&s, &c, out, at, base);
    job->entropy_at = (uint32_t)entropy_at;
  }
  __syncthreads();
  if (verdict != 1 || s.mcu_rows > SPAN_ROWS)
    return;
  row_start *mine = rows + (size_t)blockIdx.x * SPAN_ROWS;
  if (t == 0) {
    mine[0] = row_start{0, {0, 0, 0}};
    job->rows = s.mcu_rows;
  }
  if (i < c.count)
    span_rows(&s, &c, i, at, base, mine, s.mcu_rows);
}

} // namespace

extern "C" size_t dl__walk_room_bytes(void) { return sizeof(room_of_one); }

extern "C" size_t dl__walk_rows_bytes(void) { return SPAN_ROWS * sizeof(row_start); }

extern "C" int dl__walk_launch(const uint8_t *arena, dl__walk_job *jobs, int n, void *room, void *rows,
                               cudaStream_t s) {
  if (n <= 0)
    return 0;
  read_scans<<<n, SPAN_MAX, 0, s>>>(arena, jobs, (room_of_one *)room, (row_start *)rows);
  return (int)cudaGetLastError();
}
