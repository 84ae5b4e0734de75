/*
 * Inside the GPU stage: the copy stage (copy_stage.c) hands each host batch's GPU samples to its
 * device's JPEG decoder (decode.c), whose output the kernels (resize.cu, convert.cu) turn into
 * the device batch.
 */
#ifndef RINGFEED_GPU_DECODE_H
#define RINGFEED_GPU_DECODE_H

#include "gpu/gpu.h"
#include "gpu/kernels.h"

#include <sys/resource.h>

typedef struct dl__gpu_decoder dl__gpu_decoder;

/* A thread's user and system time in R (getrusage's RUSAGE_THREAD), in milliseconds. */
static inline double dl__rusage_cpu_ms(const struct rusage *r) {
  return (double)(r->ru_utime.tv_sec + r->ru_stime.tv_sec) * 1e3 +
         (double)(r->ru_utime.tv_usec + r->ru_stime.tv_usec) / 1e3;
}

/* nvJPEG on DEVICE: the hardware engine when the card has one, the CUDA decoder always, a pool of
 * l->o.gpu_decode_mb for decoded images and the kernel's job lists, all fixed here. Adds the
 * device bytes it took to *DEVICE_BYTES. Fails with the reason in WHY. */
int dl__gpu_decoder_create(dl_loader *l, int device, dl__gpu_decoder **out, size_t *device_bytes, char *why,
                           size_t cap);
void dl__gpu_decoder_destroy(dl__gpu_decoder *d);
/* A decoder an earlier loader of the process left for L on DEVICE (made for the same batch size,
 * channels, prefetch and gpu_decode_mb), adding its device bytes to *DEVICE_BYTES; NULL if none. */
dl__gpu_decoder *dl__gpu_decoder_take(const dl_loader *l, int device, size_t *device_bytes);
/* The end of a loader's use of D (NULL: none): with KEEP, kept for the next loader in place of
 * one kept before on its device; else destroyed. */
void dl__gpu_decoder_put(dl__gpu_decoder *d, bool keep);
/* Which nvJPEG, from where, and which of its decoders run. */
const char *dl__gpu_decoder_describe(const dl__gpu_decoder *d, char *buf, size_t cap);
bool dl__gpu_decoder_has_engine(const dl__gpu_decoder *d);
/* The copy thread's time so far waiting, before a hardware decode, for the kernels still reading
 * the pool (nvJPEG's engine writes it when called, not in the stream's order). */
double dl__gpu_decoder_pool_wait_ms(const dl__gpu_decoder *d);
/* The scans D read for gpu_check (walk.cu) and of them the damaged, added to *WALKS and *DAMAGED;
 * returns the copy thread's time waiting for them after its decodes. */
double dl__gpu_decoder_walks(const dl__gpu_decoder *d, int64_t *walks, int64_t *damaged);

/* Queues on S the decode of HOST's GPU samples into OUT, the device batch (its final dtype and
 * layout); SLOT is HOST's index among its stream's host slots. A JPEG nvJPEG refuses is decoded on
 * the CPU into HOST's image instead (or fails as on the CPU path) and its job's len becomes 0, so
 * the caller copies it with the other CPU samples. Returns the number decoded on the GPU, or -1
 * with WHY when CUDA itself fails. */
int dl__gpu_decode(dl__gpu_decoder *d, dl_loader *l, dl_batch *host, int slot, void *out, cudaStream_t s, char *why,
                   size_t cap);

/* HOST failed on a worker (on_error=fail) and is not decoded: its GPU samples before the failed
 * one are decoded on the CPU, so that the error reported is the first in batch order, as it is
 * when the CPU decodes everything. */
void dl__gpu_decode_failed_batch(dl__gpu_decoder *d, dl_loader *l, dl_batch *host);

#endif
