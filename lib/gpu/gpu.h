/*
 * The GPU stage as the rest of the library sees it: the copy stage (pinned host slots, copies
 * and conversion on a stream per device) and JPEG decoding on the device (nvJPEG, then one kernel
 * for crop, resize, flip, layout and dtype). Built without CUDA, none.c keeps the same surface:
 * device=cuda and decode=gpu fail cleanly and host batches work as always.
 */
#ifndef RINGFEED_GPU_GPU_H
#define RINGFEED_GPU_GPU_H

#include "internal.h"

/* ---- the copy stage (copy_stage.c; none.c without CUDA) ---- */

/* Checks the devices and sets up l->cuda (before the host slots are allocated). */
int dl__cuda_open(dl_loader *l);
/* Allocates device slots and starts a copy thread per device (after the host slots exist). */
int dl__cuda_start(dl_loader *l);
/* Stops the copy threads (workers are already stopped). */
void dl__cuda_stop(dl_loader *l);
/* Frees device memory, streams, events and decoders. NULL l->cuda is a no-op. */
void dl__cuda_close(dl_loader *l);
/* Host memory for the slots: pinned (after dl__cuda_start, in the background) when a device is
 * in use. */
void *dl__host_alloc(dl_loader *l, size_t bytes);
void dl__host_free(dl_loader *l, void *p, size_t bytes);
int dl__cuda_field(const dl_batch *b, const char *name, DLTensor *out);
int dl__cuda_wait(dl_batch *b, void *stream);
/* Under l->mu, when a device batch's last reference goes: records the consumer's event. */
void dl__cuda_release_locked(dl_batch *b);
/* Under l->mu: whether the consumer's GPU is still running work it queued before its last
 * release on device STREAM (so a consumer waiting now for a batch does not leave it idle). */
bool dl__cuda_consumer_busy_locked(dl_loader *l, int stream);
int dl__cuda_stats(dl_loader *l, char *buf, size_t cap);
/* Makes a JPEG decoder on every device of l->cuda (nvJPEG's hardware engine where there is
 * one); sets l->gpu_hw and l->gpu_pool. Fails with the reason in WHY. */
int dl__gpu_decoders_open(dl_loader *l, char *why, size_t cap);
/* Whether nvJPEG loads here (quick: it is not started); else the reason in WHY. */
bool dl__gpu_decoders_available(char *why, size_t cap);

/* ---- JPEG decoding on the GPU: the workers' side (plan.c) ---- */

enum { DL__GPU_ENGINE_HW = 1, DL__GPU_ENGINE_CUDA = 2 };

/* A sample of a host slot that the GPU decodes. */
struct dl__gpu_job {
  uint32_t at, len;      /* the JPEG's bytes in the slot's arena; len 0: decoded on the CPU */
  int32_t width, height; /* the image */
  int32_t roi[4];        /* x, y, w, h: what nvJPEG decodes (the crop and its filter's reach) */
  float rect[4];         /* the crop, in image pixels */
  uint8_t scale;         /* 1, 2, 4 or 8: the CPU path's DCT scaling for this crop, which the GPU path
                          * reproduces by averaging blocks of pixels before resampling */
  uint64_t key;          /* of its draws, for a decode on the CPU when nvJPEG refuses it */
  int64_t index;         /* in the dataset, to name it */
  uint8_t flip;
  uint8_t engine;        /* DL__GPU_ENGINE_* */
};

/* At open: where JPEGs are decoded (l->decode, with the reason in l->decode_reason, logged
 * once). decode=gpu|hybrid that cannot run fails with DL_ENODEVICE; decode=auto falls back to
 * the CPU. Then sizes the arenas (l->arena_bytes) from the dataset's JPEG sizes. */
int dl__decode_choose(dl_loader *l);

/* Under l->mu, when nvJPEG that decode=auto started in the background is ready (OK, the decoders
 * are in place) or failed (WHY says why): JPEGs go to the GPU from the next batch opened. */
void dl__decode_started_locked(dl_loader *l, bool ok, const char *why);

/* The bytes of a host slot's arena for the dataset's JPEGs (0 without JPEGs the GPU may take). */
size_t dl__gpu_arena_size(const dl_loader *l);

/* Hybrid, when batch B opens (under l->mu): which b->cpu_n of its samples the workers decode
 * (b->on_cpu). A function of the samples' draws and the split only. */
void dl__gpu_split_batch(dl_loader *l, const dl__sampler *sm, dl_batch *b);
/* What a worker's decode at the crop for KEY would cost, in whole decodes of its image, in the
 * run's first epoch or a later one. */
double dl__split_cost(const dl_loader *l, bool later_epoch, uint64_t key);

/* At a claim (under l->mu): room in B's arena for sample I's bytes when the GPU may decode it,
 * else NULL. Deterministic: claims of a batch are made in sample order. */
uint8_t *dl__gpu_arena_take(dl_loader *l, dl_batch *b, int i, const dl__sample *s);

/* On a worker, for a JPEG whose bytes are in slot B's arena (or copied there from IMAGE):
 * whether the GPU takes it. If so, fills b->jobs[i] and returns true; a JPEG that nvJPEG should
 * not see (progressive on the engine, CMYK, 12-bit, truncated, too large ...) stays on the CPU. */
bool dl__gpu_plan(const dl_loader *l, dl_batch *b, int i, int64_t index, uint8_t *arena_at, const uint8_t *image,
                  size_t len, uint64_t key);

/* Device bytes a job takes in the decoder's pool: the decoded region, and its scaled copy. */
size_t dl__gpu_job_bytes(const int32_t roi[4], int scale, int channels);

/* Hybrid: after each batch the copy stage reports how long the GPU took for its samples; with the
 * workers' time per image that gives the share at which both sides finish a batch together, which
 * the next batches' share moves toward while the consumer waits, and back toward the CPU while it
 * never waits and the copy stage waits for its GPU (the GPU's time is then better left to
 * training). */
void dl__gpu_share_update(dl_loader *l, int gpu_samples, double gpu_ms);

#endif
