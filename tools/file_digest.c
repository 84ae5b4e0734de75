#include "file_digest.h"
#include "tools.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef DL_WITH_LIBCRYPTO
#include <openssl/evp.h>
#endif
#define XXH_INLINE_ALL
#include <xxhash.h>

#define CHUNK (1u << 20)

#define MAX_DIGEST 64 /* bytes, of sha512 and blake2b */

/* Streaming's (Python hashlib's) names against OpenSSL's; blake2b and blake2s are hashlib's default
 * sizes. */
static const char *const openssl_names[][2] = {
    {"md5", "MD5"},           {"sha1", "SHA1"},         {"sha224", "SHA224"},     {"sha256", "SHA256"},
    {"sha384", "SHA384"},     {"sha512", "SHA512"},     {"sha3_224", "SHA3-224"}, {"sha3_256", "SHA3-256"},
    {"sha3_384", "SHA3-384"}, {"sha3_512", "SHA3-512"}, {"blake2b", "BLAKE2B-512"}, {"blake2s", "BLAKE2S-256"},
};

enum { XXH_32, XXH_64, XXH_3_64, XXH_3_128 };

static const struct {
  const char *name;
  int kind;
} xxh_names[] = {{"xxh32", XXH_32}, {"xxh64", XXH_64}, {"xxh3_64", XXH_3_64}, {"xxh128", XXH_3_128},
                 {"xxh3_128", XXH_3_128}};

/* Reads FD to its end through FEED; 0 or -errno. */
static int read_all(int fd, unsigned char *buf, void (*feed)(void *ctx, const void *p, size_t n), void *ctx) {
  for (uint64_t at = 0;;) {
    int64_t got = dl_tool_pread(fd, buf, CHUNK, at);
    if (got <= 0)
      return (int)got;
    feed(ctx, buf, (size_t)got);
    at += (uint64_t)got;
  }
}

static void feed_32(void *ctx, const void *p, size_t n) { XXH32_update(ctx, p, n); }
static void feed_64(void *ctx, const void *p, size_t n) { XXH64_update(ctx, p, n); }
static void feed_3(void *ctx, const void *p, size_t n) { XXH3_64bits_update(ctx, p, n); }
static void feed_128(void *ctx, const void *p, size_t n) { XXH3_128bits_update(ctx, p, n); }

#ifdef DL_WITH_LIBCRYPTO
static void to_hex(const unsigned char *d, size_t n, char *hex) {
  for (size_t i = 0; i < n; i++)
    sprintf(hex + 2 * i, "%02x", d[i]);
}

static void feed_evp(void *ctx, const void *p, size_t n) { EVP_DigestUpdate(ctx, p, n); }

static int evp_digest(int fd, const EVP_MD *md, unsigned char *buf, char *hex) {
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  if (!ctx || !EVP_DigestInit_ex(ctx, md, NULL)) {
    EVP_MD_CTX_free(ctx);
    return -ENOMEM;
  }
  int rc = read_all(fd, buf, feed_evp, ctx);
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (!rc && !EVP_DigestFinal_ex(ctx, d, &len))
    rc = -EIO;
  if (!rc)
    to_hex(d, len, hex);
  EVP_MD_CTX_free(ctx);
  return rc;
}
#endif

/* xxHash digests as Python's xxhash writes them: the canonical (big-endian) bytes in hex, which is
 * the value printed in hex. */
static int xxh_digest(int fd, int kind, unsigned char *buf, char *hex) {
  static void (*const feed[])(void *, const void *, size_t) = {feed_32, feed_64, feed_3, feed_128};
  union {
    XXH32_state_t x32;
    XXH64_state_t x64;
    XXH3_state_t x3;
  } st;
  if (kind == XXH_32)
    XXH32_reset(&st.x32, 0);
  else if (kind == XXH_64)
    XXH64_reset(&st.x64, 0);
  else if (kind == XXH_3_64)
    XXH3_64bits_reset(&st.x3);
  else
    XXH3_128bits_reset(&st.x3);
  int rc = read_all(fd, buf, feed[kind], &st);
  if (rc)
    return rc;
  if (kind == XXH_32) {
    sprintf(hex, "%08x", (unsigned)XXH32_digest(&st.x32));
  } else if (kind == XXH_64 || kind == XXH_3_64) {
    sprintf(hex, "%016llx",
            (unsigned long long)(kind == XXH_64 ? XXH64_digest(&st.x64) : XXH3_64bits_digest(&st.x3)));
  } else {
    XXH128_hash_t h = XXH3_128bits_digest(&st.x3);
    sprintf(hex, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
  }
  return 0;
}

int file_digest(int fd, const char *algo, char *hex, size_t cap) {
  if (cap < 2 * MAX_DIGEST + 1)
    return -EINVAL;
  int xxh = -1;
  for (size_t i = 0; i < sizeof xxh_names / sizeof *xxh_names; i++)
    if (!strcmp(algo, xxh_names[i].name))
      xxh = xxh_names[i].kind;
  const char *openssl = NULL;
  for (size_t i = 0; i < sizeof openssl_names / sizeof *openssl_names; i++)
    if (!strcmp(algo, openssl_names[i][0]))
      openssl = openssl_names[i][1];
#ifdef DL_WITH_LIBCRYPTO
  const EVP_MD *md = openssl ? EVP_get_digestbyname(openssl) : NULL;
#else
  const void *md = NULL;
  if (openssl)
    return -ENOSYS;
#endif
  if (!md && xxh < 0)
    return -ENOTSUP;
  unsigned char *buf = malloc(CHUNK);
  if (!buf)
    return -ENOMEM;
#ifdef DL_WITH_LIBCRYPTO
  int rc = md ? evp_digest(fd, md, buf, hex) : xxh_digest(fd, xxh, buf, hex);
#else
  int rc = xxh_digest(fd, xxh, buf, hex);
#endif
  free(buf);
  return rc;
}
