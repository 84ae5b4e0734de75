/*
 * What a JPEG's markers say, read without decoding: the frame (size, precision, components,
 * sampling), whether the tables each scan uses are defined and sound, the colour space libjpeg
 * would assume, and, when the whole file is read, whether its scans are well formed up to an EOI
 * marker (restart markers in sequence, nothing foreign between scans, progressive bands in
 * order). The decoder uses the first part to decide when a decompressor can be reused; the GPU
 * path uses all of it to pick the JPEGs nvJPEG may take, leaving everything unusual, and every
 * file libjpeg would find fault with in its markers, to the CPU, which then reports exactly what
 * it reports today.
 */
#include "decode/jpeg.h"

#include <string.h>

static unsigned be16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }

/* The subsampling of a frame from its sampling factors; DL__CSS_OTHER for anything unusual. */
static int subsampling(const dl__jpeg_info *j) {
  if (j->components == 1) /* libjpeg reads a lone component in 8x8 blocks whatever it declares */
    return j->samp[0][0] == 1 && j->samp[0][1] == 1 ? DL__CSS_GRAY : DL__CSS_OTHER;
  if (j->components != 3 || j->samp[1][0] != 1 || j->samp[1][1] != 1 || j->samp[2][0] != 1 ||
      j->samp[2][1] != 1)
    return DL__CSS_OTHER;
  static const struct {
    uint8_t h, v;
    int css;
  } known[] = {{1, 1, DL__CSS_444}, {2, 1, DL__CSS_422}, {2, 2, DL__CSS_420}, {1, 2, DL__CSS_440},
               {4, 1, DL__CSS_411}, {4, 2, DL__CSS_410}};
  for (size_t i = 0; i < DL__ARRAY_LEN(known); i++)
    if (j->samp[0][0] == known[i].h && j->samp[0][1] == known[i].v)
      return known[i].css;
  return DL__CSS_OTHER;
}

/* The 8x8 blocks a frame codes: whole MCUs of every component when it has several. */
static int64_t frame_blocks(const dl__jpeg_info *j) {
  if (j->components == 1)
    return (int64_t)((j->width + 7) / 8) * ((j->height + 7) / 8);
  int hmax = 1, vmax = 1, per_mcu = 0;
  for (int c = 0; c < j->components && c < 4; c++) {
    hmax = j->samp[c][0] > hmax ? j->samp[c][0] : hmax;
    vmax = j->samp[c][1] > vmax ? j->samp[c][1] : vmax;
    per_mcu += j->samp[c][0] * j->samp[c][1];
  }
  return (int64_t)((j->width + 8 * hmax - 1) / (8 * hmax)) * ((j->height + 8 * vmax - 1) / (8 * vmax)) * per_mcu;
}

/* A DHT segment, checked as libjpeg checks it when it builds the decoding tables: the counts fit
 * the segment and 256 symbols, the codes fit their lengths, DC symbols are at most 15. */
static bool read_dht(const uint8_t *seg, size_t sl, unsigned *dht) {
  for (size_t k = 0; k < sl;) {
    if (k + 17 > sl || (seg[k] >> 4) > 1 || (seg[k] & 15) > 3)
      return false;
    bool dc = (seg[k] >> 4) == 0;
    size_t count = 0;
    unsigned long code = 0;
    for (int b = 1; b <= 16; b++) {
      count += seg[k + b];
      code += seg[k + b];
      if (code >= (1ul << b))
        return false; /* too many codes for the length, or one of all ones */
      code <<= 1;
    }
    if (count > 256 || k + 17 + count > sl)
      return false;
    for (size_t s = 0; dc && s < count; s++)
      if (seg[k + 17 + s] > 15)
        return false;
    *dht |= 1u << ((seg[k] >> 4) * 4 + (seg[k] & 3));
    k += 17 + count;
  }
  return true;
}

typedef struct state {
  unsigned dqt, dht, need_q;
  bool jfif, adobe;
  int transform;
  uint8_t ids[4];
  int restart_interval;
  int8_t coef_al[4][64]; /* progressive: each coefficient's last approximation bit, -1 uncoded */
} state;

/* A progressive scan's bands against what earlier scans coded, as libjpeg checks them (it warns
 * and decodes on: refinements of coefficients never coded, AC bands before their DC). */
static void follow_progression(const uint8_t *seg, int ns, int ss, int se, int ah, int al, dl__jpeg_info *j,
                               state *st) {
  for (int c = 0; c < ns; c++) {
    int f = 0;
    while (f < j->components && f < 4 && st->ids[f] != seg[1 + 2 * c])
      f++;
    if (f == j->components || f == 4)
      continue;
    int8_t *coef = st->coef_al[f];
    if (ss > 0 && coef[0] < 0)
      j->bogus_progression = true;
    for (int k = ss; k <= se; k++) {
      if (ah != (coef[k] < 0 ? 0 : coef[k]))
        j->bogus_progression = true;
      coef[k] = (int8_t)al;
    }
  }
}

/* An SOS segment: its parameters make sense for the frame and its tables are there. */
static bool read_sos(const uint8_t *seg, size_t sl, dl__jpeg_info *j, state *st) {
  int ns = sl >= 1 ? seg[0] : 0;
  if (ns < 1 || ns > 4 || sl != 4 + 2 * (size_t)ns)
    return false;
  int ss = seg[1 + 2 * ns], se = seg[2 + 2 * ns], ah = seg[3 + 2 * ns] >> 4, al = seg[3 + 2 * ns] & 15;
  bool progressive = j->sof == 0xC2;
  unsigned need = 0;
  for (int c = 0; c < ns; c++) {
    int id = seg[1 + 2 * c], td = seg[2 + 2 * c] >> 4, ta = seg[2 + 2 * c] & 15;
    bool known = false;
    for (int f = 0; f < j->components && f < 4; f++)
      known |= st->ids[f] == id;
    if (!known || td > 3 || ta > 3)
      return false;
    if (!progressive)
      need |= 1u << td | 1u << (4 + ta);
    else if (ss == 0 && ah == 0)
      need |= 1u << td; /* a first DC scan */
    else if (ss > 0)
      need |= 1u << (4 + ta); /* AC scans, refinements too, are Huffman coded */
  }
  if (!progressive && (ss != 0 || se != 63 || ah != 0 || al != 0))
    return false;
  if (progressive && (ss > se || se > 63 || (ss == 0 && se != 0) || (ss > 0 && ns != 1) || ah > 13 || al > 13 ||
                      (ah != 0 && ah != al + 1)))
    return false;
  if (progressive)
    follow_progression(seg, ns, ss, se, ah, al, j, st);
  return (need & ~st->dht) == 0 && (st->need_q & ~st->dqt) == 0;
}

/* From the end of an SOS segment at I: its entropy-coded data, restart markers in sequence.
 * Returns the offset of the marker that ends it, or 0 when the data runs out first. */
static size_t scan_data(const uint8_t *p, size_t n, size_t i, const state *st) {
  int next_rst = 0;
  for (;;) {
    const uint8_t *ff = memchr(p + i, 0xFF, n - i);
    if (!ff)
      return 0;
    i = (size_t)(ff - p);
    if (i + 1 >= n)
      return 0;
    uint8_t m = p[i + 1];
    if (m == 0x00 || m == 0xFF) {
      i += m == 0xFF ? 1 : 2;
      continue;
    }
    if (m < 0xD0 || m > 0xD7)
      return i;
    if (!st->restart_interval || m != 0xD0 + next_rst)
      return 0; /* a restart marker out of its place */
    next_rst = (next_rst + 1) & 7;
    i += 2;
  }
}

int dl__jpeg_probe(const uint8_t *p, size_t n, bool whole, dl__jpeg_info *j) {
  memset(j, 0, sizeof *j);
  if (n < 4 || p[0] != 0xFF || p[1] != 0xD8)
    return -1;
  state st = {.transform = -1};
  size_t i = 2;
  while (i + 2 <= n) {
    if (p[i] != 0xFF)
      return -1; /* bytes between segments: libjpeg skips them with a warning */
    uint8_t m = p[i + 1];
    if (m == 0xFF) {
      i++;
      continue;
    }
    if (m == 0xD9 && j->scans) { /* EOI after the scans: a complete file */
      j->ends = true;
      return 0;
    }
    if (m == 0xD8 || m == 0xD9 || m == 0x01 || (m >= 0xD0 && m <= 0xD7) || i + 4 > n)
      return -1; /* a standalone marker out of place, or no room for a segment */
    size_t len = be16(p + i + 2);
    if (len < 2 || i + 2 + len > n)
      return -1;
    const uint8_t *seg = p + i + 4;
    size_t sl = len - 2;
    bool sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
    /* Between scans only tables, restart intervals, comments and application data belong. */
    if (j->scans && !(m == 0xC4 || m == 0xDB || m == 0xDD || m == 0xDA || m == 0xFE || (m >= 0xE0 && m <= 0xEF)))
      return whole ? 0 : -1;
    if (m == 0xDB) { /* DQT: one or more tables */
      for (size_t k = 0; k < sl;) {
        if ((seg[k] >> 4) > 1 || (seg[k] & 15) > 3)
          return -1;
        st.dqt |= 1u << (seg[k] & 3);
        k += 1 + ((seg[k] >> 4) ? 128 : 64);
        if (k > sl)
          return -1;
      }
    } else if (m == 0xC4) {
      if (!read_dht(seg, sl, &st.dht))
        return -1;
    } else if (sof) {
      if (j->sof || sl < 6)
        return -1;
      j->sof = m;
      if (m == 0xC2) /* only progressive scans are followed: the others need no table */
        memset(st.coef_al, -1, sizeof st.coef_al);
      j->precision = seg[0];
      j->height = (int)be16(seg + 1);
      j->width = (int)be16(seg + 3);
      j->components = seg[5];
      if (j->components < 1 || sl != 6 + 3 * (size_t)j->components)
        return -1;
      for (int c = 0; c < j->components; c++) {
        const uint8_t *cp = seg + 6 + 3 * c;
        int h = cp[1] >> 4, v = cp[1] & 15;
        if (h < 1 || h > 4 || v < 1 || v > 4 || cp[2] > 3)
          return -1;
        if (c < 4) {
          st.ids[c] = cp[0];
          j->samp[c][0] = (uint8_t)h;
          j->samp[c][1] = (uint8_t)v;
        }
        st.need_q |= 1u << cp[2];
      }
    } else if (m == 0xE0 && sl >= 5 && !memcmp(seg, "JFIF", 5)) {
      st.jfif = true;
    } else if (m == 0xEE && sl >= 12 && !memcmp(seg, "Adobe", 5)) {
      st.adobe = true;
      st.transform = seg[11];
    } else if (m == 0xDD) {
      if (sl != 2)
        return -1;
      st.restart_interval = (int)be16(seg);
      j->restarts |= st.restart_interval != 0;
    } else if (m == 0xDA) {
      if (!j->sof)
        return -1;
      bool sound = read_sos(seg, sl, j, &st);
      if (!j->scans) {
        j->first_scan_components = sl >= 1 ? seg[0] : 0;
        j->tables_complete = sound;
        /* libjpeg's guess of the colour space of a three-component frame (jdapimin.c). */
        if (j->components == 3)
          j->rgb = st.jfif    ? false
                   : st.adobe ? st.transform == 0
                              : st.ids[0] == 'R' && st.ids[1] == 'G' && st.ids[2] == 'B';
        j->cmyk = j->components == 4;
        j->subsampling = subsampling(j);
        j->blocks = frame_blocks(j);
      } else {
        j->between_scans = true;
        j->tables_complete &= sound;
      }
      j->scans++;
      if (!whole)
        return 0;
      size_t end = scan_data(p, n, i + 2 + len, &st);
      if (!end)
        return 0; /* the data breaks off: not a file that ends */
      j->entropy_bytes += end - (i + 2 + len);
      i = end;
      continue;
    }
    i += 2 + len;
  }
  return j->scans ? 0 : -1;
}
