/* Image-text shards for the bytes fields: members_write() makes one, members_run() reads it with
 * OPTS and checks every sample's caption, JSON and binary member against its key (host or device
 * batches alike: the bytes stay on the host with the batch). */
#ifndef RINGFEED_MEMBERS_CHECK_H
#define RINGFEED_MEMBERS_CHECK_H

#include "ringfeed.h"
#include "tar_writer.h"
#include "test.h"
#include "test_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MEMBERS_SAMPLES = 60 };

static const char *const members_captions[] = {"a café in Zürich", "東京の夜景", "emoji 🐈🚀 end", "", "plain"};

static size_t members_bin(int i, unsigned char *out) { /* 0..199 bytes, NULs included */
  size_t n = (size_t)(i * 37 % 200);
  for (size_t k = 0; k < n; k++)
    out[k] = (unsigned char)(i * 31 + k * 7);
  return n;
}

static void members_write(const char *path) {
  FILE *f = fopen(path, "wb");
  ASSERT(f);
  for (int i = 0; i < MEMBERS_SAMPLES; i++) {
    char key[32], name[64], json[64];
    unsigned char *jpg, bin[256];
    unsigned long len;
    snprintf(key, sizeof key, "m%04d", i);
    test_tar_sample(f, key, i % 7, i, &jpg, &len);
    free(jpg);
    snprintf(name, sizeof name, "%s.caption.txt", key);
    const char *cap = members_captions[i % 5];
    ASSERT_EQ(tar_write_member(f, name, cap, strlen(cap)), 0);
    snprintf(name, sizeof name, "%s.bin", key);
    ASSERT_EQ(tar_write_member(f, name, bin, members_bin(i, bin)), 0);
    if (i % 4) { /* every fourth sample has no JSON */
      snprintf(name, sizeof name, "%s.json", key);
      int n = snprintf(json, sizeof json, "{\"i\": %d}", i);
      ASSERT_EQ(tar_write_member(f, name, json, (size_t)n), 0);
    }
  }
  ASSERT_EQ(tar_write_end(f), 0);
  fclose(f);
}

/* Reads SOURCE to the end with OPTS; returns the samples checked. */
static int members_run(const char *source, const char *opts) {
  dl_loader *l;
  OPEN_OK(l, source, opts);
  dl_batch *b;
  int checked = 0, r;
  while ((r = dl_next_batch(l, &b)) == 0) {
    ASSERT_EQ(dl_batch_bytes_count(b), 3);
    for (int i = 0; i < dl_batch_size(b); i++) {
      int k = atoi(dl_batch_key(b, i) + 1);
      size_t len;
      const char *cap = (const char *)dl_batch_bytes(b, "caption.txt", i, &len);
      ASSERT(cap != NULL);
      ASSERT_EQ(len, strlen(members_captions[k % 5]));
      ASSERT_STR_EQ(cap, members_captions[k % 5]); /* NUL-terminated */
      unsigned char want[256];
      size_t n = members_bin(k, want);
      const unsigned char *bin = (const unsigned char *)dl_batch_bytes(b, "bin", i, &len);
      ASSERT(bin != NULL);
      ASSERT_EQ(len, n);
      ASSERT(n == 0 || memcmp(bin, want, n) == 0);
      const char *json = (const char *)dl_batch_bytes(b, "json", i, &len);
      if (k % 4) {
        char text[64];
        snprintf(text, sizeof text, "{\"i\": %d}", k);
        ASSERT(json != NULL);
        ASSERT_STR_EQ(json, text);
      } else {
        ASSERT(json == NULL);
        ASSERT_EQ(len, 0);
      }
      ASSERT(dl_batch_bytes(b, "nonesuch", i, &len) == NULL);
      checked++;
    }
    ASSERT(dl_batch_bytes(b, "bin", dl_batch_size(b), NULL) == NULL);
    dl_batch_release(b, NULL);
  }
  ASSERT_EQ(r, DL_EOF);
  dl_close(l);
  return checked;
}

#endif
