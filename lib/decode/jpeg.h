/*
 * JPEG internals shared beyond decode/jpeg.c: what a file's markers say (decode/jpeg_probe.c), where
 * each sample's rows of blocks begin and whether its codes read through (decode/jpeg_rows.c), and the
 * DCT scaling a crop is decoded at. The GPU path plans and checks with these too.
 */
#ifndef RINGFEED_DECODE_JPEG_H
#define RINGFEED_DECODE_JPEG_H

#include "decode/decode.h"

/*
 * Where the rows of MCUs of each sample's JPEG begin, learnt as decodes walk past them
 * (decode/jpeg_rows.c): up to BUDGET bytes for SAMPLES samples, shared by a loader's workers.
 */
typedef struct dl__jpeg_rows dl__jpeg_rows;
dl__jpeg_rows *dl__jpeg_rows_new(uint32_t samples, uint64_t budget);
void dl__jpeg_rows_free(dl__jpeg_rows *s);
uint64_t dl__jpeg_rows_bytes(const dl__jpeg_rows *s);
uint64_t dl__jpeg_rows_skipped(const dl__jpeg_rows *s); /* MCU rows decodes did not Huffman-decode */
uint64_t dl__jpeg_rows_walked(const dl__jpeg_rows *s);  /* scans dl__jpeg_rows_clean read */
/* What a read of a whole image's codes found (dl__jpeg_rows_clean), a byte a sample. */
enum { DL__VERDICT_UNREAD, DL__VERDICT_CLEAN, DL__VERDICT_DAMAGED };
/* The verdicts of dl__jpeg_rows_clean into OUT (may be NULL); the number of samples. */
uint32_t dl__jpeg_rows_verdicts(const dl__jpeg_rows *s, uint8_t *out);
/* Takes the verdicts V[0, N) from an earlier run where it has none; how many it took. */
uint32_t dl__jpeg_rows_take_verdicts(dl__jpeg_rows *s, const uint8_t *v, uint32_t n);
/* SAMPLE's verdict so far (UNREAD without S); and one read elsewhere (the GPU), counted as WALKED. */
uint8_t dl__jpeg_rows_verdict(const dl__jpeg_rows *s, uint32_t sample);
void dl__jpeg_rows_note(dl__jpeg_rows *s, uint32_t sample, bool clean);
/* The starts AT of the ROWS rows of MCUs of SAMPLE's clean scan, read elsewhere (the GPU's read in
 * spans, decode/jpeg_span.h: an array of its row_start), from P (LEN bytes, its scan's data from
 * ENTROPY_AT): kept where the decodes have not learnt them yet and the budget allows. */
void dl__jpeg_rows_learn(dl__jpeg_rows *s, uint32_t sample, const uint8_t *p, size_t len, uint32_t entropy_at,
                         const void *at, uint32_t rows);
struct jpeg_decompress_struct;
/* For a decode of SRC (LEN bytes, its scan's data from ENTROPY_AT, D started) that needs no row
 * above iMCU row IMCU_ROW: stand-ins for the rows above in OUT (*PREFIX_LEN bytes) that SRC from
 * *TAIL_AT follows. -1 when the file or the row does not allow it: decode it as it is. */
int dl__jpeg_rows_prefix(dl__jpeg_rows *st, uint32_t sample, struct jpeg_decompress_struct *d, const uint8_t *src,
                         size_t len, size_t entropy_at, int imcu_row, dl__buf *out, size_t *prefix_len,
                         size_t *tail_at);
/* Whether the JPEG P (LEN bytes), the dataset's SAMPLE, reads to its end as libjpeg would read it
 * without complaint: 1 it does, 0 it does not (libjpeg would find the data ends early, a code no
 * table has, or the walk something it does not expect). A baseline scan is walked here, its row
 * starts kept on the way; any other image is read by libjpeg (dl__jpeg_sound), and is not
 * sound over MAX_PIXELS. Read once a sample. */
int dl__jpeg_rows_clean(dl__jpeg_rows *st, uint32_t sample, const uint8_t *p, size_t len, int64_t max_pixels);
/* Whether libjpeg reads every scan of the JPEG P (LEN bytes), of at most MAX_PIXELS, to its
 * coefficients without an error or a warning: 1, else 0. */
int dl__jpeg_sound(const uint8_t *p, size_t len, int64_t max_pixels);
/* Whether the JPEG P (LEN bytes) is of one scan holding every component and its codes read through
 * clean (dl__jpeg_rows_clean): what a ringfeed shard's writer records of it (docs/format.md), and
 * what a loader then need not read again before a GPU decode. */
bool dl__jpeg_scan_vouched(const uint8_t *p, size_t len);
/* The first iMCU row a decode of D needs for output rows from Y0 on. */
int dl__jpeg_rows_first(struct jpeg_decompress_struct *d, int y0);

/* The DCT scaling (1, 2, 4 or 8) the JPEG decoder uses for CROP at the output size (decode/jpeg.c). */
int dl__jpeg_scale(const dl__rect *crop, int out_w, int out_h);

/* What a JPEG's markers say, without decoding (decode/jpeg_probe.c). */
enum { DL__CSS_444, DL__CSS_422, DL__CSS_420, DL__CSS_440, DL__CSS_411, DL__CSS_410, DL__CSS_GRAY, DL__CSS_OTHER };
typedef struct dl__jpeg_info {
  int width, height, components, precision;
  int sof;         /* the frame marker, 0xC0..0xCF */
  int subsampling; /* DL__CSS_* */
  uint8_t samp[4][2];
  int first_scan_components;
  int scans;            /* counted up to the EOI only when the whole file was read */
  bool tables_complete; /* every table the frame and its first scan use is defined before it */
  bool rgb, cmyk;       /* the colour space libjpeg assumes is not YCbCr or grey */
  bool restarts;
  bool between_scans;   /* marker segments after the first scan (progressive, multi-scan) */
  bool bogus_progression; /* a progressive scan refines what no scan coded (libjpeg warns) */
  bool ends;            /* with WHOLE: the entropy-coded data runs to an EOI marker */
  int64_t blocks;       /* 8x8 blocks the frame codes (with the MCUs' padding) */
  size_t entropy_bytes; /* with WHOLE: bytes of entropy-coded data in all scans */
} dl__jpeg_info;
/* 0, or -1 when the markers before the first scan are malformed. WHOLE also reads the scans. */
int dl__jpeg_probe(const uint8_t *p, size_t n, bool whole, dl__jpeg_info *j);

#endif /* RINGFEED_DECODE_JPEG_H */
