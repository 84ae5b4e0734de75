/*
 * Reading JSON from untrusted bytes without a tree: the next string (escapes undone), past any
 * value, and the members of objects and elements of arrays one at a time. The Hub's listings
 * (remote/hub.c) and MosaicML Streaming's index.json (mds.c) are read with it.
 */
#include "util/util.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

const char *dl__json_space(const char *p, const char *end) {
  while (p < end && strchr(" \t\r\n", *p))
    p++;
  return p;
}

static int hex_value(const char *p) {
  int v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0)
      return -1;
    v = v * 16 + d;
  }
  return v;
}

/* CP as UTF-8 into OUT: its length. */
static size_t utf8(unsigned cp, uint8_t *out) {
  if (cp < 0x80) {
    out[0] = (uint8_t)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (uint8_t)(0xC0 | cp >> 6), out[1] = (uint8_t)(0x80 | (cp & 63));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (uint8_t)(0xE0 | cp >> 12), out[1] = (uint8_t)(0x80 | (cp >> 6 & 63));
    out[2] = (uint8_t)(0x80 | (cp & 63));
    return 3;
  }
  out[0] = (uint8_t)(0xF0 | cp >> 18), out[1] = (uint8_t)(0x80 | (cp >> 12 & 63));
  out[2] = (uint8_t)(0x80 | (cp >> 6 & 63)), out[3] = (uint8_t)(0x80 | (cp & 63));
  return 4;
}

/* The JSON string whose opening quote is at P into OUT (escapes undone; "" when it does not fit
 * in CAP); the position after its closing quote, or NULL when malformed. */
const char *dl__json_string(const char *p, const char *end, char *out, size_t cap) {
  static const char simple[] = "\"\\/bfnrt", meant[] = "\"\\/\b\f\n\r\t";
  size_t n = 0;
  bool fits = true;
  for (p++; p < end && *p != '"'; p++) {
    uint8_t enc[4];
    size_t k = 1;
    enc[0] = (uint8_t)*p;
    if (*p == '\\') {
      const char *at = ++p < end && *p ? strchr(simple, *p) : NULL;
      if (at) {
        enc[0] = (uint8_t)meant[at - simple];
      } else {
        if (p >= end || *p != 'u' || end - p < 5 || hex_value(p + 1) < 0)
          return NULL;
        unsigned cp = (unsigned)hex_value(p + 1);
        p += 4;
        int low = end - p >= 7 && p[1] == '\\' && p[2] == 'u' ? hex_value(p + 3) : -1;
        if (cp >= 0xD800 && cp < 0xDC00 && low >= 0xDC00 && low < 0xE000) { /* a surrogate pair */
          cp = 0x10000 + ((cp - 0xD800) << 10) + (unsigned)(low - 0xDC00);
          p += 6;
        }
        k = utf8(cp, enc);
      }
    }
    fits = fits && n + k < cap;
    for (size_t i = 0; fits && i < k; i++)
      out[n++] = (char)enc[i];
  }
  if (p >= end || !cap)
    return NULL;
  out[fits ? n : 0] = 0;
  return p + 1;
}

/* Past the JSON value at P (any kind: its strings may hold brackets); NULL when malformed. */
const char *dl__json_skip(const char *p, const char *end) {
  int depth = 0;
  char scratch[1];
  do {
    p = dl__json_space(p, end);
    if (p >= end)
      return NULL;
    if (*p == '"') {
      if (!(p = dl__json_string(p, end, scratch, sizeof scratch)))
        return NULL;
      continue;
    }
    if (*p == '{' || *p == '[')
      depth++;
    else if (*p == '}' || *p == ']')
      depth--;
    else if (!depth && (*p == ',' || *p == ':'))
      return NULL;
    p++;
    /* A number or literal ends where a separator or closing bracket starts. */
    while (!depth && p < end && !strchr(",}] \t\r\n", *p))
      p++;
  } while (depth > 0);
  return depth == 0 ? p : NULL;
}

/* After an object's '{' or a member's value at *P: the next member's KEY, with *P at its value
 * (1: *P is before END), the object's end with *P past it (0), or malformed (-1). */
int dl__json_member(const char **p, const char *end, char *key, size_t cap) {
  const char *q = dl__json_space(*p, end);
  if (q < end && *q == ',')
    q = dl__json_space(q + 1, end);
  if (q < end && *q == '}') {
    *p = q + 1;
    return 0;
  }
  if (q >= end || *q != '"' || !(q = dl__json_string(q, end, key, cap)))
    return -1;
  q = dl__json_space(q, end);
  if (q >= end || *q != ':' || (q = dl__json_space(q + 1, end)) >= end)
    return -1;
  *p = q; /* a value starts here: *P may be read */
  return 1;
}

/* After an array's '[' or an element at *P: the next element, with *P at it (1: *P is before
 * END), the array's end with *P past it (0), or malformed (-1). */
int dl__json_element(const char **p, const char *end) {
  const char *q = dl__json_space(*p, end);
  if (q < end && *q == ',')
    q = dl__json_space(q + 1, end);
  if (q >= end)
    return -1;
  if (*q == ']') {
    *p = q + 1;
    return 0;
  }
  *p = q;
  return 1;
}

/* The unsigned integer at P (no sign, fraction or exponent) into *V: the position after it, or
 * NULL. */
const char *dl__json_uint(const char *p, const char *end, uint64_t *v) {
  uint64_t x = 0;
  const char *q = p;
  for (; q < end && *q >= '0' && *q <= '9'; q++)
    if (!dl__mul_ok(x, 10, &x) || __builtin_add_overflow(x, (uint64_t)(*q - '0'), &x))
      return NULL;
  if (q == p || (q < end && strchr(".eE", *q)))
    return NULL;
  *v = x;
  return q;
}

/* Whether the value at P is the literal null (then *AFTER is past it). */
bool dl__json_null(const char *p, const char *end, const char **after) {
  if (end - p < 4 || memcmp(p, "null", 4))
    return false;
  *after = p + 4;
  return true;
}
