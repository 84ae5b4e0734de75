// gpu_check's read of a JPEG's scan on the device, for a first run's JPEGs whose verdict no earlier
// run kept: a thread block a JPEG, a thread a span of its scan (decode/jpeg_span.h), over the
// bytes of the host slot's arena copied to the device. The engines decode meanwhile; the copy
// thread takes the verdicts after, and an image that does not read clean is decoded again on the
// CPU, which reports it as a worker would. A worker so spends nothing on the scans of the GPU's
// images: reading them took a first epoch's workers about 0.55 of a decode each. One thread a
// whole scan, tried first, took about 26 ms for a q90 image: far behind the engines.
#include "decode/jpeg_span.h"
#include "gpu/kernels.h"

#include <cuda_runtime.h>

namespace {

__global__ void __launch_bounds__(SPAN_MAX) read_scans(const uint8_t *arena, dl__walk_job *jobs, span_end *room) {
  __shared__ scan s; // 42 KB of tables: with the spans' entries, within a block's 48 KB
  __shared__ span_cut c;
  __shared__ span_at at[SPAN_MAX];
  __shared__ size_t entropy_at;
  __shared__ uint32_t end;
  __shared__ int ok, changed[2];
  dl__walk_job *job = &jobs[blockIdx.x];
  const uint8_t *p = arena + job->at;
  size_t len = job->len;
  span_end *out = room + (size_t)blockIdx.x * SPAN_MAX;
  int t = (int)threadIdx.x;
  if (t == 0) {
    ok = !(len > UINT32_MAX / 8 || scan_parse(p, len, &s, &entropy_at) || s.restart);
    end = UINT32_MAX;
    if (!ok)
      job->verdict = -1; // several scans, restart markers: the CPU reads it
  }
  __syncthreads();
  if (!ok)
    return;
  if (t < s.comps)
    huff_lookups(&s.dc[t], false);
  else if (t >= 32 && t < 32 + s.comps)
    huff_lookups(&s.ac[t - 32], true);
  // The data ends at its first marker: each thread looks in a piece of it.
  const uint8_t *d = p + entropy_at;
  size_t rest = len - entropy_at, piece = (rest + SPAN_MAX - 1) / SPAN_MAX;
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
    out[i] = span_read(&s, &c, i, at[i], UINT32_MAX);
  }
  for (int round = 1;; round++) {
    __syncthreads(); // the round before's reads written
    span_at e = i > 0 && i < c.count ? span_entry(&c, out, i) : span_at{0, 0, 0};
    bool again = i > 0 && i < c.count && !span_same(e, at[i]);
    if (t == 0)
      changed[round & 1] = 0;
    __syncthreads(); // every entry taken before a read is written
    if (again) {
      at[i] = e;
      out[i] = span_read(&s, &c, i, e, UINT32_MAX);
      changed[round & 1] = 1;
    }
    __syncthreads();
    if (!changed[round & 1])
      break;
    if (round == SPAN_ROUNDS) {
      if (t == 0)
        job->verdict = -1;
      return;
    }
  }
  if (t == 0)
    job->verdict = span_join(&s, &c, out, at);
}

} // namespace

extern "C" size_t dl__walk_room_bytes(void) { return SPAN_MAX * sizeof(span_end); }

extern "C" int dl__walk_launch(const uint8_t *arena, dl__walk_job *jobs, int n, void *room, cudaStream_t s) {
  if (n <= 0)
    return 0;
  read_scans<<<n, SPAN_MAX, 0, s>>>(arena, jobs, (span_end *)room);
  return (int)cudaGetLastError();
}
