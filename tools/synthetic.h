/* The built-in ImageNet-like synthetic set of WebDataset shards that dlbench runs on. */
#ifndef RINGFEED_SYNTHETIC_H
#define RINGFEED_SYNTHETIC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Makes (once) N samples of 400-600 x 300-450 px quality-90 JPEGs with photo-like texture and .cls
 * labels, in shards of 1,000, under the cache folder; the same bytes every time. Writes the brace
 * pattern of the shards into SOURCE. Returns 0 or -errno, with a message on stderr.
 */
int synthetic_dataset(long n, int threads, char *source, size_t cap);

/* Encodes synthetic image I as a JPEG into a malloc'd buffer. */
int synthetic_jpeg(long i, unsigned char **out, unsigned long *len);

#ifdef __cplusplus
}
#endif

#endif
