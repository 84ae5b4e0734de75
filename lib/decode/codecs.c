/*
 * The image codecs' table, indexed by DL__CODEC_* (its rows are defined beside each decoder), and
 * what is asked of it: a codec by its bytes, by a name's extension, by its number in ringfeed
 * shards, by MosaicML Streaming's encoding, and the lists that messages name.
 */
#include "decode/decode.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#define DL__CODEC_ROW(NAME, name, id) [id] = &dl__##name##_codec,
static const dl__codec *const codecs[DL__MAX_CODECS] = {DL__CODECS(DL__CODEC_ROW)};
#undef DL__CODEC_ROW

#define DL__CODEC_CHECK(NAME, name, id) _Static_assert(id > 0 && id < DL__MAX_CODECS && id != DL__CODEC_OTHER, #NAME);
DL__CODECS(DL__CODEC_CHECK)
#undef DL__CODEC_CHECK

const dl__codec *dl__codec_of(int id) { return id > 0 && id < DL__MAX_CODECS ? codecs[id] : NULL; }

int dl__sniff_codec(const uint8_t *p, size_t n) {
  for (int i = 0; i < DL__MAX_CODECS; i++)
    if (codecs[i] && codecs[i]->sniff && codecs[i]->sniff(p, n))
      return i;
  return DL__CODEC_OTHER;
}

/* Whether EXT (from the dot, to the end of the name) is one of EXTS (".jpg.jpeg"), any case. */
static bool ext_in(const char *ext, const char *exts) {
  size_t n = strlen(ext);
  for (const char *p = exts; *p;) {
    const char *next = strchr(p + 1, '.');
    size_t len = next ? (size_t)(next - p) : strlen(p);
    if (len == n && !strncasecmp(p, ext, n))
      return true;
    p += len;
  }
  return false;
}

int dl__codec_of_ext(const char *name) {
  const char *dot = strrchr(name, '.');
  char ext[32] = ".";
  snprintf(ext + 1, sizeof ext - 1, "%s", dot ? dot + 1 : name); /* a bare "jpg" names one too */
  for (int i = 0; i < DL__MAX_CODECS; i++)
    if (codecs[i] && ext_in(ext, codecs[i]->exts))
      return i;
  return DL__CODEC_NONE;
}

const dl__codec *dl__codec_of_rfs(int rfs) {
  for (int i = 0; i < DL__MAX_CODECS; i++)
    if (codecs[i] && codecs[i]->rfs >= 0 && codecs[i]->rfs == rfs)
      return codecs[i];
  return NULL;
}

const dl__codec *dl__codec_of_mds(const char *enc) {
  for (int i = 0; i < DL__MAX_CODECS; i++) {
    const dl__codec *c = codecs[i];
    size_t n = c && c->mds ? strlen(c->mds) : 0;
    if (n && !strncmp(enc, c->mds, n) && (!enc[n] || (c->mds_quality && enc[n] == ':')))
      return c;
  }
  return NULL;
}

/* The N items ITEM(i) as "a, b or c" (SEP NULL) or "a/b/c" into BUF. */
static const char *join(char *buf, size_t cap, const char *sep, int n, const char *(*item)(int i, char *tmp)) {
  size_t at = 0;
  buf[0] = 0;
  for (int i = 0; i < n && at < cap; i++) {
    char tmp[32];
    const char *between = i == 0 ? "" : sep ? sep : i == n - 1 ? " or " : ", ";
    int w = snprintf(buf + at, cap - at, "%s%s", between, item(i, tmp));
    at += w > 0 ? (size_t)w : 0;
  }
  return buf;
}

/* The sniffable codecs, and each extension of every codec, in the table's order. */
static const dl__codec *sniffable(int k) {
  for (int i = 0; i < DL__MAX_CODECS; i++)
    if (codecs[i] && codecs[i]->sniff && k-- == 0)
      return codecs[i];
  return NULL;
}
static const char *label_of(int k, char *tmp) { (void)tmp; return sniffable(k)->label; }
static const char *ext_of(int k, char *tmp) {
  for (int i = 0; i < DL__MAX_CODECS; i++)
    for (const char *p = codecs[i] ? codecs[i]->exts : ""; *p;) {
      const char *next = strchr(p + 1, '.');
      size_t len = next ? (size_t)(next - p) : strlen(p);
      if (k-- == 0) {
        snprintf(tmp, 32, "%.*s", (int)len, p);
        return tmp;
      }
      p += len;
    }
  return "";
}

const char *dl__codec_labels(char *buf, size_t cap) {
  int n = 0;
  while (sniffable(n))
    n++;
  return join(buf, cap, NULL, n, label_of);
}

const char *dl__codec_exts(char *buf, size_t cap, const char *sep) {
  int n = 0;
  for (int i = 0; i < DL__MAX_CODECS; i++)
    for (const char *p = codecs[i] ? codecs[i]->exts : ""; *p; n++) {
      const char *next = strchr(p + 1, '.');
      p += next ? (size_t)(next - p) : strlen(p);
    }
  return join(buf, cap, sep, n, ext_of);
}
