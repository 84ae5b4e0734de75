/*
 * NumPy .npy payloads (format versions 1-3): the header's dtype descr, C order and shape. Only
 * little-endian or byte-sized bool/int/uint/float dtypes are accepted; the payload (TOTAL bytes, of which the
 * first N are at P) must hold the whole shape.
 */
#include "source/source.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

int dl__dtype_parse(const char *descr, DLDataType *t) {
  char order = descr[0], kind = descr[1];
  if (order != '<' && order != '|' && order != '=')
    return -1;
  int bytes = 0;
  for (const char *p = descr + 2; *p; p++) {
    if (!isdigit((unsigned char)*p) || bytes > 64)
      return -1;
    bytes = bytes * 10 + (*p - '0');
  }
  if (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8)
    return -1;
  if (order == '|' && bytes != 1)
    return -1;
  switch (kind) {
  case 'u': t->code = kDLUInt; break;
  case 'i': t->code = kDLInt; break;
  case 'f':
    if (bytes == 1)
      return -1;
    t->code = kDLFloat;
    break;
  case 'b': /* numpy bool: one byte of 0 or 1, delivered as uint8 */
    if (bytes != 1)
      return -1;
    t->code = kDLUInt;
    break;
  default: return -1;
  }
  t->bits = (uint8_t)(bytes * 8);
  t->lanes = 1;
  return 0;
}

/* Finds 'key': in the header dict and returns a pointer just after the colon. */
static const char *find_key(const char *h, size_t n, const char *key) {
  size_t k = strlen(key);
  for (size_t i = 0; i + k + 2 < n; i++)
    if ((h[i] == '\'' || h[i] == '"') && !memcmp(h + i + 1, key, k) && h[i + 1 + k] == h[i]) {
      const char *p = h + i + k + 2;
      while (p < h + n && (*p == ' ' || *p == ':'))
        p++;
      return p < h + n ? p : NULL;
    }
  return NULL;
}

int dl__npy_parse(const uint8_t *p, size_t n, size_t total, dl__npy *out, dl__err *e) {
  if (n < 10 || memcmp(p, "\x93NUMPY", 6))
    return dl__err_set(e, DL_ECORRUPT, "not a .npy payload (magic missing)");
  uint8_t major = p[6];
  size_t hlen, start;
  if (major == 1) {
    hlen = (size_t)p[8] | (size_t)p[9] << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (n < 12)
      return dl__err_set(e, DL_ECORRUPT, ".npy header cut short");
    hlen = (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
    start = 12;
  } else {
    return dl__err_set(e, DL_EUNSUPPORTED, ".npy format version %u", major);
  }
  if (hlen > 65536 || start + hlen > n)
    return dl__err_set(e, DL_ECORRUPT, ".npy header of %zu bytes runs past the data", hlen);
  const char *h = (const char *)p + start;
  const char *d = find_key(h, hlen, "descr"), *f = find_key(h, hlen, "fortran_order"),
             *s = find_key(h, hlen, "shape");
  if (!d || !f || !s)
    return dl__err_set(e, DL_ECORRUPT, ".npy header lacks descr, fortran_order or shape");
  char descr[16];
  size_t dl = 0;
  if (*d != '\'' && *d != '"')
    return dl__err_set(e, DL_EUNSUPPORTED, ".npy structured dtype");
  for (d++; d < h + hlen && *d != '\'' && *d != '"' && dl < sizeof descr - 1; d++)
    descr[dl++] = *d;
  descr[dl] = 0;
  if (dl__dtype_parse(descr, &out->dtype))
    return dl__err_set(e, DL_EUNSUPPORTED, ".npy dtype '%s' (little-endian bool/int/uint/float only)", descr);
  if (h + hlen - f >= 4 && !memcmp(f, "True", 4)) /* the header may end right after the key */
    return dl__err_set(e, DL_EUNSUPPORTED, ".npy in Fortran order");
  if (*s != '(')
    return dl__err_set(e, DL_ECORRUPT, ".npy shape is not a tuple");
  out->ndim = 0;
  uint64_t count = 1;
  const char *q = s + 1;
  while (q < h + hlen && *q != ')') {
    while (q < h + hlen && (*q == ' ' || *q == ','))
      q++;
    if (q < h + hlen && *q == ')')
      break;
    uint64_t v = 0;
    int digits = 0;
    for (; q < h + hlen && isdigit((unsigned char)*q); q++, digits++) {
      if (v > (1ull << 40))
        return dl__err_set(e, DL_ELIMIT, ".npy dimension too large");
      v = v * 10 + (uint64_t)(*q - '0');
    }
    if (!digits || out->ndim == DL__NPY_MAX_DIMS)
      return dl__err_set(e, DL_ECORRUPT, ".npy shape is malformed or has over %d dimensions", DL__NPY_MAX_DIMS);
    out->shape[out->ndim++] = (int64_t)v;
    if (!dl__mul_ok(count, v, &count) || count > (1ull << 40))
      return dl__err_set(e, DL_ELIMIT, ".npy array too large");
  }
  out->data = p + start + hlen;
  out->bytes = count * (out->dtype.bits / 8);
  if (out->bytes > total - start - hlen)
    return dl__err_set(e, DL_ECORRUPT, ".npy data ends early: %llu bytes for the shape, %zu present",
                       (unsigned long long)out->bytes, total - start - hlen);
  return 0;
}
