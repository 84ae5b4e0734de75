/* The built-in ImageNet-like synthetic set of WebDataset shards that dlbench runs on. */
#ifndef RINGFEED_SYNTHETIC_H
#define RINGFEED_SYNTHETIC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How the synthetic JPEGs are encoded: quality 1..100, chroma subsampling 420 or 444; a size in
 * pixels, or 0 x 0 for the one drawn from the image's number; MCUs between restart markers (0:
 * none, as in every set dlbench makes); with SHARED_TABLES, every component coded with the luma's
 * Huffman tables (some encoders write one set for all). */
typedef struct synthetic_coding {
  int quality, subsampling;
  int width, height;
  int restart;
  int shared_tables;
} synthetic_coding;
/* The default set: ImageNet-like files (quality 90, 4:2:0). */
#define SYNTHETIC_DEFAULT ((synthetic_coding){.quality = 90, .subsampling = 420})

/*
 * Makes (once) N samples of 400-600 x 300-450 px JPEGs with photo-like texture and .cls labels, in
 * shards of 1,000, under the cache folder; the same bytes every time for a given coding. Writes
 * the brace pattern of the shards into SOURCE. Returns 0 or -errno, with a message on stderr.
 */
int synthetic_dataset(long n, synthetic_coding coding, int threads, char *source, size_t cap);

/* Encodes synthetic image I as a JPEG into a malloc'd buffer. */
int synthetic_jpeg(long i, synthetic_coding coding, unsigned char **out, unsigned long *len);

#ifdef __cplusplus
}
#endif

#endif
