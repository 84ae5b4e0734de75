/*
 * The decode stage (decode/): image codecs behind one table, the crop and the resampler, and one
 * image decoded into its place in a batch. It calls only util/ and internal.h.
 *
 * To add an image format: a file decode/NAME.c that defines `const dl__codec dl__NAME_codec`
 * (its decoder, how its bytes and member names say it) and one line in DL__CODECS below.
 */
#ifndef RINGFEED_DECODE_H
#define RINGFEED_DECODE_H

#include "internal.h"
#include "options.h"

typedef struct dl__rect {
  double x, y, w, h;
} dl__rect;

typedef struct dl__decode_job dl__decode_job;
struct dl__decode_job {
  /* in */
  const uint8_t *src;
  size_t len;
  int channels;       /* 1 or 3 */
  int out_w, out_h;   /* final size, so a decoder may decode at a reduced scale */
  int64_t max_pixels;
  /* Called once the image size is known: fills job->rect (source pixels) or fails. */
  int (*plan)(dl__decode_job *job, int width, int height, dl__err *e);
  void *plan_arg;
  dl__buf *scratch;
  const _Atomic int *cancel; /* when it turns nonzero, the decode stops with DL_ECLOSED (may be NULL) */
  bool pil;                  /* SRC is an MDS "pil" value (raw pixels have no signature to sniff) */
  struct dl__jpeg_rows *rows; /* where the rows of JPEGs begin, by SAMPLE (may be NULL) */
  uint32_t sample;
  /* set by plan */
  dl__rect rect;
  /* out: decoded pixels (channels interleaved) and rect mapped into them */
  const uint8_t *pixels;
  int width, height;
  size_t stride;
  dl__rect mapped;
  int src_width, src_height;
};

typedef struct dl__decoder_ops {
  const char *name;
  int (*create)(void **ctx);
  void (*destroy)(void *ctx);
  int (*decode)(void *ctx, dl__decode_job *job, dl__err *e);
} dl__decoder_ops;

/* ---- the image codecs (decode/codecs.c) ---- */

/*
 * Every image codec, one line each: X(NAME, name, ID) gives DL__CODEC_NAME = ID (kept in saved
 * indexes: never renumbered, below DL__MAX_CODECS) and names the codec's row, dl__name_codec,
 * which its decoder's file defines.
 */
#define DL__CODECS(X) X(JPEG, jpeg, 1) X(PNG, png, 2) X(WEBP, webp, 3) X(PIL, pil, 5)
#define DL__MAX_CODECS 16

/* DL__CODEC_NONE: the sample has no image; DL__CODEC_OTHER: a member named as an image whose bytes
 * are no known one. */
enum {
  DL__CODEC_NONE = 0,
  DL__CODEC_OTHER = 4,
#define DL__CODEC_ENUM(NAME, name, id) DL__CODEC_##NAME = id,
  DL__CODECS(DL__CODEC_ENUM)
#undef DL__CODEC_ENUM
};

typedef struct dl__codec {
  int id;             /* DL__CODEC_* */
  int rfs;            /* its codec number in ringfeed shards, -1 for none */
  const char *name;   /* in ringfeed shards and dlshard's listings: "jpeg" */
  const char *label;  /* in messages: "JPEG" */
  const char *exts;   /* a member's or file's extensions that name it, each with its dot: ".jpg.jpeg" */
  const char *mds;    /* MosaicML Streaming's encoding of it ("jpeg"), or NULL */
  bool mds_quality;   /* ... which may carry ":QUALITY" */
  /* Whether the N leading bytes at P are its signature (NULL: it has none, as raw pixels). */
  bool (*sniff)(const uint8_t *p, size_t n);
  const dl__decoder_ops *ops;
} dl__codec;

#define DL__CODEC_EXTERN(NAME, name, id) extern const dl__codec dl__##name##_codec;
DL__CODECS(DL__CODEC_EXTERN)
#undef DL__CODEC_EXTERN

/* The codec of ID, or NULL (DL__CODEC_NONE, DL__CODEC_OTHER, an ID no codec has). */
const dl__codec *dl__codec_of(int id);
/* The codec whose signature the N bytes at P begin with: DL__CODEC_OTHER for none. */
int dl__sniff_codec(const uint8_t *p, size_t n);
/* The codec a name's last extension says, or DL__CODEC_NONE. */
int dl__codec_of_ext(const char *name);
/* The codec stored as RFS in ringfeed shards, or NULL. */
const dl__codec *dl__codec_of_rfs(int rfs);
/* The codec of MosaicML Streaming's encoding ENC ("jpeg", "jpeg:90", "png", "pil"), or NULL. */
const dl__codec *dl__codec_of_mds(const char *enc);
/* For messages: the labels of the codecs with a signature ("JPEG, PNG or WebP"), and the
 * extensions that name images, joined by SEP ("/": ".jpg/.jpeg/.png/.webp") or, with SEP NULL,
 * as a list (".jpg, .jpeg, .png or .webp"). */
const char *dl__codec_labels(char *buf, size_t cap);
const char *dl__codec_exts(char *buf, size_t cap, const char *sep);

/* Grey from RGB as PIL's convert("L") and libjpeg take it (ITU-R 601-2 luma), for every decoder. */
static inline uint8_t dl__luma(unsigned r, unsigned g, unsigned b) {
  return (uint8_t)((19595u * r + 38470u * g + 7471u * b + 32768u) >> 16);
}
/* A Streaming "pil" value (decode/pil_raw.c) of mode RGB, RGBA, L or LA: BPP bytes a pixel from PIXELS,
 * rows without padding; anything else, or a size that does not add up, is an error in E. */
typedef struct dl__pil_image {
  uint32_t width, height;
  int bpp;
  char mode[16];
  const uint8_t *pixels;
} dl__pil_image;
int dl__pil_header(const uint8_t *p, size_t len, int64_t max_pixels, dl__pil_image *im, dl__err *e);

/* ---- crop and resize (decode/crop.c, decode/resize.c) ---- */

/* Chooses the source rectangle for MODE; draws come from KEY. */
int dl__crop_rect(int mode, int width, int height, int out_w, int out_h, uint64_t key, dl__rect *r,
                  dl__err *e);
/* Where the crop for KEY begins and ends down its image (0..1), before the image is read. */
void dl__crop_rows_hint(int mode, int out_w, int out_h, uint64_t key, double *top, double *bottom);

typedef struct dl__resize_scratch {
  dl__buf tmp, coef, wide;
} dl__resize_scratch;
void dl__resize_scratch_free(dl__resize_scratch *s);
/* Tests: the portable loops even where the processor has AVX2 (false: choose again). */
void dl__resize_force_portable(bool portable);

/*
 * Resamples RECT of SRC (w x h x ch, row stride) to OUT (ow x oh) with an antialiasing triangle
 * filter; FLIP mirrors horizontally. Output is interleaved (pixel stride ch) or planar (NCHW).
 */
int dl__resize(const uint8_t *src, int w, int h, size_t stride, int ch, dl__rect rect, uint8_t *out,
               int ow, int oh, int planar, int flip, dl__resize_scratch *s);

/* ---- pixels as the model takes them (decode/normalize.c) ---- */

/* (x / 255 - mean) / std as x * scale + shift, per channel (mean and std on the 0..1 scale). */
typedef struct dl__affine {
  float scale[3], shift[3];
} dl__affine;
dl__affine dl__affine_of(const float mean[3], const float std[3]);
/* The H x W x C uint8 values at IN (channels interleaved) into OUT as DTYPE (DL__DTYPE_FLOAT32,
 * _FLOAT16 or _BFLOAT16) normalised by A, interleaved or, with PLANAR, a plane per channel. */
void dl__normalize(const uint8_t *in, int h, int w, int c, bool planar, int dtype, const dl__affine *a, void *out);
/* The same of an image of zeros (the substitute for a bad sample, as the GPU converts it). */
void dl__normalize_zeros(int h, int w, int c, bool planar, int dtype, const dl__affine *a, void *out);

/* ---- one image into its place in a batch on the CPU (decode/image.c) ---- */

/* What a batch asks of each image, from the loader's options. */
typedef struct dl__image_spec {
  int width, height, channels;
  int crop;                  /* DL__CROP_* */
  bool planar;               /* NCHW bytes out (else channels interleaved) */
  int64_t max_pixels;
  const _Atomic int *cancel; /* the loader's: a decode stops when it turns nonzero */
} dl__image_spec;

/* The spec of options O, decodes stopping when CANCEL turns nonzero. */
dl__image_spec dl__image_spec_of(const dl__options *o, const _Atomic int *cancel);

typedef struct dl__image_decoder {
  void *ctx[DL__MAX_CODECS]; /* each codec's context, by DL__CODEC_* */
  struct dl__jpeg_rows *rows; /* the loader's, or NULL */
  dl__buf scratch;
  dl__resize_scratch rs;
} dl__image_decoder;

int dl__image_decoder_init(dl__image_decoder *d);
void dl__image_decoder_free(dl__image_decoder *d);
/* JOB decoded by the codec its bytes call for (or MDS raw pixels where JOB->pil says). */
int dl__image_decode_job(dl__image_decoder *d, dl__decode_job *job, dl__err *e);
/* Decodes IMAGE (LEN bytes; CODEC the sample's, which only DL__CODEC_PIL overrides sniffing) of
 * dataset sample SAMPLE, whose draws come from KEY, into DST as SPEC asks: the crop, resized,
 * mirrored with FLIP. */
int dl__image_decode(dl__image_decoder *d, const dl__image_spec *spec, const uint8_t *image, size_t len, int codec,
                     uint64_t key, bool flip, uint32_t sample, uint8_t *dst, dl__err *e);

#endif /* RINGFEED_DECODE_H */
