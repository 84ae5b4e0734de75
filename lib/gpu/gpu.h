/*
 * The GPU stage (gpu/): the copy stage (pinned host slots, copies and conversion on a stream per
 * device), JPEG decoding on the device (nvJPEG, then one kernel for crop, resize, flip, layout and
 * dtype), the decode option's policy and hybrid's split, and the GPU check's verdicts kept across
 * runs. It takes the core's batches: the entry points the core calls are declared in core.h; what
 * the stage's own files share is here. Built without CUDA, none.c keeps the same surface:
 * device=cuda and decode=gpu fail cleanly and host batches work as always.
 */
#ifndef RINGFEED_GPU_GPU_H
#define RINGFEED_GPU_GPU_H

#include "core.h"

/* Makes a JPEG decoder on every device of l->cuda (nvJPEG's hardware engine where there is
 * one); sets l->gpu_hw and l->gpu_pool. Fails with the reason in WHY (copy_stage.c). */
int dl__gpu_decoders_open(dl_loader *l, char *why, size_t cap);
/* The same from decoders an earlier loader of the process kept (keep_gpu_decoders), for every
 * device or none; -1 when there are none to take. */
int dl__gpu_decoders_take_kept(dl_loader *l, char *why, size_t cap);
/* Whether nvJPEG loads here (quick: it is not started); else the reason in WHY. */
bool dl__gpu_decoders_available(char *why, size_t cap);

/* ---- JPEG decoding on the GPU: the workers' side (plan.c) ---- */

/* Device bytes a job takes in the decoder's pool: the decoded region, and its scaled copy. */
size_t dl__gpu_job_bytes(const int32_t roi[4], int scale, int channels);

/* ---- the policy (policy.c) ---- */

/* Under l->mu, when nvJPEG that decode=auto started in the background is ready (OK, the decoders
 * are in place) or failed (WHY says why): JPEGs go to the GPU from the next batch opened. */
void dl__decode_started_locked(dl_loader *l, bool ok, const char *why);
/* What a worker's decode at the crop for KEY would cost, in whole decodes of its image, in the
 * run's first epoch or a later one. */
double dl__split_cost(const dl_loader *l, bool later_epoch, uint64_t key);
/* Hybrid: after each batch the copy stage reports how long the GPU took for its samples; with the
 * workers' time per image that gives the share at which both sides finish a batch together, which
 * the next batches' share moves toward while the consumer waits, and back toward the CPU while it
 * never waits and the copy stage waits for its GPU (the GPU's time is then better left to
 * training). */
void dl__gpu_share_update(dl_loader *l, int gpu_samples, double gpu_ms);

#endif
