/*
 * PNG through libpng: every colour type and bit depth, interlaced or not, expanded to 8-bit
 * RGB (or grey) with 16-bit samples reduced to their high byte and alpha dropped, as PIL's
 * convert("RGB") does. Metadata chunks are skipped unread, so a decompression bomb or a huge
 * declared length in metadata costs nothing.
 */
#include "decode/decode.h"

#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <png.h>

typedef struct png_ctx {
  dl__buf rows;
  const uint8_t *src;
  size_t len, pos;
  char msg[256];
  const _Atomic int *cancel; /* the current job's */
  bool cancelled;
} png_ctx;

static int png_create(void **out) {
  png_ctx *x = calloc(1, sizeof *x);
  if (!x)
    return -1;
  *out = x;
  return 0;
}

static void png_destroy_ctx(void *p) {
  png_ctx *x = p;
  if (!x)
    return;
  dl__buf_free(&x->rows);
  free(x);
}

static void on_error(png_structp png, png_const_charp msg) {
  png_ctx *x = png_get_error_ptr(png);
  snprintf(x->msg, sizeof x->msg, "%s", msg);
  png_longjmp(png, 1);
}

static void on_warning(png_structp png, png_const_charp msg) {
  (void)png;
  (void)msg;
}

static void on_read(png_structp png, png_bytep out, size_t n) {
  png_ctx *x = png_get_io_ptr(png);
  if (n > x->len - x->pos)
    png_error(png, "PNG data ends early");
  memcpy(out, x->src + x->pos, n);
  x->pos += n;
}

/* After each row: a closing loader stops a large image partway. */
static void on_row(png_structp png, png_uint_32 row, int pass) {
  (void)row, (void)pass;
  png_ctx *x = png_get_io_ptr(png);
  if (x->cancel && atomic_load_explicit(x->cancel, memory_order_relaxed)) {
    x->cancelled = true;
    png_error(png, "the loader was closed");
  }
}

static int png_decode(void *p, dl__decode_job *job, dl__err *e) {
  png_ctx *x = p;
  x->cancel = job->cancel;
  x->cancelled = false;
  x->src = job->src;
  x->len = job->len;
  x->pos = 0;
  x->msg[0] = 0;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, x, on_error, on_warning);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!info) {
    png_destroy_read_struct(&png, NULL, NULL);
    return dl__err_set(e, -ENOMEM, "out of memory starting a PNG decode");
  }
  volatile int code = DL_ECORRUPT;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, NULL);
    return dl__err_set(e, x->cancelled ? DL_ECLOSED : code, "%s", x->msg[0] ? x->msg : "corrupt PNG");
  }
  png_set_read_fn(png, x, on_read);
  png_set_read_status_fn(png, on_row);
  /* Ancillary chunks that do not change the pixels we deliver are never read into memory. */
  static const png_byte skip[] = "bKGD\0cHRM\0eXIf\0gAMA\0hIST\0iCCP\0iTXt\0oFFs\0pCAL\0pHYs\0"
                                 "sBIT\0sCAL\0sPLT\0sRGB\0tEXt\0tIME\0zTXt\0";
  png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER, skip, 17);
  png_set_user_limits(png, 1u << 24, 1u << 24);
  png_set_chunk_malloc_max(png, 8u << 20);
  png_read_info(png, info);
  png_uint_32 w, h;
  int depth, color, interlace;
  png_get_IHDR(png, info, &w, &h, &depth, &color, &interlace, NULL, NULL);
  job->src_width = (int)w;
  job->src_height = (int)h;
  if ((int64_t)w * h > job->max_pixels) {
    code = DL_ELIMIT;
    snprintf(x->msg, sizeof x->msg, "image is %ux%u, above max_pixels=%lld", w, h,
             (long long)job->max_pixels);
    png_longjmp(png, 1);
  }
  dl__err plan_err;
  int r = job->plan(job, (int)w, (int)h, &plan_err);
  if (r) {
    code = r;
    snprintf(x->msg, sizeof x->msg, "%s", plan_err.msg);
    png_longjmp(png, 1);
  }
  if (color == PNG_COLOR_TYPE_PALETTE)
    png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8)
    png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16)
    png_set_strip_16(png);
  /* Palette expansion turns tRNS into an alpha channel: drop it like a stored one. */
  if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS))
    png_set_strip_alpha(png);
  bool is_color = (color & PNG_COLOR_MASK_COLOR) != 0;
  if (job->channels == 3 && !is_color)
    png_set_gray_to_rgb(png);
  /* Colour to grey is done here, after decoding to RGB: libpng's own conversion weighs the channels
   * as Rec. 709 (or the file's cHRM says), not as PIL and the other decoders do. */
  bool to_grey = job->channels == 1 && is_color;
  int passes = png_set_interlace_handling(png);
  (void)passes;
  png_read_update_info(png, info);
  size_t stride = png_get_rowbytes(png, info);
  if (stride != (size_t)w * (size_t)(to_grey ? 3 : job->channels)) {
    snprintf(x->msg, sizeof x->msg, "unexpected PNG row size %zu for %u pixels", stride, w);
    png_longjmp(png, 1);
  }
  if (dl__buf_reserve(job->scratch, stride * h) || dl__buf_reserve(&x->rows, sizeof(png_bytep) * h)) {
    code = -ENOMEM;
    snprintf(x->msg, sizeof x->msg, "out of memory for a %ux%u image", w, h);
    png_longjmp(png, 1);
  }
  png_bytep *rows = (png_bytep *)x->rows.p;
  for (png_uint_32 i = 0; i < h; i++)
    rows[i] = job->scratch->p + (size_t)i * stride;
  png_read_image(png, rows);
  png_destroy_read_struct(&png, &info, NULL);
  if (to_grey) { /* in place: each grey byte lands before the RGB it came from */
    uint8_t *p = job->scratch->p;
    for (size_t i = 0, n = (size_t)w * h; i < n; i++)
      p[i] = dl__luma(p[3 * i], p[3 * i + 1], p[3 * i + 2]);
    stride = w;
  }
  job->pixels = job->scratch->p;
  job->width = (int)w;
  job->height = (int)h;
  job->stride = stride;
  job->mapped = job->rect;
  return 0;
}

static bool png_sniff(const uint8_t *p, size_t n) { return n >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8); }

static const dl__decoder_ops png_ops = {"png", png_create, png_destroy_ctx, png_decode};
const dl__codec dl__png_codec = {.id = DL__CODEC_PNG, .rfs = 3, .name = "png", .label = "PNG", .exts = ".png",
                                 .mds = "png", .sniff = png_sniff, .ops = &png_ops};
