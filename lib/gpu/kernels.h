/*
 * The GPU stage's kernels as the host code calls them (plain C: the .cu files include it too).
 */
#ifndef RINGFEED_GPU_KERNELS_H
#define RINGFEED_GPU_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One decoded JPEG region and where its crop lands in the batch (the kernels' view). */
typedef struct dl__resize_job {
  const uint8_t *full;   /* the region as nvJPEG decoded it, channels interleaved (device memory) */
  int full_pitch, full_w, full_h;
  int scale;             /* > 1: first averaged in blocks of scale x scale into SRC */
  uint8_t *src;          /* what is resampled: FULL itself, or its scaled copy */
  int pitch, w, h;       /* bytes per row; the size in pixels */
  float x, y, cw, ch;    /* the crop within SRC */
  int out, flip;         /* the sample's place in the batch; mirrored */
} dl__resize_job;

/* uint8 NHWC samples to float32/float16/bfloat16 (dtype 1..3), NHWC or NCHW, normalised. */
int dl__convert_launch(const uint8_t *in, void *out, int n, int h, int w, int c, int nchw, int dtype,
                       const float *mean, const float *std, cudaStream_t s);
/* For the N jobs with scale > 1: SRC = FULL averaged in blocks of scale x scale (a partial block at
 * the region's edge averages what it has), as a decoder's DCT scaling would see it. */
int dl__box_launch(const dl__resize_job *jobs, int n, int c, cudaStream_t s);
/* Crop, antialiased resize, flip, layout and dtype/normalisation of N decoded regions straight
 * into the batch OUT (oh x ow x c per sample), as the CPU path computes them. */
int dl__resize_launch(const dl__resize_job *jobs, int n, void *out, int oh, int ow, int c, int nchw, int dtype,
                      const float *mean, const float *std, cudaStream_t s);

/* A JPEG whose scan the device reads (walk.cu): its bytes at AT (LEN) of the arena's copy, its
 * place OUT in the host batch, and what the read found: 1 clean, 0 not, -1 left to the CPU (not a
 * file the spans read: decode/jpeg_span.h); of a clean one, where
 * its scan's data begins and how many MCU rows' starts it noted (0: none). */
typedef struct dl__walk_job {
  uint32_t at, len;
  int32_t out, verdict;
  uint32_t entropy_at, rows;
} dl__walk_job;

/* The device bytes one image's read needs for its spans' findings (ROOM holds N of them), and for
 * the row starts it notes (ROWS holds N of them: decode/jpeg_span.h's row_start, SPAN_ROWS). */
size_t dl__walk_room_bytes(void);
size_t dl__walk_rows_bytes(void);
/* Reads the scans of N JOBS (device memory) in ARENA (device memory), their verdicts into JOBS and
 * their row starts into ROWS. */
int dl__walk_launch(const uint8_t *arena, dl__walk_job *jobs, int n, void *room, void *rows, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
