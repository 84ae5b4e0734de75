/*
 * A JPEG's Huffman tables as the walker (decode/jpeg_walk.h) reads codes with them and as
 * decode/jpeg_rows.c writes stand-in blocks with them; for the CPU and the GPU alike.
 */
#ifndef RINGFEED_DECODE_JPEG_HUFF_H
#define RINGFEED_DECODE_JPEG_HUFF_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define WALK_FN static inline __host__ __device__
#else
#define WALK_FN static inline
#endif

/* The bits a lookup reads at once: a code alone (LOOK), an AC code with its coefficient's bits. */
enum { LOOK = 9, AC_LOOK = 11 };

typedef struct huff {
  uint16_t fast[1 << LOOK]; /* length << 8 | symbol of the code the next LOOK bits begin; 0: longer */
  int32_t maxcode[17];      /* the standard's decoding procedure (F.16) for the longer ones */
  int32_t valoff[17];
  uint8_t val[256];    /* the symbols in the order of their codes, */
  uint16_t kcode[256]; /* those codes */
  uint8_t klen[256];   /* and their lengths (a symbol may have several) */
  uint16_t code[256];  /* each symbol's code, for writing */
  uint8_t size[256];   /* its length; 0 where the table has none */
  /* An AC code and its coefficient's bits in the next AC_LOOK bits: how many bits they take, and
   * (above them) how far they move along the block, 0 at its end; 0 when they do not fit. */
  uint16_t skip[1 << AC_LOOK];
  int codes;
} huff;

/* A table's codes, as libjpeg assigns them (the standard's Annex C). */
WALK_FN int huff_codes(huff *h, const uint8_t *bits, const uint8_t *huffval) {
  if (!bits)
    return -1;
  memset(h->size, 0, sizeof h->size);
  int k = 0;
  int32_t code = 0;
  for (int l = 1; l <= 16; l++) {
    int count = bits[l];
    if (k + count > 256 || code + count >= 1 << l) /* libjpeg refuses these tables too */
      return -1;
    h->valoff[l] = k - code;
    for (int i = 0; i < count; i++, k++, code++) {
      uint8_t sym = huffval[k];
      h->val[k] = sym;
      h->kcode[k] = (uint16_t)code;
      h->klen[k] = (uint8_t)l;
      h->code[sym] = (uint16_t)code;
      h->size[sym] = (uint8_t)l;
    }
    h->maxcode[l] = count ? code - 1 : -1;
    code <<= 1;
  }
  h->codes = k;
  return 0;
}

/* The lookups a walk reads codes with (only a walk needs them). */
WALK_FN void huff_lookups(huff *h, bool ac) {
  memset(h->fast, 0, sizeof h->fast);
  memset(h->skip, 0, sizeof h->skip);
  for (int k = 0; k < h->codes; k++) {
    int sym = h->val[k], l = h->klen[k], code = h->kcode[k];
    if (l <= LOOK)
      for (int f = code << (LOOK - l); f < (code + 1) << (LOOK - l); f++)
        h->fast[f] = (uint16_t)(l << 8 | sym);
    int run = sym >> 4, size = sym & 15, bits = l + size;
    if (!ac || bits > AC_LOOK)
      continue;
    int move = size ? run + 1 : run == 15 ? 16 : 0; /* as jdhuff.c reads a block */
    int at = code << (AC_LOOK - l);
    for (int f = at; f < at + (1 << (AC_LOOK - l)); f++)
      h->skip[f] = (uint16_t)(move << 5 | bits);
  }
}

#endif
