/*
 * gpu_check's read of a baseline scan by many threads at once (gpu/walk.cu), here so that the
 * CPU's tests run the very steps the device does (span_walk_whole, against walk_whole). The scan's
 * data is cut into spans, one a thread; each is read from a guess at where its first code begins
 * until the span before it says where that is: Huffman codes fall back in step with the data
 * after a few symbols, so most spans' reads from the guess end where the true reading does, and
 * the reads go round again only for the spans whose entry changed. (Where every block is read
 * with the same tables, nothing in the codes tells which block of the MCU a read is in: the rounds
 * settle the entries' bits alone, and the blocks ended before each entry then give its block.)
 * Once no entry changes, every span was read from where the walk of the whole scan reaches it (the
 * first from the scan's start), and their findings joined give walk_whole's verdict: the bad codes
 * and reads past the data up to the scan's last block, and the DC predictors' range, from their
 * change over each span. A clean scan's spans are read once more from what the join found before
 * each (its first block and DC predictors) to note where each MCU row begins, as a CPU walk notes
 * them for the decodes after.
 * A scan with restart markers needs no guess: each interval between them is read whole from its
 * start, by the thread that finds the marker before it.
 */
#ifndef RINGFEED_DECODE_JPEG_SPAN_H
#define RINGFEED_DECODE_JPEG_SPAN_H

#include "decode/jpeg_walk.h"

/* Spans of at least SPAN_BYTES, at most SPAN_MAX of them (a thread block's). The rounds end by the
 * SPAN_MAX-th at the latest, as each round settles the entry of one more span at least: that of
 * span R is final once span R - 1's is. Most scans settle in a few (the q90 synthetic set: 5 on
 * average, 9 at most). */
enum { SPAN_BYTES = 256, SPAN_MAX = 256 };
/* The most MCU rows whose starts a read notes (4,096 pixels of 4:2:0). */
enum { SPAN_ROWS = 256 };

/* Where a code begins: the bit, counted over the data without its stuffed zero bytes, the block
 * of the MCU and the coefficient read next (0: its DC). */
typedef struct span_at {
  uint32_t bit;
  uint8_t b, k;
} span_at;

/* What a span's read from an entry found. */
typedef struct span_end {
  span_at next;                /* where the codes after the span begin */
  uint32_t blocks;             /* blocks ended in it */
  uint8_t failed;              /* a bad code or a read past the data, in block BLOCKS */
  int32_t dc[3], hi[3], lo[3]; /* the DC predictors' change, their highest and lowest on the way */
} span_end;

/* What comes before a span: the blocks ended and the DC predictors; and where to note the starts
 * of the MCU rows (PER_ROW blocks each, ROWS of them) it passes. */
typedef struct span_base {
  uint64_t block;
  int32_t dc[3];
} span_base;

typedef struct span_note {
  span_base base;
  row_start *at;
  uint32_t per_row, rows;
} span_note;

/* The scan's data: D, N bytes up to its first marker (or the file's end), cut into COUNT spans;
 * span I begins at byte FROM[I], bit BIT[I] (stuffed zero bytes left out); BIT[COUNT] ends it. */
typedef struct span_cut {
  const uint8_t *d;
  uint32_t n;
  int count;
  uint32_t from[SPAN_MAX + 1], bit[SPAN_MAX + 1];
} span_cut;

/* Whether a span read from entry B needs no read from entry A: the same bit and coefficient, and
 * the same block where that changes the codes read (S->shared: it does not; span_blocks). */
WALK_FN bool span_same(const scan *s, span_at a, span_at b) {
  return a.bit == b.bit && a.k == b.k && (a.b == b.b || s->shared);
}

/* Whether D[J] (of REST bytes) ends the data: a 0xFF not followed by a stuffed zero. */
WALK_FN bool span_marker(const uint8_t *d, size_t rest, size_t j) {
  return d[j] == 0xFF && (j + 1 >= rest || d[j + 1] != 0);
}

WALK_FN int span_count(uint32_t n) {
  uint32_t c = (n + SPAN_BYTES - 1) / SPAN_BYTES;
  return c < 1 ? 1 : c > SPAN_MAX ? SPAN_MAX : (int)c;
}

/* Where span I of COUNT begins in D (N bytes): never on a stuffed zero byte. */
WALK_FN uint32_t span_from(const uint8_t *d, uint32_t n, int count, int i) {
  if (i >= count)
    return n;
  uint32_t f = (uint32_t)((uint64_t)i * n / (uint32_t)count);
  return f > 0 && d[f - 1] == 0xFF ? f + 1 : f;
}

/* Stuffed zero bytes in D[FROM, TO). */
WALK_FN uint32_t span_stuffed(const uint8_t *d, uint32_t from, uint32_t to) {
  uint32_t z = 0;
  for (uint32_t j = from; j < to; j++)
    z += j > 0 && d[j] == 0 && d[j - 1] == 0xFF;
  return z;
}

WALK_FN int span_symbol(reader *r, const huff *h, uint32_t *bit) {
  int before = r->cnt;
  int v = symbol(r, h);
  *bit += (uint32_t)(before - r->cnt);
  return v;
}

/* Reads span I of C from AT to the first code at or past its end, or to CAP blocks; as walk_mcu
 * reads a block, one code at a time. With NOTE, the row starts it passes go into NOTE->at. */
WALK_FN span_end span_read(const scan *s, const span_cut *c, int i, span_at at, uint32_t cap,
                           const span_note *note) {
  span_end e = {{0, 0, 0}, 0, 0, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
  reader r;
  reader_at(&r, c->d, c->n, c->from[i] * 8);
  for (uint32_t skip = at.bit - c->bit[i]; skip;) {
    int k = skip > 32 ? 32 : (int)skip;
    fill(&r);
    drop(&r, k);
    skip -= (uint32_t)k;
  }
  uint32_t bit = at.bit, to = c->bit[i + 1];
  int b = at.b, k = at.k;
  while (bit < to && e.blocks < cap) {
    fill(&r);
    int comp = s->comp[b];
    if (k == 0) {
      int t = span_symbol(&r, &s->dc[comp], &bit);
      if (t < 0 || t > 11) {
        e.failed = 1;
        break;
      }
      if (t) {
        int v = (int)peek(&r, t);
        drop(&r, t);
        bit += (uint32_t)t;
        if (v < 1 << (t - 1))
          v -= (1 << t) - 1;
        e.dc[comp] += v;
        e.hi[comp] = e.dc[comp] > e.hi[comp] ? e.dc[comp] : e.hi[comp];
        e.lo[comp] = e.dc[comp] < e.lo[comp] ? e.dc[comp] : e.lo[comp];
      }
      k = 1;
    } else {
      int a = span_symbol(&r, &s->ac[comp], &bit);
      if (a < 0) {
        e.failed = 1;
        break;
      }
      int run = a >> 4, size = a & 15;
      if (size) {
        k += run + 1;
        drop(&r, size);
        bit += (uint32_t)size;
      } else {
        k = run == 15 ? k + 16 : 64;
      }
    }
    if (r.cnt < r.fake) { /* read past the data */
      e.failed = 1;
      break;
    }
    if (k >= 64) {
      k = 0;
      b = b + 1 == s->blocks ? 0 : b + 1;
      e.blocks++;
      uint64_t block = note ? note->base.block + e.blocks : 0;
      if (note && block % note->per_row == 0 && block / note->per_row < note->rows) {
        row_start *y = &note->at[block / note->per_row];
        y->bit = tell(&r);
        for (int q = 0; q < 3; q++)
          y->dc[q] = (int16_t)(note->base.dc[q] + e.dc[q]);
      }
    }
  }
  e.next = (span_at){bit, (uint8_t)b, (uint8_t)k};
  return e;
}

/* Span I's entry: the scan's start, where the read of span I - 1 ended, or (that read failed: its
 * entry was a guess) the guess, the span's own start read as a block's beginning. */
WALK_FN span_at span_entry(const span_cut *c, const span_end *out, int i) {
  if (i > 0 && !out[i - 1].failed)
    return out[i - 1].next;
  return (span_at){c->bit[i], 0, 0};
}

/* Where every block is read with the same tables (S->shared), the block each settled entry AT[I]
 * is in: the blocks ended before it, modulo the MCU's. Up to the first read that failed (the
 * spans after it are not joined). A span whose read began in another block is read again. */
WALK_FN void span_blocks(const scan *s, const span_cut *c, const span_end *out, span_at *at) {
  uint64_t done = 0;
  for (int i = 0; i < c->count && (i == 0 || !out[i - 1].failed); i++) {
    at[i].b = (uint8_t)(done % (uint64_t)s->blocks);
    done += out[i].blocks;
  }
}

/* The verdict from the spans' reads OUT from their entries AT, once none changes: 1 clean, 0 not
 * (walk_whole's). The span the scan's last block ends in is read again up to that block. BASE
 * (may be NULL): what comes before each span of a clean scan. */
WALK_FN int span_join(const scan *s, const span_cut *c, const span_end *out, const span_at *at, span_base *base) {
  uint64_t total = (uint64_t)s->mcu_rows * s->mcus_per_row * (uint64_t)s->blocks, done = 0;
  int32_t dc[3] = {0, 0, 0};
  for (int i = 0; i < c->count; i++) {
    span_end o = out[i];
    if (base)
      base[i] = (span_base){done, {dc[0], dc[1], dc[2]}};
    if (o.failed && done + o.blocks < total)
      return 0;
    if (o.failed || done + o.blocks >= total) {
      o = span_read(s, c, i, at[i], (uint32_t)(total - done), NULL);
      if (o.failed || done + o.blocks < total)
        return 0;
    }
    for (int k = 0; k < 3; k++) {
      if (dc[k] + o.hi[k] > MAX_DC || dc[k] + o.lo[k] < -MAX_DC)
        return 0;
      dc[k] += o.dc[k];
    }
    if ((done += o.blocks) >= total) {
      for (int k = i + 1; base && k < c->count; k++)
        base[k] = (span_base){total, {0, 0, 0}}; /* past the last block: nothing to note */
      return 1;
    }
  }
  return 0; /* the data ends before the last block: walk_whole reads past it */
}

/* Notes the row starts span I passes, BASE[I] before it, into AT (ROWS of them, at most SPAN_ROWS). */
WALK_FN void span_rows(const scan *s, const span_cut *c, int i, const span_at *at, const span_base *base,
                       row_start *rows_at, uint32_t rows) {
  uint64_t total = (uint64_t)rows * s->mcus_per_row * (uint64_t)s->blocks;
  if (base[i].block >= total)
    return;
  span_note note = {base[i], rows_at, s->mcus_per_row * (uint32_t)s->blocks, rows};
  span_read(s, c, i, at[i], (uint32_t)(total - base[i].block), &note);
}

/* Restart intervals: whether D[J] (of REST bytes) is a marker's code, as walk_whole's restart
 * finds one: after a run of 0xFF, neither a stuffed zero nor another 0xFF. */
WALK_FN bool span_restart_code(const uint8_t *d, size_t rest, size_t j) {
  return j > 0 && j < rest && d[j - 1] == 0xFF && d[j] != 0 && d[j] != 0xFF;
}

/* Whether interval I of the scan's TOTAL MCUs, from byte FROM of D (REST bytes), reads clean as
 * walk_whole reads it, its DC predictors from 0. */
WALK_FN bool span_interval(const scan *s, const uint8_t *d, size_t rest, size_t from, uint64_t i, uint64_t total) {
  uint64_t first = i * s->restart, mcus = total - first < s->restart ? total - first : s->restart;
  reader r;
  reader_at(&r, d, rest, (uint32_t)from * 8);
  int32_t dc[3] = {0, 0, 0};
  for (uint64_t k = 0; k < mcus; k++)
    if (walk_mcu(&r, s, dc))
      return false;
  return true;
}

/* Whether marker M of the data (its code at D[CODE]) is the restart marker walk_whole expects. */
WALK_FN bool span_restart_expected(const uint8_t *d, size_t code, uint64_t m) {
  return d[code] == 0xD0 + (m & 7);
}

/* The intervals of a scan with restart markers (D, REST bytes), one after the other where a
 * device's threads read those after the markers each finds: walk_whole's verdict. */
WALK_FN int span_intervals_whole(const scan *s, const uint8_t *d, size_t rest) {
  uint64_t total = (uint64_t)s->mcu_rows * s->mcus_per_row, intervals = (total + s->restart - 1) / s->restart, m = 0;
  if (!span_interval(s, d, rest, 0, 0, total))
    return 0;
  for (size_t j = 0; j < rest && m + 1 < intervals; j++)
    if (span_restart_code(d, rest, j)) {
      if (!span_restart_expected(d, j, m) || !span_interval(s, d, rest, j + 1, m + 1, total))
        return 0;
      m++;
    }
  return m + 1 >= intervals;
}

/* The CPU's room for span_walk_whole. */
typedef struct span_room {
  span_cut cut;
  span_end out[SPAN_MAX];
  span_at at[SPAN_MAX];
  span_base base[SPAN_MAX];
  int rounds; /* the last walk's rounds of reads after the first */
} span_room;

/* Walks P (LEN bytes) span by span, each round one after the other where a device's threads read
 * them at once (or interval by interval, with restart markers): walk_whole's verdict, or -1 where
 * it is not a file the walker reads. S: the tables. With ROWS (room for SPAN_ROWS), a clean scan's
 * row starts, where it has no restart markers and SPAN_ROWS MCU rows or fewer. */
WALK_FN int span_walk_whole(const uint8_t *p, size_t len, scan *s, span_room *room, row_start *rows) {
  span_cut *c = &room->cut;
  span_end *out = room->out;
  span_at *at = room->at;
  size_t entropy_at;
  if (scan_open(p, len, s, &entropy_at))
    return -1;
  size_t rest = len - entropy_at, n = 0;
  c->d = p + entropy_at;
  if (s->restart)
    return span_intervals_whole(s, c->d, rest);
  while (n < rest && !span_marker(c->d, rest, n))
    n++;
  c->n = (uint32_t)n;
  c->count = span_count(c->n);
  uint32_t stuffed = 0;
  for (int i = 0; i <= c->count; i++) {
    c->from[i] = span_from(c->d, c->n, c->count, i);
    stuffed += i ? span_stuffed(c->d, c->from[i - 1], c->from[i]) : 0;
    c->bit[i] = (c->from[i] - stuffed) * 8;
  }
  for (int i = 0; i < c->count; i++) {
    at[i] = (span_at){c->bit[i], 0, 0};
    out[i] = span_read(s, c, i, at[i], UINT32_MAX, NULL);
  }
  for (room->rounds = 0;; room->rounds++) {
    bool changed = false;
    for (int i = c->count - 1; i > 0; i--) { /* from the last: each reads the round before's */
      span_at e = span_entry(c, out, i);
      if (!span_same(s, e, at[i])) {
        at[i] = e;
        out[i] = span_read(s, c, i, e, UINT32_MAX, NULL);
        changed = true;
      }
    }
    if (!changed)
      break;
  }
  if (s->shared) {
    uint8_t was[SPAN_MAX];
    for (int i = 0; i < c->count; i++)
      was[i] = at[i].b;
    span_blocks(s, c, out, at);
    for (int i = 0; i < c->count; i++)
      if (at[i].b != was[i])
        out[i] = span_read(s, c, i, at[i], UINT32_MAX, NULL);
  }
  int v = span_join(s, c, out, at, room->base);
  if (v == 1 && rows && s->mcu_rows <= SPAN_ROWS) {
    rows[0] = (row_start){0, {0, 0, 0}};
    for (int i = 0; i < c->count; i++)
      span_rows(s, c, i, at, room->base, rows, s->mcu_rows);
  }
  return v;
}

#endif
