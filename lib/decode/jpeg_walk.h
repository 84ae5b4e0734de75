/*
 * The walk of a baseline JPEG's entropy-coded data, shared by the CPU (decode/jpeg_rows.c) and the
 * GPU (gpu/walk.cu) so that the CPU's tests cover the GPU's reading too: the scan from the file's
 * markers, its Huffman tables as lookups, its MCUs read as libjpeg's jdhuff.c reads them. Private
 * to those two (short names, static functions); nothing here allocates or logs.
 */
#ifndef RINGFEED_DECODE_JPEG_WALK_H
#define RINGFEED_DECODE_JPEG_WALK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "decode/jpeg_huff.h"

/* MAX_DC: a DC predictor beyond it is damage (8-bit samples' DCs stay within). */
enum { MAX_DC = 2047, WALK_MAX_BLOCKS = 10 /* libjpeg's D_MAX_BLOCKS_IN_MCU */ };

/* Eight bytes as one big-endian word. */
WALK_FN uint64_t load_be64(const uint8_t *p) {
#ifdef __CUDA_ARCH__
  uint64_t w = 0;
  for (int i = 0; i < 8; i++)
    w = w << 8 | p[i];
  return w;
#else
  uint64_t w;
  memcpy(&w, p, 8);
  return __builtin_bswap64(w);
#endif
}

/* Where an MCU row's codes begin. */
typedef struct row_start {
  uint32_t bit;  /* from the first byte of entropy-coded data, stuffed bytes counted */
  int16_t dc[3]; /* each component's DC predictor there */
} row_start;

/* The scan as libjpeg has read it: which component each block of an MCU belongs to, and tables. */
typedef struct scan {
  int blocks, comps;
  uint8_t comp[WALK_MAX_BLOCKS];
  uint32_t mcus_per_row, mcu_rows, rows_per_imcu;
  unsigned restart; /* the restart interval in MCUs, 0 for none (only a whole walk takes them) */
  bool shared;      /* every block read with the same tables: which block a code is in changes no code */
  huff dc[3], ac[3];
} scan;

WALK_FN unsigned be16(const uint8_t *p) {
  return (unsigned)p[0] << 8 | p[1];
}

/* Whether DHT tables A and B (code counts by length at [1..16], the symbols after) are the same. */
WALK_FN bool table_same(const uint8_t *a, const uint8_t *b) {
  unsigned n = 0;
  for (int l = 1; l <= 16; l++) {
    if (a[l] != b[l])
      return false;
    n += a[l];
  }
  for (unsigned j = 0; a != b && j < n; j++)
    if (a[17 + j] != b[17 + j])
      return false;
  return true;
}

/* The scan from a file's own markers, for a file libjpeg has not read: a baseline 8-bit frame of
 * up to three components, all in its one scan, with its tables, no restart interval. ENTROPY_AT:
 * where the scan's data begins. */
WALK_FN int scan_parse(const uint8_t *p, size_t n, scan *s, size_t *entropy_at) {
  /* Each DHT table where the file holds it: code counts by length at [1..16], the symbols after
   * them (pointers, not copies: a device thread parses too, and has little stack). */
  const uint8_t *tbl[2][4] = {{NULL}};
  unsigned width = 0, height = 0, nf = 0;
  uint8_t id[3], hs[3], vs[3];
  if (n < 4 || p[0] != 0xFF || p[1] != 0xD8)
    return -1;
  s->restart = 0;
  for (size_t i = 2; i + 4 <= n;) {
    uint8_t m = p[i + 1];
    if (p[i] != 0xFF || m == 0x01 || m == 0xD8 || m == 0xD9 || (m >= 0xD0 && m <= 0xD7))
      return -1;
    if (m == 0xFF) {
      i++;
      continue;
    }
    size_t len = be16(p + i + 2), sl = len - 2;
    if (len < 2 || i + 2 + len > n)
      return -1;
    const uint8_t *seg = p + i + 4;
    if (m == 0xC0 || m == 0xC1) {
      if (nf || sl < 6 || seg[0] != 8 || !(nf = seg[5]) || nf > 3 || sl != 6 + 3 * (size_t)nf)
        return -1;
      height = be16(seg + 1), width = be16(seg + 3);
      for (unsigned c = 0; c < nf; c++) {
        id[c] = seg[6 + 3 * c], hs[c] = seg[7 + 3 * c] >> 4, vs[c] = seg[7 + 3 * c] & 15;
        if (hs[c] < 1 || hs[c] > 4 || vs[c] < 1 || vs[c] > 4)
          return -1;
      }
      if (!width || !height)
        return -1;
    } else if (m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
      return -1; /* progressive, lossless, arithmetic-coded: not walked */
    } else if (m == 0xC4) {
      for (size_t k = 0; k < sl;) {
        if (k + 17 > sl || (seg[k] >> 4) > 1 || (seg[k] & 15) > 3)
          return -1;
        size_t count = 0;
        for (int b = 1; b <= 16; b++)
          count += seg[k + (size_t)b];
        if (count > 256 || k + 17 + count > sl)
          return -1;
        tbl[seg[k] >> 4][seg[k] & 15] = seg + k;
        k += 17 + count;
      }
    } else if (m == 0xDD) {
      if (sl != 2)
        return -1;
      s->restart = be16(seg);
    } else if (m == 0xDA) {
      unsigned ns = sl ? seg[0] : 0;
      if (!nf || ns != nf || sl != 4 + 2 * (size_t)ns || seg[1 + 2 * ns] != 0 || seg[2 + 2 * ns] != 63 ||
          seg[3 + 2 * ns] != 0)
        return -1;
      unsigned hmax = 1, vmax = 1, used = 0;
      for (unsigned c = 0; c < nf; c++)
        hmax = hs[c] > hmax ? hs[c] : hmax, vmax = vs[c] > vmax ? vs[c] : vmax;
      s->comps = (int)ns;
      s->blocks = 0;
      s->shared = true;
      for (unsigned k = 0; k < ns; k++) {
        unsigned c = 0, td = seg[2 + 2 * k] >> 4, ta = seg[2 + 2 * k] & 15;
        while (c < nf && id[c] != seg[1 + 2 * k])
          c++;
        if (c == nf || used & 1u << c || td > 3 || ta > 3 || !tbl[0][td] || !tbl[1][ta] ||
            huff_codes(&s->dc[k], tbl[0][td], tbl[0][td] + 17) || huff_codes(&s->ac[k], tbl[1][ta], tbl[1][ta] + 17))
          return -1;
        unsigned td0 = seg[2] >> 4, ta0 = seg[2] & 15; /* the first component's */
        s->shared = s->shared && table_same(tbl[0][td], tbl[0][td0]) && table_same(tbl[1][ta], tbl[1][ta0]);
        used |= 1u << c;
        unsigned b = ns == 1 ? 1 : hs[c] * vs[c]; /* a lone component's MCU is one block */
        if (s->blocks + (int)b > WALK_MAX_BLOCKS)
          return -1;
        while (b--)
          s->comp[s->blocks++] = (uint8_t)k;
      }
      if (ns == 1) { /* libjpeg: the component's size in blocks */
        s->mcus_per_row = (width * hs[0] + hmax - 1) / hmax;
        s->mcus_per_row = (s->mcus_per_row + 7) / 8;
        s->mcu_rows = ((height * vs[0] + vmax - 1) / vmax + 7) / 8;
        s->rows_per_imcu = vs[0];
      } else {
        s->mcus_per_row = (width + 8 * hmax - 1) / (8 * hmax);
        s->mcu_rows = (height + 8 * vmax - 1) / (8 * vmax);
        s->rows_per_imcu = 1;
      }
      *entropy_at = i + 2 + len;
      return 0;
    }
    i += 2 + len;
  }
  return -1;
}

/* ---- walking the entropy-coded data ---- */

typedef struct reader {
  const uint8_t *p; /* the entropy-coded data */
  size_t i, n;      /* the next byte to load */
  uint64_t buf;     /* bits, first one at the top */
  int cnt, fake;    /* bits in buf; of them, zeros past a marker or the end (the last ones) */
} reader;

WALK_FN void fill(reader *r) {
  if (r->cnt > 56)
    return;
  /* Most of the time the next eight bytes hold no 0xFF: as many as fit, at once. */
  if (!r->fake && r->i + 8 <= r->n) {
    uint64_t w = load_be64(r->p + r->i);
    uint64_t x = ~w;
    if (!((x - 0x0101010101010101ull) & ~x & 0x8080808080808080ull)) {
      int take = (64 - r->cnt) / 8;
      r->buf |= (take == 8 ? w : w & ~(~0ull >> (8 * take))) >> r->cnt;
      r->cnt += 8 * take;
      r->i += (size_t)take;
      return;
    }
  }
  while (r->cnt <= 56) {
    unsigned c = 0;
    if (r->fake || r->i >= r->n)
      r->fake += 8;
    else if ((c = r->p[r->i]) != 0xFF)
      r->i++;
    else if (r->i + 1 < r->n && r->p[r->i + 1] == 0)
      r->i += 2;
    else
      c = 0, r->fake += 8;
    r->buf |= (uint64_t)c << (56 - r->cnt);
    r->cnt += 8;
  }
}

WALK_FN unsigned peek(const reader *r, int k) {
  return (unsigned)(r->buf >> (64 - k));
}
WALK_FN void drop(reader *r, int k) {
  r->buf <<= k;
  r->cnt -= k;
}

WALK_FN int symbol(reader *r, const huff *h) {
  unsigned e = h->fast[peek(r, LOOK)];
  if (e) {
    drop(r, (int)(e >> 8));
    return (int)(e & 0xFF);
  }
  for (int l = LOOK + 1; l <= 16; l++) {
    int32_t c = (int32_t)peek(r, l);
    if (c <= h->maxcode[l]) {
      int32_t k = h->valoff[l] + c;
      if (k < 0 || k >= h->codes) /* never, with every shorter code in FAST */
        return -1;
      drop(r, l);
      return h->val[k];
    }
  }
  return -1; /* libjpeg warns of a bad Huffman code */
}

WALK_FN void reader_at(reader *r, const uint8_t *p, size_t n, uint32_t bit) {
  r->p = p, r->i = bit >> 3, r->n = n, r->buf = 0, r->cnt = r->fake = 0;
  fill(r);
  drop(r, (int)(bit & 7));
}

/* The position of the next bit to read. */
WALK_FN uint32_t tell(const reader *r) {
  int unread = r->cnt - r->fake, part = unread % 8;
  size_t j = r->i;
  for (int k = 0; k < unread / 8 + (part != 0); k++)
    j -= j >= 2 && r->p[j - 1] == 0 && r->p[j - 2] == 0xFF ? 2 : 1;
  return (uint32_t)(j * 8 + (part ? 8 - part : 0));
}

/* One MCU, its coefficients read past as libjpeg reads them (jdhuff.c), its DCs followed. */
WALK_FN int walk_mcu(reader *r, const scan *s, int32_t *dc) {
  for (int b = 0; b < s->blocks; b++) {
    int c = s->comp[b];
    fill(r);
    int t = symbol(r, &s->dc[c]);
    if (t < 0 || t > 11)
      return -1;
    if (t) {
      int v = (int)peek(r, t);
      drop(r, t);
      if (v < 1 << (t - 1))
        v -= (1 << t) - 1;
      dc[c] += v;
      if (dc[c] > MAX_DC || dc[c] < -MAX_DC)
        return -1;
    }
    const huff *ac = &s->ac[c];
    for (int k = 1; k < 64;) {
      fill(r);
      /* After a fill at least 57 bits are there: five codes with their bits (AC_LOOK each at most)
       * read from a copy of the buffer held in a register, the reader written back once. */
      uint64_t buf = r->buf;
      int used = 0, move = 1;
      unsigned e = 0;
      for (int j = 0; j < 5 && k < 64; j++) {
        e = ac->skip[buf >> (64 - AC_LOOK)];
        if (!e)
          break;
        buf <<= e & 31;
        used += (int)(e & 31);
        if (!(move = (int)(e >> 5)))
          break;
        k += move;
      }
      r->buf = buf;
      r->cnt -= used;
      if (!move)
        break; /* the block's end */
      if (e || k >= 64)
        continue;
      if (r->cnt < 32)
        fill(r);
      int a = symbol(r, ac);
      if (a < 0)
        return -1;
      int run = a >> 4, size = a & 15;
      if (size) {
        k += run + 1;
        drop(r, size);
      } else if (run == 15) {
        k += 16;
      } else {
        break;
      }
    }
  }
  return r->cnt < r->fake ? -1 : 0; /* read past the data */
}

/* At a restart (jdhuff.c process_restart), libjpeg drops the bits left and reads the next marker,
 * warning of bytes before it; one other than the restart marker it expects is an error here
 * (it resynchronises, skipping data). The DC predictors start again from 0. */
WALK_FN int restart(reader *r, int32_t *dc, unsigned count) {
  size_t j = (tell(r) + 7) / 8;
  for (;; j += 2) {
    while (j < r->n && r->p[j] != 0xFF)
      j++;
    while (j + 1 < r->n && r->p[j + 1] == 0xFF)
      j++;
    if (j + 1 >= r->n)
      return -1;
    if (r->p[j + 1] != 0)
      break;
  }
  if (r->p[j + 1] != 0xD0 + (count & 7))
    return -1;
  reader_at(r, r->p, r->n, (uint32_t)(j + 2) * 8);
  dc[0] = dc[1] = dc[2] = 0;
  return 0;
}

/* One row of MCUs from R, *MCU counting them from the scan's start for its restart markers. */
WALK_FN int walk_row(reader *r, const scan *s, int32_t *dc, uint64_t *mcu) {
  for (uint32_t m = 0; m < s->mcus_per_row; m++, ++*mcu)
    if ((s->restart && *mcu && *mcu % s->restart == 0 && restart(r, dc, (unsigned)(*mcu / s->restart - 1))) ||
        walk_mcu(r, s, dc))
      return -1;
  return 0;
}

/* The lookups of S's tables, which a walk reads codes with. */
WALK_FN void scan_lookups(scan *s) {
  for (int c = 0; c < s->comps; c++) {
    huff_lookups(&s->dc[c], false);
    huff_lookups(&s->ac[c], true);
  }
}

/* The scan of the JPEG P (LEN bytes) from its markers, ready to walk (scan_parse, then its
 * lookups); -1 when it is not a file for the walker. */
WALK_FN int scan_open(const uint8_t *p, size_t len, scan *s, size_t *entropy_at) {
  if (len > UINT32_MAX / 8 || scan_parse(p, len, s, entropy_at))
    return -1;
  scan_lookups(s);
  return 0;
}

/* Whether the JPEG P (LEN bytes) is of one baseline scan the walker reads (scan_parse) whose codes
 * read through every MCU: 1 clean, 0 not, -1 not a file for the walker. S: room for its tables. */
WALK_FN int walk_whole(const uint8_t *p, size_t len, scan *s) {
  size_t at;
  if (scan_open(p, len, s, &at))
    return -1;
  int32_t dc[3] = {0, 0, 0};
  uint64_t mcu = 0;
  reader r;
  reader_at(&r, p + at, len - at, 0);
  for (uint32_t y = 0; y < s->mcu_rows; y++)
    if (walk_row(&r, s, dc, &mcu))
      return 0;
  return 1;
}

#endif
