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
 * The GPU path asks the same walker (decode/jpeg_walk.h) to read a whole scan once a sample, from
 * the file's own markers, restart intervals included (dl__jpeg_rows_clean, or gpu/walk.cu on the
 * device): nvJPEG's engine decodes a scan whose data ends early without a word, where libjpeg
 * finds it short. Images in several scans (progressive, non-interleaved) are read by libjpeg
 * itself, to their coefficients.
 */
#include "decode/jpeg.h"
#include "decode/jpeg_walk.h"

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

enum { MAX_PAIRS = 4 };

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

uint8_t dl__jpeg_rows_verdict(const dl__jpeg_rows *s, uint32_t sample) {
  return s && sample < s->n ? atomic_load_explicit(&s->verdicts[sample], memory_order_relaxed) : DL__VERDICT_UNREAD;
}

void dl__jpeg_rows_note(dl__jpeg_rows *s, uint32_t sample, bool clean) {
  if (!s || sample >= s->n)
    return;
  atomic_store_explicit(&s->verdicts[sample], clean ? DL__VERDICT_CLEAN : DL__VERDICT_DAMAGED, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->walked, 1, memory_order_relaxed);
}

/* ---- The scan as libjpeg has read it ---- */

static bool scan_usable(j_decompress_ptr d) {
  return !d->progressive_mode && !d->arith_code && d->data_precision == 8 && d->restart_interval == 0 &&
         d->comps_in_scan == d->num_components && d->comps_in_scan <= 3 &&
         d->blocks_in_MCU <= WALK_MAX_BLOCKS && d->MCU_rows_in_scan > 1;
}

static int table(huff *h, const JHUFF_TBL *t) {
  return t ? huff_codes(h, t->bits, t->huffval) : -1;
}

static int scan_read(j_decompress_ptr d, scan *s) {
  s->blocks = d->blocks_in_MCU;
  s->comps = d->comps_in_scan;
  for (int b = 0; b < s->blocks; b++)
    s->comp[b] = (uint8_t)d->MCU_membership[b];
  s->mcus_per_row = d->MCUs_per_row;
  s->mcu_rows = d->MCU_rows_in_scan;
  s->restart = d->restart_interval;
  s->shared = false; /* asked only by the reads in spans (jpeg_span.h), which parse the file */
  /* A lone component's MCU is one block: its iMCU row holds v_samp_factor rows of them. */
  s->rows_per_imcu = d->comps_in_scan == 1 ? (uint32_t)d->cur_comp_info[0]->v_samp_factor : 1;
  for (int c = 0; c < s->comps; c++) {
    const jpeg_component_info *ci = d->cur_comp_info[c];
    if (ci->dc_tbl_no < 0 || ci->dc_tbl_no >= NUM_HUFF_TBLS || ci->ac_tbl_no < 0 ||
        ci->ac_tbl_no >= NUM_HUFF_TBLS || table(&s->dc[c], d->dc_huff_tbl_ptrs[ci->dc_tbl_no]) ||
        table(&s->ac[c], d->ac_huff_tbl_ptrs[ci->ac_tbl_no]))
      return -1;
  }
  return 0;
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

void dl__jpeg_rows_learn(dl__jpeg_rows *st, uint32_t sample, const uint8_t *p, size_t len, uint32_t entropy_at,
                         const void *at, uint32_t rows) {
  record *rec = st && rows ? record_of(st, sample, p, len, entropy_at, rows) : NULL;
  if (!rec || atomic_flag_test_and_set_explicit(&rec->busy, memory_order_acquire))
    return; /* a decode is extending it: it learns them itself */
  const row_start *from = at;
  uint32_t known = atomic_load_explicit(&rec->known, memory_order_acquire);
  if (!atomic_load_explicit(&rec->odd, memory_order_relaxed) && known < rows) {
    memcpy(&rec->at[known], &from[known], (size_t)(rows - known) * sizeof *from);
    atomic_store_explicit(&rec->known, rows, memory_order_release);
  }
  atomic_flag_clear_explicit(&rec->busy, memory_order_release);
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
    if (walk_row(&r, s, dc, &mcu)) {
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
    if (scan_open(p, len, &s, &at)) {
      /* Several scans (progressive, one component at a time) or none the walker reads: libjpeg
       * reads every code, and any complaint keeps the image on the CPU. */
      v = dl__jpeg_sound(p, len, max_pixels) ? DL__VERDICT_CLEAN : DL__VERDICT_DAMAGED;
    } else {
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
  /* Only the walker's files: a several-scan file is read by every loader itself. */
  return walk_whole(p, len, &s) == 1;
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
