// gpu_check's read of a JPEG's scan on the device, for a first run's JPEGs whose verdict no earlier
// run kept: one thread a JPEG, each running the CPU's own walker (decode/jpeg_walk.h) over the
// bytes of the host slot's arena copied to the device. The engines decode meanwhile; the copy
// thread takes the verdicts after, and an image that does not read clean is decoded again on the
// CPU, which reports it as a worker would. A worker so spends nothing on the scans of the GPU's
// images: before, reading them took a first epoch's workers about 0.55 of a decode each.
#include "decode/jpeg_walk.h"
#include "gpu/kernels.h"

#include <cuda_runtime.h>

namespace {

// One thread a block: each walk is serial and branches its own way, so threads of one warp would
// mostly wait for each other, and a batch's few hundred walks leave the SMs room anyway.
__global__ void walk_scans(const uint8_t *arena, dl__walk_job *jobs, int n, scan *room) {
  int i = blockIdx.x;
  if (i < n)
    jobs[i].verdict = walk_whole(arena + jobs[i].at, jobs[i].len, &room[i]);
}

} // namespace

extern "C" size_t dl__walk_room_bytes(void) { return sizeof(scan); }

extern "C" int dl__walk_launch(const uint8_t *arena, dl__walk_job *jobs, int n, void *room, cudaStream_t s) {
  if (n <= 0)
    return 0;
  walk_scans<<<n, 1, 0, s>>>(arena, jobs, n, (scan *)room);
  return (int)cudaGetLastError();
}
