/*
 * The part of nvJPEG's C API that ringfeed uses, declared here from NVIDIA's documentation so
 * that no build needs nvJPEG's header or library: the library is opened at run time
 * (nvjpeg_load.c). The names are nvJPEG's own. bench/nvjpeg_abi_check.cpp compiles these
 * declarations against the real nvjpeg.h where it exists and checks every value, layout and
 * signature (DL_NVJPEG_HAVE_HEADER skips ours in favour of the header's).
 */
#ifndef RINGFEED_GPU_NVJPEG_H
#define RINGFEED_GPU_NVJPEG_H

#include <stddef.h>

#ifdef DL_WITH_CUDA
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st *cudaStream_t; /* as the CUDA runtime declares it */
#endif

#ifndef DL_NVJPEG_HAVE_HEADER
typedef enum {
  NVJPEG_STATUS_SUCCESS = 0,
  NVJPEG_STATUS_NOT_INITIALIZED = 1,
  NVJPEG_STATUS_INVALID_PARAMETER = 2,
  NVJPEG_STATUS_BAD_JPEG = 3,
  NVJPEG_STATUS_JPEG_NOT_SUPPORTED = 4,
  NVJPEG_STATUS_ALLOCATOR_FAILURE = 5,
  NVJPEG_STATUS_EXECUTION_FAILED = 6,
  NVJPEG_STATUS_ARCH_MISMATCH = 7,
  NVJPEG_STATUS_INTERNAL_ERROR = 8,
  NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED = 9,
} nvjpegStatus_t;

typedef enum {
  NVJPEG_BACKEND_DEFAULT = 0,
  NVJPEG_BACKEND_HYBRID = 1,
  NVJPEG_BACKEND_GPU_HYBRID = 2,
  NVJPEG_BACKEND_HARDWARE = 3,
} nvjpegBackend_t;

typedef enum {
  NVJPEG_CSS_444 = 0,
  NVJPEG_CSS_422 = 1,
  NVJPEG_CSS_420 = 2,
  NVJPEG_CSS_440 = 3,
  NVJPEG_CSS_411 = 4,
  NVJPEG_CSS_410 = 5,
  NVJPEG_CSS_GRAY = 6,
} nvjpegChromaSubsampling_t;

typedef enum {
  NVJPEG_OUTPUT_YUV = 1, /* planes at the file's own sampling (bench/nvjpeg_ceiling --format yuv) */
  NVJPEG_OUTPUT_Y = 2,
  NVJPEG_OUTPUT_RGB = 3, /* three planes (bench/nvjpeg_ceiling --format rgb) */
  NVJPEG_OUTPUT_RGBI = 5,
} nvjpegOutputFormat_t;

#define NVJPEG_MAX_COMPONENT 4
#define NVJPEG_FLAGS_DEFAULT 0
#define NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE 1
#define NVJPEG_FLAGS_BITSTREAM_STRICT 4
#define NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION 32

typedef struct {
  unsigned char *channel[NVJPEG_MAX_COMPONENT];
  size_t pitch[NVJPEG_MAX_COMPONENT];
} nvjpegImage_t;

typedef int (*tDevMalloc)(void **, size_t);
typedef int (*tDevFree)(void *);
typedef struct {
  tDevMalloc dev_malloc;
  tDevFree dev_free;
} nvjpegDevAllocator_t;
typedef int (*tPinnedMalloc)(void **, size_t, unsigned int flags);
typedef int (*tPinnedFree)(void *);
typedef struct {
  tPinnedMalloc pinned_malloc;
  tPinnedFree pinned_free;
} nvjpegPinnedAllocator_t;

typedef struct nvjpegHandle *nvjpegHandle_t;
typedef struct nvjpegJpegState *nvjpegJpegState_t;
typedef struct nvjpegDecodeParams *nvjpegDecodeParams_t;
#endif /* DL_NVJPEG_HAVE_HEADER */

/* The functions, as loaded (one table for the process). */
typedef struct dl__nvjpeg {
  nvjpegStatus_t (*CreateEx)(nvjpegBackend_t backend, nvjpegDevAllocator_t *dev_allocator,
                             nvjpegPinnedAllocator_t *pinned_allocator, unsigned int flags,
                             nvjpegHandle_t *handle);
  nvjpegStatus_t (*Destroy)(nvjpegHandle_t handle);
  nvjpegStatus_t (*GetHardwareDecoderInfo)(nvjpegHandle_t handle, unsigned int *num_engines,
                                           unsigned int *num_cores_per_engine);
  nvjpegStatus_t (*JpegStateCreate)(nvjpegHandle_t handle, nvjpegJpegState_t *jpeg_handle);
  nvjpegStatus_t (*JpegStateDestroy)(nvjpegJpegState_t jpeg_handle);
  nvjpegStatus_t (*DecodeBatchedInitialize)(nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle,
                                            int batch_size, int max_cpu_threads,
                                            nvjpegOutputFormat_t output_format);
  nvjpegStatus_t (*DecodeBatched)(nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle,
                                  const unsigned char *const *data, const size_t *lengths,
                                  nvjpegImage_t *destinations, cudaStream_t stream);
  nvjpegStatus_t (*DecodeBatchedEx)(nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle,
                                    const unsigned char *const *data, const size_t *lengths,
                                    nvjpegImage_t *destinations, nvjpegDecodeParams_t *decode_params,
                                    cudaStream_t stream);
  nvjpegStatus_t (*DecodeBatchedPreAllocate)(nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle,
                                             int batch_size, int width, int height,
                                             nvjpegChromaSubsampling_t chroma_subsampling,
                                             nvjpegOutputFormat_t output_format);
  nvjpegStatus_t (*DecodeParamsCreate)(nvjpegHandle_t handle, nvjpegDecodeParams_t *decode_params);
  nvjpegStatus_t (*DecodeParamsDestroy)(nvjpegDecodeParams_t decode_params);
  nvjpegStatus_t (*DecodeParamsSetROI)(nvjpegDecodeParams_t decode_params, int offset_x, int offset_y,
                                       int roi_width, int roi_height);
  char path[512];    /* the file it came from */
  char version[32];  /* from the file's name: "13.0.1.x" */
} dl__nvjpeg;

/* Loads nvJPEG once per process (RINGFEED_NVJPEG, the library path, the CUDA toolkit, the NVIDIA
 * wheels beside a loaded PyTorch). NULL with the reason in WHY when it is not there or lacks a
 * function; thread-safe. */
const dl__nvjpeg *dl__nvjpeg_load(char *why, size_t cap);

/* "NVJPEG_STATUS_BAD_JPEG" and so on. */
const char *dl__nvjpeg_status_name(int status);

#endif
