/*
 * Where each row of MCUs begins in a baseline JPEG's entropy-coded data, learnt while a decode
 * walks past the rows above its crop and kept for the sample, so that the sample's next decode
 * (the next epoch's crop) starts at its own crop's rows. Huffman decoding is most of a JPEG
 * decode's time (three quarters on ImageNet-like files), and libjpeg skips rows only by decoding
 * them: a random-resized crop starts on average a sixth of the way down.
 *
 * libjpeg cannot start in the middle of a scan, so it is handed the same scan with the rows above
 * replaced by stand-ins: blocks coding only a DC difference and an end of block, whose differences
 * leave each component's DC predictor where the real data expects it and whose length leaves the
 * real data at the bit it begins at in its byte. The file's own bytes follow, unchanged. Only rows
 * that are never output are replaced, and where the upsampler blends rows, not the one above the
 * first needed: the pixels are those of a full decode, bit for bit.
 *
 * Baseline 8-bit scans of every component without restart markers only. A walk that finds
 * anything odd (a code no table has, data that ends, a DC out of range) gives up, and the decode
 * goes the usual way, which reports what it always has.
 *
 * The GPU path asks the same walker to read a whole scan once a sample, from the file's own
 * markers, restart intervals included (dl__jpeg_rows_clean): nvJPEG's engine decodes a scan whose
 * data ends early without a word, where libjpeg finds it short. Images in several scans
 * (progressive, non-interleaved) are read by libjpeg itself, to their coefficients.
 */
#include "decode/jpeg.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#if JPEG_LIB_VERSION >= 70
#define MIN_DCT_V(d) ((d)->min_DCT_v_scaled_size)
#else
#define MIN_DCT_V(d) ((d)->min_DCT_scaled_size)
#endif

enum { LOOK = 9, AC_LOOK = 11, MAX_DC = 2047, MAX_PAIRS = 4 };

typedef struct row_start {
  uint32_t bit;  /* from the first byte of entropy-coded data, stuffed bytes counted */
  int16_t dc[3]; /* each component's DC predictor there */
} row_start;

typedef struct record {
  uint32_t len, entropy_at, stamp, rows; /* the file it was learnt from, and its MCU rows */
  _Atomic uint32_t known;                /* the starts of rows [0, known) are in at[] */
  _Atomic uint32_t odd;                  /* the first row a walk gave up in (0: none) */
  atomic_flag busy;                      /* held by the one decode that extends it */
  row_start at[];
} record;

struct dl__jpeg_rows {
  _Atomic(record *) *recs;   /* by sample */
  _Atomic uint8_t *verdicts; /* by sample: dl__jpeg_rows_clean's */
  uint32_t n;
  uint64_t budget;
  _Atomic uint64_t bytes, skipped, walked; /* WALKED: verdicts made by reading a scan */
};

dl__jpeg_rows *dl__jpeg_rows_new(uint32_t samples, uint64_t budget) {
  dl__jpeg_rows *s = calloc(1, sizeof *s);
  /* Pages of the table that no sample touches are never given memory. */
  if (s && (!(s->recs = calloc(samples ? samples : 1, sizeof *s->recs)) ||
            !(s->verdicts = calloc(samples ? samples : 1, sizeof *s->verdicts)))) {
    free(s->recs);
    free(s);
    return NULL;
  }
  if (s) {
    s->n = samples;
    s->budget = budget;
  }
  return s;
}

void dl__jpeg_rows_free(dl__jpeg_rows *s) {
  if (!s)
    return;
  for (uint32_t i = 0; i < s->n; i++)
    free(atomic_load_explicit(&s->recs[i], memory_order_relaxed));
  free(s->recs);
  free(s->verdicts);
  free(s);
}

uint64_t dl__jpeg_rows_bytes(const dl__jpeg_rows *s) {
  return s ? atomic_load_explicit(&s->bytes, memory_order_relaxed) : 0;
}

uint64_t dl__jpeg_rows_skipped(const dl__jpeg_rows *s) {
  return s ? atomic_load_explicit(&s->skipped, memory_order_relaxed) : 0;
}

uint64_t dl__jpeg_rows_walked(const dl__jpeg_rows *s) {
  return s ? atomic_load_explicit(&s->walked, memory_order_relaxed) : 0;
}

uint32_t dl__jpeg_rows_verdicts(const dl__jpeg_rows *s, uint8_t *out) {
  for (uint32_t i = 0; s && out && i < s->n; i++)
    out[i] = atomic_load_explicit(&s->verdicts[i], memory_order_relaxed);
  return s ? s->n : 0;
}

uint32_t dl__jpeg_rows_take_verdicts(dl__jpeg_rows *s, const uint8_t *v, uint32_t n) {
  uint32_t taken = 0;
  for (uint32_t i = 0; s && i < n && i < s->n; i++) {
    uint8_t none = DL__VERDICT_UNREAD;
    if (v[i] > DL__VERDICT_UNREAD && v[i] <= DL__VERDICT_DAMAGED &&
        atomic_compare_exchange_strong_explicit(&s->verdicts[i], &none, v[i], memory_order_relaxed,
                                                memory_order_relaxed))
      taken++;
  }
  return taken;
}

/* ---- Huffman tables, for reading and for writing ---- */

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
static int huff_codes(huff *h, const JHUFF_TBL *t) {
  if (!t)
    return -1;
  memset(h->size, 0, sizeof h->size);
  int k = 0;
  int32_t code = 0;
  for (int l = 1; l <= 16; l++) {
    int count = t->bits[l];
    if (k + count > 256 || code + count >= 1 << l) /* libjpeg refuses these tables too */
      return -1;
    h->valoff[l] = k - code;
    for (int i = 0; i < count; i++, k++, code++) {
      uint8_t sym = t->huffval[k];
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
static void huff_lookups(huff *h, bool ac) {
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

/* The scan as libjpeg has read it: which component each block of an MCU belongs to, and tables. */
typedef struct scan {
  int blocks, comps;
  uint8_t comp[D_MAX_BLOCKS_IN_MCU];
  uint32_t mcus_per_row, mcu_rows, rows_per_imcu;
  unsigned restart; /* the restart interval in MCUs, 0 for none (only a whole walk takes them) */
  huff dc[3], ac[3];
} scan;

static bool scan_usable(j_decompress_ptr d) {
  return !d->progressive_mode && !d->arith_code && d->data_precision == 8 && d->restart_interval == 0 &&
         d->comps_in_scan == d->num_components && d->comps_in_scan <= 3 &&
         d->blocks_in_MCU <= D_MAX_BLOCKS_IN_MCU && d->MCU_rows_in_scan > 1;
}

static int scan_read(j_decompress_ptr d, scan *s) {
  s->blocks = d->blocks_in_MCU;
  s->comps = d->comps_in_scan;
  for (int b = 0; b < s->blocks; b++)
    s->comp[b] = (uint8_t)d->MCU_membership[b];
  s->mcus_per_row = d->MCUs_per_row;
  s->mcu_rows = d->MCU_rows_in_scan;
  s->restart = d->restart_interval;
  /* A lone component's MCU is one block: its iMCU row holds v_samp_factor rows of them. */
  s->rows_per_imcu = d->comps_in_scan == 1 ? (uint32_t)d->cur_comp_info[0]->v_samp_factor : 1;
  for (int c = 0; c < s->comps; c++) {
    const jpeg_component_info *ci = d->cur_comp_info[c];
    if (ci->dc_tbl_no < 0 || ci->dc_tbl_no >= NUM_HUFF_TBLS || ci->ac_tbl_no < 0 ||
        ci->ac_tbl_no >= NUM_HUFF_TBLS || huff_codes(&s->dc[c], d->dc_huff_tbl_ptrs[ci->dc_tbl_no]) ||
        huff_codes(&s->ac[c], d->ac_huff_tbl_ptrs[ci->ac_tbl_no]))
      return -1;
  }
  return 0;
}

static unsigned be16(const uint8_t *p) {
  return (unsigned)p[0] << 8 | p[1];
}

/* The scan from a file's own markers, for a file libjpeg has not read: a baseline 8-bit frame of
 * up to three components, all in its one scan, with its tables, no restart interval. ENTROPY_AT:
 * where the scan's data begins. */
static int scan_parse(const uint8_t *p, size_t n, scan *s, size_t *entropy_at) {
  JHUFF_TBL tbl[2][4];
  bool have[2][4] = {{false}};
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
        JHUFF_TBL *t = &tbl[seg[k] >> 4][seg[k] & 15];
        size_t count = 0;
        t->bits[0] = 0;
        for (int b = 1; b <= 16; b++)
          count += t->bits[b] = seg[k + (size_t)b];
        if (count > 256 || k + 17 + count > sl)
          return -1;
        memcpy(t->huffval, seg + k + 17, count);
        have[seg[k] >> 4][seg[k] & 15] = true;
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
      for (unsigned k = 0; k < ns; k++) {
        unsigned c = 0, td = seg[2 + 2 * k] >> 4, ta = seg[2 + 2 * k] & 15;
        while (c < nf && id[c] != seg[1 + 2 * k])
          c++;
        if (c == nf || used & 1u << c || td > 3 || ta > 3 || !have[0][td] || !have[1][ta] ||
            huff_codes(&s->dc[k], &tbl[0][td]) || huff_codes(&s->ac[k], &tbl[1][ta]))
          return -1;
        used |= 1u << c;
        unsigned b = ns == 1 ? 1 : hs[c] * vs[c]; /* a lone component's MCU is one block */
        if (s->blocks + (int)b > D_MAX_BLOCKS_IN_MCU)
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

static inline void fill(reader *r) {
  if (r->cnt > 56)
    return;
  /* Most of the time the next eight bytes hold no 0xFF: as many as fit, at once. */
  if (!r->fake && r->i + 8 <= r->n) {
    uint64_t w;
    memcpy(&w, r->p + r->i, 8);
    w = __builtin_bswap64(w);
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

static inline unsigned peek(const reader *r, int k) {
  return (unsigned)(r->buf >> (64 - k));
}
static inline void drop(reader *r, int k) {
  r->buf <<= k;
  r->cnt -= k;
}

static inline int symbol(reader *r, const huff *h) {
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

static void reader_at(reader *r, const uint8_t *p, size_t n, uint32_t bit) {
  *r = (reader){.p = p, .i = bit >> 3, .n = n};
  fill(r);
  drop(r, (int)(bit & 7));
}

/* The position of the next bit to read. */
static uint32_t tell(const reader *r) {
  int unread = r->cnt - r->fake, part = unread % 8;
  size_t j = r->i;
  for (int k = 0; k < unread / 8 + (part != 0); k++)
    j -= j >= 2 && r->p[j - 1] == 0 && r->p[j - 2] == 0xFF ? 2 : 1;
  return (uint32_t)(j * 8 + (part ? 8 - part : 0));
}

/* One MCU, its coefficients read past as libjpeg reads them (jdhuff.c), its DCs followed. */
static int walk_mcu(reader *r, const scan *s, int32_t *dc) {
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

static uint32_t stamp(const uint8_t *p, size_t len, size_t at) {
  uint32_t h = 2166136261u ^ (uint32_t)len;
  size_t from = at > 64 ? at - 64 : 0, to = len - at > 64 ? at + 64 : len;
  for (size_t i = from; i < to; i++)
    h = (h ^ p[i]) * 16777619u;
  return h;
}

/* The sample's record, made when there is none and the budget allows; NULL when it is not for P. */
static record *record_of(dl__jpeg_rows *st, uint32_t sample, const uint8_t *p, size_t len, size_t at,
                         uint32_t rows) {
  if (sample >= st->n || len > UINT32_MAX / 8)
    return NULL;
  uint32_t h = stamp(p, len, at);
  record *r = atomic_load_explicit(&st->recs[sample], memory_order_acquire);
  if (!r) {
    size_t bytes = sizeof *r + (size_t)rows * sizeof r->at[0];
    if (atomic_fetch_add_explicit(&st->bytes, bytes, memory_order_relaxed) + bytes > st->budget) {
      atomic_fetch_sub_explicit(&st->bytes, bytes, memory_order_relaxed);
      return NULL;
    }
    record *fresh = malloc(bytes);
    if (!fresh) {
      atomic_fetch_sub_explicit(&st->bytes, bytes, memory_order_relaxed);
      return NULL;
    }
    *fresh = (record){.len = (uint32_t)len, .entropy_at = (uint32_t)at, .stamp = h, .rows = rows};
    atomic_flag_clear(&fresh->busy);
    fresh->at[0] = (row_start){0};
    atomic_store_explicit(&fresh->known, 1, memory_order_relaxed);
    atomic_store_explicit(&fresh->odd, 0, memory_order_relaxed);
    r = NULL;
    if (atomic_compare_exchange_strong_explicit(&st->recs[sample], &r, fresh, memory_order_acq_rel,
                                                memory_order_acquire)) {
      r = fresh;
    } else { /* another decode of the sample made one first */
      free(fresh);
      atomic_fetch_sub_explicit(&st->bytes, bytes, memory_order_relaxed);
    }
  }
  return r->len == len && r->entropy_at == at && r->stamp == h && r->rows == rows ? r : NULL;
}

/* At a restart (jdhuff.c process_restart), libjpeg drops the bits left and reads the next marker,
 * warning of bytes before it; one other than the restart marker it expects is an error here
 * (it resynchronises, skipping data). The DC predictors start again from 0. */
static int restart(reader *r, int32_t *dc, unsigned count) {
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

/* Walks MCU rows [FROM, TO) from *AT, where row FROM begins, leaving in *AT where row TO does.
 * With REC, a row the walk gives up in is noted, and with NOTE, the starts passed. */
static int walk_rows(record *rec, bool note, const scan *s, const uint8_t *data, size_t n, uint32_t from,
                     uint32_t to, row_start *at) {
  int32_t dc[3] = {at->dc[0], at->dc[1], at->dc[2]};
  reader r;
  reader_at(&r, data, n, at->bit);
  uint64_t mcu = (uint64_t)from * s->mcus_per_row; /* restarts: only whole walks, from row 0 */
  for (uint32_t y = from; y < to; y++) {
    for (uint32_t m = 0; m < s->mcus_per_row; m++, mcu++)
      if ((s->restart && mcu && mcu % s->restart == 0 && restart(&r, dc, (unsigned)(mcu / s->restart - 1))) ||
          walk_mcu(&r, s, dc)) {
        if (rec)
          atomic_store_explicit(&rec->odd, y + 1, memory_order_relaxed);
        return -1;
      }
    *at = (row_start){tell(&r), {(int16_t)dc[0], (int16_t)dc[1], (int16_t)dc[2]}};
    if (note && y + 1 < rec->rows) {
      rec->at[y + 1] = *at;
      atomic_store_explicit(&rec->known, y + 2, memory_order_release);
    }
  }
  return 0;
}

static void scan_lookups(scan *s) {
  for (int c = 0; c < s->comps; c++) {
    huff_lookups(&s->dc[c], false);
    huff_lookups(&s->ac[c], true);
  }
}

/* Where MCU row ROW begins: from the record, after walking to it from the last row known (and
 * noting the starts passed when no other decode is extending the record); *WALKED rows walked. */
static int find_row(record *rec, scan *s, const uint8_t *data, size_t n, uint32_t row, row_start *out,
                    uint32_t *walked) {
  uint32_t known = atomic_load_explicit(&rec->known, memory_order_acquire);
  *walked = 0;
  if (row < known) {
    *out = rec->at[row];
    return 0;
  }
  uint32_t odd = atomic_load_explicit(&rec->odd, memory_order_relaxed);
  if (odd && row >= odd)
    return -1; /* a walk gave up before: the file is decoded as it is, without walking again */
  scan_lookups(s);
  bool note = !atomic_flag_test_and_set_explicit(&rec->busy, memory_order_acquire);
  if (note)
    known = atomic_load_explicit(&rec->known, memory_order_acquire);
  if (row < known) { /* another decode went past it meanwhile (known was read again: NOTE) */
    atomic_flag_clear_explicit(&rec->busy, memory_order_release);
    *out = rec->at[row];
    return 0;
  }
  *out = rec->at[known - 1];
  *walked = row - (known - 1);
  int ret = walk_rows(rec, note, s, data, n, known - 1, row, out);
  if (note)
    atomic_flag_clear_explicit(&rec->busy, memory_order_release);
  return ret;
}

/* ---- the stand-in rows ---- */

typedef struct writer {
  uint8_t *o;
  size_t n;
  uint64_t acc; /* the low CNT bits are pending */
  int cnt;
} writer;

static inline void put(writer *w, uint64_t code, int len) { /* LEN at most 56 */
  w->acc = w->acc << len | code;
  w->cnt += len;
  while (w->cnt >= 8) {
    uint8_t b = (uint8_t)(w->acc >> (w->cnt - 8));
    w->o[w->n++] = b;
    if (b == 0xFF)
      w->o[w->n++] = 0;
    w->cnt -= 8;
  }
  w->acc &= (1ull << w->cnt) - 1;
}

static int category(int32_t v) {
  int t = 0;
  for (uint32_t a = (uint32_t)(v < 0 ? -v : v); a; a >>= 1)
    t++;
  return t;
}

/* Bits of a block coding DC difference V and nothing else; 0 when a table lacks a code for it. */
static int block_bits(const scan *s, int c, int32_t v) {
  int t = category(v);
  if (t > 11 || !s->dc[c].size[t] || !s->ac[c].size[0])
    return 0;
  return s->dc[c].size[t] + t + s->ac[c].size[0];
}

static void put_block(writer *w, const scan *s, int c, int32_t v) {
  int t = category(v);
  put(w, s->dc[c].code[t], s->dc[c].size[t]);
  if (t)
    put(w, (uint32_t)(v < 0 ? v - 1 : v) & ((1u << t) - 1), t);
  put(w, s->ac[c].code[0], s->ac[c].size[0]);
}

/* The DC differences of the stand-ins: all zero but the first few of component 0, which tune the
 * length (a TWEAK, then PAIRS of +v and -v), and each component's last, which sets its predictor. */
typedef struct plan {
  int64_t bits; /* of all the stand-ins */
  int32_t tweak;
  int pairs;
  int32_t pair[MAX_PAIRS];
  int32_t last[3];
} plan;

/* Pairs of categories whose bits bring the total from residue FROM to residue TO mod 8. */
static int pairs_to(const scan *s, int from, int to, int most, plan *p) {
  int via[8], cat[8];
  for (int i = 0; i < 8; i++)
    via[i] = -2;
  via[from] = -1;
  int queue[8], head = 0, tail = 0;
  queue[tail++] = from;
  while (head < tail) {
    int at = queue[head++];
    for (int t = 1; t <= 11; t++) {
      int one = block_bits(s, 0, 1 << (t - 1)), zero = block_bits(s, 0, 0);
      if (!one)
        continue;
      int next = (at + 2 * (one - zero)) & 7;
      if (via[next] == -2) {
        via[next] = at;
        cat[next] = t;
        queue[tail++] = next;
      }
    }
  }
  if (via[to] == -2)
    return -1;
  p->pairs = 0;
  for (int at = to; at != from; at = via[at]) {
    if (p->pairs == most || p->pairs == MAX_PAIRS)
      return -1;
    p->pair[p->pairs++] = 1 << (cat[at] - 1);
  }
  return 0;
}

static int choose(const scan *s, uint64_t blocks[3], const row_start *at, plan *p) {
  static const int32_t tweaks[] = {0, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7, 8, -8};
  /* Component 0's first block is the tweak and its last sets the predictor: two at least. */
  if (blocks[0] < 2)
    return -1;
  uint64_t zero_bits = 0;
  for (int c = 0; c < s->comps; c++) {
    int z = block_bits(s, c, 0);
    if (!z)
      return -1;
    zero_bits += blocks[c] * (uint64_t)z;
  }
  for (size_t k = 0; k < DL__ARRAY_LEN(tweaks); k++) {
    plan q = {.tweak = tweaks[k]};
    int64_t bits = (int64_t)zero_bits;
    bool ok = true;
    for (int c = 0; c < s->comps && ok; c++) {
      q.last[c] = at->dc[c] - (c == 0 ? q.tweak : 0);
      int b = block_bits(s, c, q.last[c]);
      ok = b != 0;
      bits += b - block_bits(s, c, 0);
    }
    int tb = block_bits(s, 0, q.tweak);
    if (!ok || !tb)
      continue;
    bits += tb - block_bits(s, 0, 0);
    uint64_t room = (blocks[0] - 2) / 2;
    if (pairs_to(s, (int)(bits & 7), (int)(at->bit & 7), room > MAX_PAIRS ? MAX_PAIRS : (int)room, &q) == 0) {
      for (int i = 0; i < q.pairs; i++)
        bits += 2 * (block_bits(s, 0, q.pair[i]) - block_bits(s, 0, 0));
      q.bits = bits;
      *p = q;
      return 0;
    }
  }
  return -1;
}

static int32_t diff_of(const plan *p, int c, uint64_t i, uint64_t count) {
  if (i == count - 1)
    return p->last[c];
  if (c != 0)
    return 0;
  if (i == 0)
    return p->tweak;
  uint64_t j = i - 1;
  return j < 2 * (uint64_t)p->pairs ? (j & 1 ? -p->pair[j / 2] : p->pair[j / 2]) : 0;
}

/* Stand-ins for MCU rows [0, ROWS) of S, ending where AT begins in DATA: into OUT, and the offset
 * in DATA that follows them in *TAIL. */
static int stand_ins(const scan *s, uint32_t rows, const row_start *at, const uint8_t *data, size_t n,
                     dl__buf *out, size_t *tail) {
  uint64_t mcus = (uint64_t)rows * s->mcus_per_row, per[3] = {0}, blocks[3];
  for (int b = 0; b < s->blocks; b++)
    per[s->comp[b]]++;
  for (int c = 0; c < s->comps; c++)
    blocks[c] = per[c] * mcus;
  plan p;
  if (choose(s, blocks, at, &p))
    return -1;
  size_t raw = at->bit >> 3;
  if (raw >= n || (data[raw] == 0xFF && (raw + 1 >= n || data[raw + 1] != 0)))
    return -1;
  /* Every byte maybe stuffed, and the byte shared with AT's. */
  if (dl__buf_reserve(out, (size_t)(p.bits / 8 * 2) + 16))
    return -1;
  writer w = {.o = out->p};
  /* An MCU of zero differences, as one code when it fits. */
  uint64_t zero_code = 0;
  int zero_len = 0;
  for (int b = 0; b < s->blocks && zero_len <= 56; b++) {
    int c = s->comp[b];
    int l0 = s->dc[c].size[0], le = s->ac[c].size[0];
    zero_code = zero_code << (l0 + le) | (uint64_t)s->dc[c].code[0] << le | s->ac[c].code[0];
    zero_len += l0 + le;
  }
  uint64_t seen[3] = {0};
  uint64_t plain_from = (uint64_t)(2 + 2 * p.pairs) / (per[0] ? per[0] : 1) + 1;
  for (uint64_t m = 0; m < mcus; m++) {
    if (m >= plain_from && m + 1 < mcus && zero_len <= 56) {
      put(&w, zero_code, zero_len);
      for (int c = 0; c < s->comps; c++)
        seen[c] += per[c];
      continue;
    }
    for (int b = 0; b < s->blocks; b++) {
      int c = s->comp[b];
      put_block(&w, s, c, diff_of(&p, c, seen[c]++, blocks[c]));
    }
  }
  int part = (int)(at->bit & 7);
  if (w.cnt != part)
    return -1; /* the plan's arithmetic and the writer disagree: never expected */
  if (part) {
    put(&w, data[raw] & ((1u << (8 - part)) - 1), 8 - part);
    raw += data[raw] == 0xFF ? 2 : 1;
  }
  *tail = raw;
  return (int)w.n;
}

int dl__jpeg_rows_prefix(dl__jpeg_rows *st, uint32_t sample, struct jpeg_decompress_struct *d,
                         const uint8_t *src, size_t len, size_t entropy_at, int imcu_row, dl__buf *out,
                         size_t *prefix_len, size_t *tail_at) {
  /* libjpeg reads ahead, and warns when that reaches the end of a file's bytes: where it does so
   * depends on what it read before. A marker (the EOI) at the end stops it first, whatever the
   * rows before were. */
  if (!st || imcu_row < 1 || !scan_usable(d) || len < entropy_at + 2 || src[len - 2] != 0xFF ||
      src[len - 1] == 0 || src[len - 1] == 0xFF)
    return -1;
  scan s;
  if (scan_read(d, &s))
    return -1;
  uint32_t row = (uint32_t)imcu_row * s.rows_per_imcu;
  if (row >= s.mcu_rows)
    return -1;
  record *rec = record_of(st, sample, src, len, entropy_at, s.mcu_rows);
  if (!rec)
    return -1;
  row_start at;
  size_t tail;
  uint32_t walked;
  const uint8_t *data = src + entropy_at;
  size_t n = len - entropy_at;
  if (find_row(rec, &s, data, n, row, &at, &walked))
    return -1;
  int got = stand_ins(&s, row, &at, data, n, out, &tail);
  if (got < 0)
    return -1;
  *prefix_len = (size_t)got;
  *tail_at = entropy_at + tail;
  atomic_fetch_add_explicit(&st->skipped, row - walked, memory_order_relaxed);
  return 0;
}

int dl__jpeg_rows_clean(dl__jpeg_rows *st, uint32_t sample, const uint8_t *p, size_t len,
                        int64_t max_pixels) {
  bool kept = st && sample < st->n; /* else the scan is read every time */
  uint8_t v = kept ? atomic_load_explicit(&st->verdicts[sample], memory_order_relaxed) : DL__VERDICT_UNREAD;
  if (v == DL__VERDICT_UNREAD) {
    scan s;
    size_t at;
    if (len > UINT32_MAX / 8 || scan_parse(p, len, &s, &at)) {
      /* Several scans (progressive, one component at a time) or none the walker reads: libjpeg
       * reads every code, and any complaint keeps the image on the CPU. */
      v = dl__jpeg_sound(p, len, max_pixels) ? DL__VERDICT_CLEAN : DL__VERDICT_DAMAGED;
    } else {
      scan_lookups(&s);
      record *rec = s.restart || !kept ? NULL : record_of(st, sample, p, len, at, s.mcu_rows);
      bool note = rec && !atomic_flag_test_and_set_explicit(&rec->busy, memory_order_acquire);
      uint32_t from = note ? atomic_load_explicit(&rec->known, memory_order_acquire) - 1 : 0;
      row_start start = note ? rec->at[from] : (row_start){0};
      bool odd = rec && atomic_load_explicit(&rec->odd, memory_order_relaxed);
      bool whole = !odd && walk_rows(rec, note, &s, p + at, len - at, from, s.mcu_rows, &start) == 0;
      v = whole ? DL__VERDICT_CLEAN : DL__VERDICT_DAMAGED;
      if (note)
        atomic_flag_clear_explicit(&rec->busy, memory_order_release);
    }
    if (kept) {
      atomic_store_explicit(&st->verdicts[sample], v, memory_order_relaxed);
      atomic_fetch_add_explicit(&st->walked, 1, memory_order_relaxed);
    }
  }
  return v == DL__VERDICT_CLEAN;
}

bool dl__jpeg_scan_vouched(const uint8_t *p, size_t len) {
  scan s;
  size_t at;
  /* Only the walker's files (scan_parse): a several-scan file is read by every loader itself. */
  if (len > UINT32_MAX / 8 || scan_parse(p, len, &s, &at))
    return false;
  return dl__jpeg_rows_clean(NULL, 0, p, len, 0) == 1;
}

int dl__jpeg_rows_first(struct jpeg_decompress_struct *d, int y0) {
  int h = d->max_v_samp_factor * MIN_DCT_V(d); /* output rows an iMCU row makes */
  /* Upsampled vertically, the first output row of an iMCU row blends in the last chroma row of
   * the one above: that row is then needed too. */
  bool context = false;
  for (int c = 0; c < d->num_components; c++)
    context |= d->comp_info[c].v_samp_factor < d->max_v_samp_factor;
  return y0 / h - (context && y0 % h == 0);
}
