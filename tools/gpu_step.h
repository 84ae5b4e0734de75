/* dlbench's GPU consumer: real kernels that read each batch and keep the GPU busy a set time per batch,
 * as a model's step of many kernels would (of KERNEL_MS each, about 1 ms unless asked). */
#ifndef RINGFEED_GPU_STEP_H
#define RINGFEED_GPU_STEP_H

#include "ringfeed.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpu_step gpu_step;

int gpu_step_open(gpu_step **out, const char *device, double step_ms, double kernel_ms);
/* Waits (on the GPU) for the batch, runs the step kernel on it, then releases it on the stream. */
int gpu_step_consume(gpu_step *g, dl_batch *b, const DLTensor *image);
/* Copies one of the batch's tensors to HOST (for digests). */
int gpu_step_fetch(gpu_step *g, dl_batch *b, const DLTensor *t, void *host);
/* Where the GPU waited: the fraction of time it had no step to run between the first and last, and
 * the gaps behind it, so that a stall (an epoch's turn, a slow batch) shows apart from jitter. */
#define GPU_STEP_LARGEST 8
typedef struct {
  double frac;
  long gaps_over_1ms;
  double over_1ms_ms;                 /* those gaps' time together */
  int nlargest;                       /* the largest gaps, largest first */
  struct { long step; double ms; } largest[GPU_STEP_LARGEST]; /* STEP: the one that waited */
} gpu_step_idle;
/* Finishes, and says how long the GPU waited (frac -1 when no step ran). */
void gpu_step_close(gpu_step *g, gpu_step_idle *idle);
const char *gpu_step_error(void);
/* Device memory in use on DEVICE ("cuda:N"), by every process, in MiB (CUDA started if need be). */
double gpu_used_mb(const char *device);

#ifdef __cplusplus
}
#endif

#endif
