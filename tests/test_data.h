/* Test data the tests write themselves: synthetic JPEG samples in tar shards and loose files. */
#ifndef RINGFEED_TEST_DATA_H
#define RINGFEED_TEST_DATA_H

#include <stdio.h>

#include "synthetic.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Appends KEY.jpg (synthetic image IMAGE_ID) and KEY.cls (LABEL) to the tar F; the JPEG's bytes are
 * returned in *JPG (malloc'd, the caller frees) for tests that also need them as files. */
void test_tar_sample(FILE *f, const char *key, long image_id, long label, unsigned char **jpg,
                     unsigned long *len);

/* The same with a synthetic image encoded as CODING says (quality, subsampling, size). */
void test_tar_synthetic(FILE *f, const char *key, long image_id, long label, synthetic_coding coding);

/* Writes a shard of N samples keyed PREFIX0000.. with labels BASE + i, made of IMAGES distinct
 * synthetic images repeated (making images is the slow part, above all under a sanitizer); ENDS,
 * when not NULL, gets where each sample's members end in the file. */
void test_tar_shard(const char *path, const char *prefix, int n, int images, long base, long *ends);

/* Writes N bytes to PATH, making its folder first. */
void test_write_file(const char *path, const void *p, size_t n);

#ifdef __cplusplus
}
#endif

#endif
