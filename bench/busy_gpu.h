/* Keeps the current GPU busy with kernels on every SM until stopped (bench/busy_gpu.cu). */
#ifndef RINGFEED_BENCH_BUSY_GPU_H
#define RINGFEED_BENCH_BUSY_GPU_H
#ifdef __cplusplus
extern "C" {
#endif
int busy_gpu_start(void);
/* NULL, or why the GPU was not kept busy the whole time. */
const char *busy_gpu_stop(void);
#ifdef __cplusplus
}
#endif
#endif
