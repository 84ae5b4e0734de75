/*
 * Whole compressed files unpacked into another (lib/inflate.c), as compressed MDS shards and tar
 * shards are: gzip and zstd streams, several in a row, must come to exactly the size an MDS index
 * gives, or to no more than the room a tar's copy has (nothing else bounds it); damage and data
 * cut short are named, never a shorter copy taken for whole.
 */
#include "core.h"
#include "test.h"

#include <zlib.h>
#include <zstd.h>

enum { PLAIN = 200000 };

static uint8_t plain[PLAIN];

/* A file holding N bytes of P (an unnamed one, gone when closed). */
static int file_of(const uint8_t *p, size_t n) {
  FILE *f = tmpfile();
  ASSERT(f && (!n || fwrite(p, 1, n, f) == n) && fflush(f) == 0);
  int fd = dup(fileno(f));
  fclose(f);
  ASSERT(fd >= 0);
  return fd;
}

/* P (N bytes) as one gzip member into OUT; its length. */
static size_t gzip_of(const uint8_t *p, size_t n, uint8_t *out, size_t cap) {
  z_stream z = {0};
  ASSERT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  z.next_in = (Bytef *)p, z.avail_in = (uInt)n;
  z.next_out = out, z.avail_out = (uInt)cap;
  ASSERT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  size_t len = cap - z.avail_out;
  deflateEnd(&z);
  return len;
}

/* Unpacks IN's bytes (N) as HOW into a new file: the code, *SIZE what came out. */
static int unpack(const char *how, const uint8_t *in, size_t n, uint64_t expect, uint64_t most, uint64_t *size) {
  int src = file_of(in, n), dst = file_of(NULL, 0);
  int rc = dl__unpack(src, how, expect, most, dst, "shard", "x.tar.gz", size);
  if (rc == 0) { /* what came out is the plain bytes, in full */
    uint8_t *back = malloc(*size + 1);
    ASSERT(back && dl__pread_full(dst, back, *size + 1, 0) == (int64_t)*size);
    for (uint64_t at = 0; at < *size; at += PLAIN)
      ASSERT(!memcmp(back + at, plain, *size - at < PLAIN ? *size - at : PLAIN));
    free(back);
  }
  close(src);
  close(dst);
  return rc;
}

int main(void) {
  for (size_t i = 0; i < PLAIN; i++)
    plain[i] = (uint8_t)(i * 7 / 13); /* compressible, and not a repeat of one byte */
  static uint8_t gz[2 * PLAIN + 1024], zs[2 * PLAIN + 1024];
  size_t gz_len = gzip_of(plain, PLAIN, gz, sizeof gz / 2);
  memcpy(gz + gz_len, gz, gz_len); /* two members, as `cat a.gz b.gz` makes */
  size_t zs_len = ZSTD_compress(zs, sizeof zs, plain, PLAIN, 3);
  ASSERT(!ZSTD_isError(zs_len));
  uint64_t size = 0;

  /* An MDS index's size: exactly it. */
  ASSERT_EQ(unpack("gz", gz, 2 * gz_len, 2 * PLAIN, 2 * PLAIN, &size), 0);
  ASSERT_EQ(size, 2 * PLAIN);
  ASSERT_EQ(unpack("gz", gz, 2 * gz_len, PLAIN, PLAIN, &size), DL_ECORRUPT);
  ASSERT_CONTAINS(dl_last_error(), "decompresses to more than the 200000 bytes its index gives");
  ASSERT_EQ(unpack("zstd", zs, zs_len, PLAIN + 1, PLAIN + 1, &size), DL_ECORRUPT);
  ASSERT_CONTAINS(dl_last_error(), "decompresses to 200000 bytes, its index gives 200001");

  /* No size given (a tar): whatever it comes to, up to MOST, and DL_ELIMIT past it. */
  ASSERT_EQ(unpack("gz", gz, 2 * gz_len, 0, 2 * PLAIN, &size), 0);
  ASSERT_EQ(size, 2 * PLAIN);
  ASSERT_EQ(unpack("zstd", zs, zs_len, 0, UINT64_MAX, &size), 0);
  ASSERT_EQ(size, PLAIN);
  ASSERT_EQ(unpack("gz", gz, 2 * gz_len, 0, PLAIN + 1000, &size), DL_ELIMIT);
  ASSERT_CONTAINS(dl_last_error(), "shard x.tar.gz: decompresses to more than 201000 bytes, the room for its "
                                   "uncompressed copy");
  ASSERT_LE(size, PLAIN + 1000); /* it stopped there */

  /* Cut short, or damaged: named, with what came out before it. */
  ASSERT_EQ(unpack("gz", gz, gz_len / 2, 0, UINT64_MAX, &size), DL_ECORRUPT);
  ASSERT_CONTAINS(dl_last_error(), "shard x.tar.gz: its gz data ends early (truncated?)");
  ASSERT(size > 0 && size < PLAIN);
  ASSERT_EQ(unpack("zstd", zs, zs_len - 3, 0, UINT64_MAX, &size), DL_ECORRUPT);
  ASSERT_CONTAINS(dl_last_error(), "its zstd data ends early");
  gz[gz_len / 2] ^= 0x55;
  ASSERT_EQ(unpack("gz", gz, gz_len, 0, UINT64_MAX, &size), DL_ECORRUPT);
  ASSERT_CONTAINS(dl_last_error(), "shard x.tar.gz: gz: ");
  printf("unpack: exact sizes, bounds, several members, damage and early ends named\n");
  return 0;
}
