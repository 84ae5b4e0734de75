/*
 * Whole compressed files unpacked into another file: the zstd, gzip and bzip2 streams MDS shards
 * are kept in (Streaming's compression='zstd', 'gz' and 'bz2', each with an optional ':level'), and
 * compressed tar shards. The output must come to exactly the size an MDS index gives (more or less
 * is damage, never a shorter shard); a tar's, which nothing gives, to no more than the room for it. Concatenated streams (zstd frames, gzip members, bzip2 streams) are read in turn.
 */
#include "util/util.h"

#include <bzlib.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

typedef struct unpacker {
  ZSTD_DStream *zstd;
  z_stream gz;
  bz_stream bz;
  bool open;      /* gz or bz started (their end must be called) */
  bool in_stream; /* inside a stream that has not ended: data ending here ends early */
} unpacker;

/* One step of a codec: reads from SRC (LEN bytes; *USED taken), writes into DST (CAP; *MADE).
 * 0, or -1 with *WHY. */
typedef int step_fn(unpacker *u, const uint8_t *src, size_t len, size_t *used, uint8_t *dst, size_t cap,
                    size_t *made, const char **why);

static int zstd_step(unpacker *u, const uint8_t *src, size_t len, size_t *used, uint8_t *dst, size_t cap,
                     size_t *made, const char **why) {
  ZSTD_inBuffer in = {src, len, 0};
  ZSTD_outBuffer out = {dst, cap, 0};
  size_t r = ZSTD_decompressStream(u->zstd, &out, &in);
  if (ZSTD_isError(r)) {
    *why = ZSTD_getErrorName(r);
    return -1;
  }
  *used = in.pos, *made = out.pos;
  if (in.pos || out.pos)
    u->in_stream = r != 0; /* 0: a frame ended and everything of it is out */
  return 0;
}

static int gz_step(unpacker *u, const uint8_t *src, size_t len, size_t *used, uint8_t *dst, size_t cap,
                   size_t *made, const char **why) {
  u->gz.next_in = (Bytef *)src, u->gz.avail_in = (uInt)len;
  u->gz.next_out = dst, u->gz.avail_out = (uInt)cap;
  int r = inflate(&u->gz, Z_NO_FLUSH);
  *used = len - u->gz.avail_in, *made = cap - u->gz.avail_out;
  if (r == Z_STREAM_END) {
    u->in_stream = false;
    inflateReset(&u->gz); /* a member may follow */
    return 0;
  }
  if (r != Z_OK && r != Z_BUF_ERROR) { /* Z_BUF_ERROR: no progress possible now, not damage */
    *why = u->gz.msg ? u->gz.msg : r == Z_MEM_ERROR ? "out of memory" : "not gzip data";
    return -1;
  }
  if (*used || *made)
    u->in_stream = true;
  return 0;
}

static int bz_step(unpacker *u, const uint8_t *src, size_t len, size_t *used, uint8_t *dst, size_t cap,
                   size_t *made, const char **why) {
  u->bz.next_in = (char *)src, u->bz.avail_in = (unsigned)len;
  u->bz.next_out = (char *)dst, u->bz.avail_out = (unsigned)cap;
  int r = BZ2_bzDecompress(&u->bz);
  *used = len - u->bz.avail_in, *made = cap - u->bz.avail_out;
  if (r == BZ_STREAM_END) {
    u->in_stream = false;
    BZ2_bzDecompressEnd(&u->bz); /* a stream may follow */
    memset(&u->bz, 0, sizeof u->bz);
    if (BZ2_bzDecompressInit(&u->bz, 0, 0) != BZ_OK) {
      u->open = false;
      *why = "out of memory";
      return -1;
    }
    return 0;
  }
  if (r != BZ_OK) {
    *why = r == BZ_DATA_ERROR_MAGIC ? "not bzip2 data" : r == BZ_MEM_ERROR ? "out of memory" : "damaged data";
    return -1;
  }
  if (*used || *made)
    u->in_stream = true;
  return 0;
}

static const struct {
  const char *name; /* as an MDS index names it, before any ":level" */
  step_fn *step;
} codecs[] = {{"zstd", zstd_step}, {"gz", gz_step}, {"bz2", bz_step}};

static int codec_of(const char *compression) {
  size_t n = strcspn(compression, ":");
  for (int i = 0; i < (int)DL__ARRAY_LEN(codecs); i++)
    if (strlen(codecs[i].name) == n && !strncmp(compression, codecs[i].name, n))
      return i;
  return -1;
}

bool dl__unpack_reads(const char *compression) { return codec_of(compression) >= 0; }

static int start(unpacker *u, int codec) {
  memset(u, 0, sizeof *u);
  if (codec == 0)
    return (u->zstd = ZSTD_createDStream()) ? 0 : -1;
  if (codec == 1)
    u->open = inflateInit2(&u->gz, 15 + 16) == Z_OK; /* 16: a gzip header, as gzip.compress writes */
  else
    u->open = BZ2_bzDecompressInit(&u->bz, 0, 0) == BZ_OK;
  return u->open ? 0 : -1;
}

static void finish(unpacker *u, int codec) {
  ZSTD_freeDStream(u->zstd);
  if (u->open)
    codec == 1 ? (void)inflateEnd(&u->gz) : (void)BZ2_bzDecompressEnd(&u->bz);
}

int dl__unpack(int in, const char *compression, uint64_t expect, uint64_t most, int fd, const char *what,
               const char *name, uint64_t *size) {
  enum { CHUNK = 1 << 17 };
  int codec = codec_of(compression);
  if (codec < 0)
    return dl__fail(DL_EUNSUPPORTED, "%s %s: compression %s is not read", what, name, compression);
  const char *label = codecs[codec].name;
  unpacker u;
  uint8_t *src = malloc(CHUNK), *dst = malloc(CHUNK);
  int rc = src && dst && start(&u, codec) == 0 ? 0 : dl__fail(-ENOMEM, "out of memory");
  uint64_t at = 0, made = 0;
  while (!rc) {
    int64_t got = dl__pread_full(in, src, CHUNK, at);
    if (got <= 0) {
      if (got < 0)
        rc = dl__fail((int)got, "%s %s: %s", what, name, strerror((int)-got));
      break;
    }
    at += (uint64_t)got;
    size_t pos = 0;
    bool full; /* the output filled: the codec may hold more of it */
    do {
      size_t used = 0, out = 0;
      const char *why = NULL;
      if (codecs[codec].step(&u, src + pos, (size_t)got - pos, &used, dst, CHUNK, &out, &why))
        rc = dl__fail(DL_ECORRUPT, "%s %s: %s: %s", what, name, label, why);
      else if (expect && made + out > expect)
        rc = dl__fail(DL_ECORRUPT, "%s %s: decompresses to more than the %llu bytes its index gives", what, name,
                      (unsigned long long)expect);
      else if (!expect && made + out > most)
        rc = dl__fail(DL_ELIMIT, "%s %s: decompresses to more than %llu bytes, the room for its uncompressed copy",
                      what, name, (unsigned long long)most);
      else if (out && pwrite(fd, dst, out, (off_t)made) != (ssize_t)out)
        rc = dl__fail(-(errno ? errno : EIO), "%s %s: writing its uncompressed copy: %s", what, name,
                      strerror(errno ? errno : EIO));
      pos += used;
      made += rc ? 0 : out; /* what was written */
      full = out == CHUNK;
      if (!rc && !used && !out && pos < (size_t)got) /* data after the end it cannot take */
        rc = dl__fail(DL_ECORRUPT, "%s %s: %s: data it cannot read after byte %llu", what, name, label,
                      (unsigned long long)(at - (uint64_t)got + pos));
    } while (!rc && (pos < (size_t)got || full));
  }
  if (!rc && u.in_stream)
    rc = dl__fail(DL_ECORRUPT, "%s %s: its %s data ends early (truncated?)", what, name, label);
  if (!rc && expect && made != expect)
    rc = dl__fail(DL_ECORRUPT, "%s %s: decompresses to %llu bytes, its index gives %llu", what, name,
                  (unsigned long long)made, (unsigned long long)expect);
  if (src && dst)
    finish(&u, codec);
  if (size)
    *size = made;
  free(src);
  free(dst);
  return rc;
}

/* One zstd frame in memory, as a .jpg.zst, .npy.zst or zstd field holds it. */
int dl__zstd_inflate(void **ctx, const uint8_t *src, size_t n, size_t limit, dl__buf *out, size_t *len,
                     dl__err *e) {
  if (!*ctx && !(*ctx = ZSTD_createDCtx()))
    return dl__err_set(e, -ENOMEM, "out of memory");
  unsigned long long content = ZSTD_getFrameContentSize(src, n);
  if (content == ZSTD_CONTENTSIZE_ERROR)
    return dl__err_set(e, DL_ECORRUPT, "zstd: not a zstd frame");
  if (content != ZSTD_CONTENTSIZE_UNKNOWN && content > limit)
    return dl__err_set(e, DL_ELIMIT, "zstd frame holds %llu bytes, above the limit of %zu", content, limit);
  if (content != ZSTD_CONTENTSIZE_UNKNOWN) {
    size_t cap = (size_t)content + 1;
    if (dl__buf_reserve(out, cap))
      return dl__err_set(e, -ENOMEM, "out of memory for %zu decompressed bytes", cap);
    size_t got = ZSTD_decompressDCtx(*ctx, out->p, cap, src, n);
    if (ZSTD_isError(got))
      return dl__err_set(e, ZSTD_getErrorCode(got) == ZSTD_error_dstSize_tooSmall ? DL_ELIMIT : DL_ECORRUPT,
                         "zstd: %s", ZSTD_getErrorName(got));
    *len = got;
    return 0;
  }
  /* A frame that does not say its size: the output grows as it comes, up to the limit, rather than
   * reserving the whole limit for a few kilobytes. */
  ZSTD_DCtx_reset(*ctx, ZSTD_reset_session_only);
  size_t cap = n < (limit >> 3) ? n * 8 : limit;
  cap = cap < 65536 ? (limit < 65536 ? limit : 65536) : cap;
  ZSTD_inBuffer in = {src, n, 0};
  size_t pos = 0;
  for (;;) {
    if (dl__buf_reserve(out, cap + 1))
      return dl__err_set(e, -ENOMEM, "out of memory for %zu decompressed bytes", cap + 1);
    ZSTD_outBuffer o = {out->p, cap + 1, pos};
    size_t rc = ZSTD_decompressStream(*ctx, &o, &in);
    pos = o.pos;
    if (ZSTD_isError(rc))
      return dl__err_set(e, DL_ECORRUPT, "zstd: %s", ZSTD_getErrorName(rc));
    if (pos > limit)
      return dl__err_set(e, DL_ELIMIT, "zstd frame holds more than the limit of %zu bytes", limit);
    if (rc == 0)
      break; /* the frame is complete */
    if (in.pos == in.size && pos < o.size)
      return dl__err_set(e, DL_ECORRUPT, "zstd: the frame is cut short");
    if (pos == o.size)
      cap = cap > limit / 2 ? limit : cap * 2;
  }
  *len = pos;
  return 0;
}
