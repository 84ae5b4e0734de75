/*
 * JPEG through libjpeg-turbo. Decodes only what the crop needs: DCT scaling (1/8, 1/4, 1/2, 1:
 * the SIMD-accelerated factors) when the crop is at least twice the output size, then
 * jpeg_crop_scanline and jpeg_skip_scanlines around the crop; rows above the crop that an earlier
 * decode of the sample walked past are not Huffman-decoded again (jpeg_rows.c). Truncation and
 * corrupt entropy data, which libjpeg reports only as warnings and fills with grey, are errors
 * here: no silent wrong pixels.
 */
#include "decode/jpeg.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#define MAX_SCANS 1000

typedef struct jpeg_ctx {
  struct jpeg_decompress_struct d;
  struct jpeg_error_mgr err;
  struct jpeg_progress_mgr progress;
  jmp_buf jump;
  int code;
  char msg[JMSG_LENGTH_MAX + 64];
  JSAMPROW rows[16];
  bool used; /* has decoded (or tried to decode) an image since it was created */
  const _Atomic int *cancel; /* the current job's */
  dl__buf prefix;            /* stand-ins for the rows above the crop, */
  const uint8_t *tail;       /* then the file's own bytes from the crop's rows */
  size_t tail_len;
} jpeg_ctx;

static void on_error(j_common_ptr c) {
  jpeg_ctx *x = (jpeg_ctx *)c->client_data;
  char buf[JMSG_LENGTH_MAX];
  c->err->format_message(c, buf);
  int code = c->err->msg_code;
  x->code = (code == JERR_BAD_PRECISION || code == JERR_NOT_COMPILED || code == JERR_SOF_UNSUPPORTED ||
             code == JERR_CONVERSION_NOTIMPL || code == JERR_ARITH_NOTIMPL)
                ? DL_EUNSUPPORTED
                : DL_ECORRUPT;
  snprintf(x->msg, sizeof x->msg, "%s", buf);
  longjmp(x->jump, 1);
}

static void on_message(j_common_ptr c, int level) {
  if (level >= 0)
    return; /* trace messages */
  int code = c->err->msg_code;
  /* Data that ends early or breaks off mid-segment leaves grey blocks: wrong pixels. */
  if (code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER || code == JWRN_MUST_RESYNC) {
    jpeg_ctx *x = (jpeg_ctx *)c->client_data;
    char buf[JMSG_LENGTH_MAX];
    c->err->format_message(c, buf);
    x->code = DL_ECORRUPT;
    snprintf(x->msg, sizeof x->msg, "%s", buf);
    longjmp(x->jump, 1);
  }
  c->err->num_warnings++;
}

/* Bounds the work a crafted progressive file can cause. */
static void on_progress(j_common_ptr c) {
  if (!c->is_decompressor)
    return;
  jpeg_ctx *cx = (jpeg_ctx *)c->client_data;
  if (cx->cancel && atomic_load_explicit(cx->cancel, memory_order_relaxed)) {
    /* The loader is closing: a large image is not decoded to the end for nobody. */
    cx->code = DL_ECLOSED;
    snprintf(cx->msg, sizeof cx->msg, "the loader was closed");
    longjmp(cx->jump, 1);
  }
  j_decompress_ptr d = (j_decompress_ptr)c;
  if (d->input_scan_number > MAX_SCANS) {
    jpeg_ctx *x = (jpeg_ctx *)c->client_data;
    x->code = DL_ELIMIT;
    snprintf(x->msg, sizeof x->msg, "more than %d progressive scans", MAX_SCANS);
    longjmp(x->jump, 1);
  }
}

static int jpeg_create(void **out) {
  jpeg_ctx *x = calloc(1, sizeof *x);
  if (!x)
    return -1;
  x->d.err = jpeg_std_error(&x->err);
  x->err.error_exit = on_error;
  x->err.emit_message = on_message;
  x->d.client_data = x;
  if (setjmp(x->jump)) {
    free(x);
    return -1;
  }
  jpeg_create_decompress(&x->d);
  x->progress.progress_monitor = on_progress;
  x->d.progress = &x->progress;
  *out = x;
  return 0;
}

static void jpeg_destroy_ctx(void *p) {
  jpeg_ctx *x = p;
  if (!x)
    return;
  jpeg_destroy_decompress(&x->d);
  dl__buf_free(&x->prefix);
  free(x);
}

int dl__jpeg_sound(const uint8_t *p, size_t len, int64_t max_pixels) {
  void *made;
  if (jpeg_create(&made))
    return 0;
  jpeg_ctx *x = made;
  volatile int sound = 0;
  if (!setjmp(x->jump)) {
    jpeg_mem_src(&x->d, p, (unsigned long)len);
    jpeg_read_header(&x->d, TRUE);
    /* Its coefficients are held whole, as a decode of it would hold them: no larger than the CPU
     * path would take. */
    if ((int64_t)x->d.image_width * x->d.image_height <= max_pixels) {
      jpeg_read_coefficients(&x->d); /* every scan's codes, to the EOI: no IDCT, no colour */
      sound = x->err.num_warnings == 0;
    }
  }
  jpeg_destroy_ctx(x);
  return sound;
}

static void cmyk_to_out(uint8_t *row, int width, bool inverted, int channels) {
  for (int i = 0; i < width; i++) {
    int c = row[4 * i], m = row[4 * i + 1], y = row[4 * i + 2], k = row[4 * i + 3];
    if (!inverted) {
      c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
    }
    int r = (c * k + 127) / 255, g = (m * k + 127) / 255, b = (y * k + 127) / 255;
    if (channels == 3) {
      row[3 * i] = (uint8_t)r;
      row[3 * i + 1] = (uint8_t)g;
      row[3 * i + 2] = (uint8_t)b;
    } else {
      row[i] = dl__luma((unsigned)r, (unsigned)g, (unsigned)b);
    }
  }
}

/*
 * libjpeg keeps Huffman and quantization tables across images on purpose (abbreviated streams),
 * so an image that lacks a table, as Motion-JPEG frames do, would silently decode with the previous
 * image's. An image that defines, before its first scan, every table its frame and that scan use
 * (the common baseline JPEG) overwrites whatever was there, so the decompressor is reused; any
 * other image gets a fresh decompressor.
 */
static bool self_contained(const uint8_t *p, size_t n) {
  dl__jpeg_info j;
  return dl__jpeg_probe(p, n, false, &j) == 0 && (j.sof == 0xC0 || j.sof == 0xC1) && j.tables_complete;
}

static int renew(jpeg_ctx *x) {
  if (setjmp(x->jump))
    return -1;
  jpeg_destroy_decompress(&x->d);
  x->d.err = &x->err;
  x->d.client_data = x;
  jpeg_create_decompress(&x->d);
  x->d.progress = &x->progress;
  return 0;
}

/* The source after the stand-ins: the file from the crop's rows, then what jpeg_mem_src gives at
 * the end of the data (a warning and an EOI), so that a file that ends early fails as it did. */
static boolean fill_tail(j_decompress_ptr d) {
  static const JOCTET eoi[2] = {0xFF, JPEG_EOI};
  jpeg_ctx *x = d->client_data;
  if (x->tail_len) {
    d->src->next_input_byte = x->tail;
    d->src->bytes_in_buffer = x->tail_len;
    x->tail_len = 0;
    return TRUE;
  }
  WARNMS(d, JWRN_JPEG_EOF);
  d->src->next_input_byte = eoi;
  d->src->bytes_in_buffer = 2;
  return TRUE;
}

/* Output rows from Y0 on are all the decode needs: the rows above are read from stand-ins when
 * the sample's row starts are known (jpeg_mem_src sets its own reader back at the next image). */
static void start_near(jpeg_ctx *x, const dl__decode_job *job, size_t entropy_at, int y0) {
  struct jpeg_decompress_struct *d = &x->d;
  size_t n, tail;
  int row = dl__jpeg_rows_first(d, y0);
  if (!job->rows || row < 1 || d->src->bytes_in_buffer != job->len - entropy_at ||
      dl__jpeg_rows_prefix(job->rows, job->sample, d, job->src, job->len, entropy_at, row, &x->prefix, &n, &tail))
    return;
  x->tail = job->src + tail;
  x->tail_len = job->len - tail;
  d->src->next_input_byte = x->prefix.p;
  d->src->bytes_in_buffer = n;
  d->src->fill_input_buffer = fill_tail;
}

static int jpeg_decode(void *p, dl__decode_job *job, dl__err *e) {
  jpeg_ctx *x = p;
  struct jpeg_decompress_struct *d = &x->d;
  if (x->used && !self_contained(job->src, job->len) && renew(x))
    return dl__err_set(e, -12, "out of memory starting a JPEG decode");
  if (setjmp(x->jump)) {
    jpeg_abort_decompress(d);
    return dl__err_set(e, x->code, "%s", x->msg);
  }
  x->used = true;
  x->cancel = job->cancel;
  jpeg_mem_src(d, job->src, (unsigned long)job->len);
  jpeg_read_header(d, TRUE);
  size_t entropy_at = job->len - d->src->bytes_in_buffer;
  int w = (int)d->image_width, h = (int)d->image_height;
  job->src_width = w;
  job->src_height = h;
  if ((int64_t)w * h > job->max_pixels) {
    jpeg_abort_decompress(d);
    return dl__err_set(e, DL_ELIMIT, "image is %dx%d, above max_pixels=%lld", w, h,
                       (long long)job->max_pixels);
  }
  int r = job->plan(job, w, h, e);
  if (r) {
    jpeg_abort_decompress(d);
    return r;
  }
  bool cmyk = d->jpeg_color_space == JCS_CMYK || d->jpeg_color_space == JCS_YCCK;
  d->out_color_space = cmyk ? JCS_CMYK : job->channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
  d->dct_method = JDCT_ISLOW;
  int num = 8 / dl__jpeg_scale(&job->rect, job->out_w, job->out_h);
  d->scale_num = (unsigned)num;
  d->scale_denom = 8;
  jpeg_start_decompress(d);
  double sx = (double)d->output_width / w, sy = (double)d->output_height / h;
  int comps = d->output_components;
  /* A margin of two pixels keeps the resampling filter's support inside decoded data. */
  int x0 = (int)(job->rect.x * sx) - 2, x1 = (int)((job->rect.x + job->rect.w) * sx + 0.999) + 2;
  int y0 = (int)(job->rect.y * sy) - 2, y1 = (int)((job->rect.y + job->rect.h) * sy + 0.999) + 2;
  if (x0 < 0)
    x0 = 0;
  if (y0 < 0)
    y0 = 0;
  if (x1 > (int)d->output_width)
    x1 = (int)d->output_width;
  if (y1 > (int)d->output_height)
    y1 = (int)d->output_height;
  JDIMENSION xoff = (JDIMENSION)x0, cw = (JDIMENSION)(x1 - x0);
  if (cw < d->output_width)
    jpeg_crop_scanline(d, &xoff, &cw);
  else
    xoff = 0, cw = d->output_width;
  int rows = y1 - y0;
  size_t stride = (size_t)cw * (size_t)comps;
  if (dl__buf_reserve(job->scratch, stride * (size_t)rows)) {
    jpeg_abort_decompress(d);
    return dl__err_set(e, -12, "out of memory for a %ux%d decode", cw, rows);
  }
  if (y0 > 0) {
    start_near(x, job, entropy_at, y0);
    jpeg_skip_scanlines(d, (JDIMENSION)y0);
  }
  int got = 0;
  while (got < rows) {
    int want = rows - got < 16 ? rows - got : 16;
    for (int i = 0; i < want; i++)
      x->rows[i] = job->scratch->p + (size_t)(got + i) * stride;
    JDIMENSION n = jpeg_read_scanlines(d, x->rows, (JDIMENSION)want);
    if (n == 0)
      break;
    got += (int)n;
  }
  bool inverted = d->saw_Adobe_marker;
  jpeg_abort_decompress(d);
  if (got < rows)
    return dl__err_set(e, DL_ECORRUPT, "JPEG data ends early");
  if (cmyk) {
    for (int i = 0; i < rows; i++)
      cmyk_to_out(job->scratch->p + (size_t)i * stride, (int)cw, inverted, job->channels);
    stride = (size_t)cw * (size_t)comps; /* rows keep their CMYK stride */
  }
  job->pixels = job->scratch->p;
  job->width = (int)cw;
  job->height = rows;
  job->stride = stride;
  job->mapped.x = job->rect.x * sx - xoff;
  job->mapped.y = job->rect.y * sy - y0;
  job->mapped.w = job->rect.w * sx;
  job->mapped.h = job->rect.h * sy;
  return 0;
}

int dl__jpeg_scale(const dl__rect *crop, int out_w, int out_h) {
  /* The largest reduction that still leaves at least the output size inside the crop. */
  int num = 8;
  while (num > 1 && crop->w * (num / 2) / 8 >= out_w && crop->h * (num / 2) / 8 >= out_h)
    num /= 2;
  return 8 / num;
}

/* FF D8 FF: a start-of-image marker and the next marker's first byte. */
static bool jpeg_sniff(const uint8_t *p, size_t n) { return n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF; }

static const dl__decoder_ops jpeg_ops = {"jpeg", jpeg_create, jpeg_destroy_ctx, jpeg_decode};
const dl__codec dl__jpeg_codec = {.id = DL__CODEC_JPEG, .rfs = 2, .name = "jpeg", .label = "JPEG", .exts = ".jpg.jpeg",
                                  .mds = "jpeg", .mds_quality = true, .sniff = jpeg_sniff, .ops = &jpeg_ops};

