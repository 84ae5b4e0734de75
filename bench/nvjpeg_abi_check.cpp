// Checks ringfeed's own nvJPEG declarations (lib/gpu/nvjpeg.h) against NVIDIA's nvjpeg.h, on a
// machine that has the header: every value and struct layout it uses, and the exact signature of
// every function it loads. Compiles only if all agree; then prints what it checked.
//   nvcc -std=c++17 -DDL_WITH_CUDA -Ilib bench/nvjpeg_abi_check.cpp -o nvjpeg_abi_check
#include <nvjpeg.h>

#include <cstddef>
#include <cstdio>
#include <type_traits>

// The header's macros, kept before ours are declared under the same names.
constexpr unsigned real_flag_strict = NVJPEG_FLAGS_BITSTREAM_STRICT;
constexpr unsigned real_flag_interp = NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION;
constexpr unsigned real_flag_default = NVJPEG_FLAGS_DEFAULT;
constexpr unsigned real_flag_no_pipeline = NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE;
constexpr int real_max_component = NVJPEG_MAX_COMPONENT;
#undef NVJPEG_FLAGS_BITSTREAM_STRICT
#undef NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION
#undef NVJPEG_FLAGS_DEFAULT
#undef NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE
#undef NVJPEG_MAX_COMPONENT

// 1. Ours, in a namespace of their own: values and layouts.
namespace ours {
#include "gpu/nvjpeg.h"
}

#define SAME_VALUE(name) static_assert((long)ours::name == (long)::name, #name " differs from nvjpeg.h");
SAME_VALUE(NVJPEG_STATUS_SUCCESS)
SAME_VALUE(NVJPEG_STATUS_NOT_INITIALIZED)
SAME_VALUE(NVJPEG_STATUS_INVALID_PARAMETER)
SAME_VALUE(NVJPEG_STATUS_BAD_JPEG)
SAME_VALUE(NVJPEG_STATUS_JPEG_NOT_SUPPORTED)
SAME_VALUE(NVJPEG_STATUS_ALLOCATOR_FAILURE)
SAME_VALUE(NVJPEG_STATUS_EXECUTION_FAILED)
SAME_VALUE(NVJPEG_STATUS_ARCH_MISMATCH)
SAME_VALUE(NVJPEG_STATUS_INTERNAL_ERROR)
SAME_VALUE(NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED)
SAME_VALUE(NVJPEG_BACKEND_DEFAULT)
SAME_VALUE(NVJPEG_BACKEND_HYBRID)
SAME_VALUE(NVJPEG_BACKEND_GPU_HYBRID)
SAME_VALUE(NVJPEG_BACKEND_HARDWARE)
SAME_VALUE(NVJPEG_CSS_444)
SAME_VALUE(NVJPEG_CSS_422)
SAME_VALUE(NVJPEG_CSS_420)
SAME_VALUE(NVJPEG_CSS_440)
SAME_VALUE(NVJPEG_CSS_411)
SAME_VALUE(NVJPEG_CSS_410)
SAME_VALUE(NVJPEG_CSS_GRAY)
SAME_VALUE(NVJPEG_OUTPUT_YUV)
SAME_VALUE(NVJPEG_OUTPUT_Y)
SAME_VALUE(NVJPEG_OUTPUT_RGB)
SAME_VALUE(NVJPEG_OUTPUT_RGBI)
static_assert(NVJPEG_FLAGS_BITSTREAM_STRICT == real_flag_strict, "NVJPEG_FLAGS_BITSTREAM_STRICT");
static_assert(NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION == real_flag_interp, "NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION");
static_assert(NVJPEG_FLAGS_DEFAULT == real_flag_default, "NVJPEG_FLAGS_DEFAULT");
static_assert(NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE == real_flag_no_pipeline, "NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE");
static_assert(NVJPEG_MAX_COMPONENT == real_max_component, "NVJPEG_MAX_COMPONENT");
static_assert(sizeof(ours::nvjpegStatus_t) == sizeof(::nvjpegStatus_t), "nvjpegStatus_t size");
static_assert(sizeof(ours::nvjpegBackend_t) == sizeof(::nvjpegBackend_t), "nvjpegBackend_t size");
static_assert(sizeof(ours::nvjpegOutputFormat_t) == sizeof(::nvjpegOutputFormat_t), "nvjpegOutputFormat_t size");
static_assert(sizeof(ours::nvjpegChromaSubsampling_t) == sizeof(::nvjpegChromaSubsampling_t), "css size");
static_assert(sizeof(ours::nvjpegImage_t) == sizeof(::nvjpegImage_t), "nvjpegImage_t size");
static_assert(offsetof(ours::nvjpegImage_t, channel) == offsetof(::nvjpegImage_t, channel), "nvjpegImage_t.channel");
static_assert(offsetof(ours::nvjpegImage_t, pitch) == offsetof(::nvjpegImage_t, pitch), "nvjpegImage_t.pitch");
static_assert(sizeof(ours::nvjpegDevAllocator_t) == sizeof(::nvjpegDevAllocator_t), "nvjpegDevAllocator_t");
static_assert(sizeof(ours::nvjpegPinnedAllocator_t) == sizeof(::nvjpegPinnedAllocator_t), "nvjpegPinnedAllocator_t");

// 2. The function table again, now over the header's own types: each member must have exactly
// the type of the function it is loaded from.
#undef RINGFEED_GPU_NVJPEG_H
#define DL_NVJPEG_HAVE_HEADER 1
#include "gpu/nvjpeg.h"

#define SAME_SIGNATURE(member, function)                                                           \
  static_assert(std::is_same<decltype(dl__nvjpeg::member), decltype(&::function)>::value,         \
                #function " has another signature in nvjpeg.h");
SAME_SIGNATURE(CreateEx, nvjpegCreateEx)
SAME_SIGNATURE(Destroy, nvjpegDestroy)
SAME_SIGNATURE(GetHardwareDecoderInfo, nvjpegGetHardwareDecoderInfo)
SAME_SIGNATURE(JpegStateCreate, nvjpegJpegStateCreate)
SAME_SIGNATURE(JpegStateDestroy, nvjpegJpegStateDestroy)
SAME_SIGNATURE(DecodeBatchedInitialize, nvjpegDecodeBatchedInitialize)
SAME_SIGNATURE(DecodeBatched, nvjpegDecodeBatched)
SAME_SIGNATURE(DecodeBatchedEx, nvjpegDecodeBatchedEx)
SAME_SIGNATURE(DecodeBatchedPreAllocate, nvjpegDecodeBatchedPreAllocate)
SAME_SIGNATURE(DecodeParamsCreate, nvjpegDecodeParamsCreate)
SAME_SIGNATURE(DecodeParamsDestroy, nvjpegDecodeParamsDestroy)
SAME_SIGNATURE(DecodeParamsSetROI, nvjpegDecodeParamsSetROI)

int main() {
  std::printf("nvjpeg.h agrees with ringfeed's declarations: 24 values, 4 flags, 7 layouts, 12 signatures\n");
  return 0;
}
