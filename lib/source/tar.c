/*
 * WebDataset tar shards: scans ustar, GNU (long names, base-256 sizes) and pax headers, and groups
 * consecutive members that share a key (the path up to the first dot of the base name) into samples.
 * Every size read from the file is checked against the file's size before it is used.
 */
#include "source/source.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define BLOCK 512
#define WINDOW (256u << 10)
#define NAME_MAX_LEN 4096

typedef struct reader {
  int fd;
  uint64_t size;
  uint8_t *win;
  uint64_t win_off;
  size_t win_len;
  int err; /* -errno of the last read that failed, or DL_ECORRUPT when the file ended before its size */
  uint64_t ended_at; /* with DL_ECORRUPT: where */
  bool no_peek;      /* a read of cached bytes came up short: the file is read in windows */
} reader;

/* Past a gap of GAP bytes or more (a member's data the scan steps over), bytes already in memory
 * are read PEEK at a time: a header, a label and the next header, not the data between them. A
 * scan of cached shards of 56 KB images copied each member whole (a window of 256 KB at a time),
 * which was most of a first open's index. Once bytes are found not cached, the rest of the file is
 * read a window at a time, in order, so that the kernel reads ahead as it did: steps over the data
 * there took its read-ahead away. */
#define PEEK 4096
#define GAP (16u << 10)

/* Returns a pointer to LEN bytes at OFF, or NULL past the end of the file or on a read error. */
static const uint8_t *read_at(reader *r, uint64_t off, size_t len) {
  if (off + len > r->size || len > WINDOW)
    return NULL;
  if (off >= r->win_off && off + len <= r->win_off + r->win_len)
    return r->win + (off - r->win_off);
  size_t want = (size_t)(r->size - off < WINDOW ? r->size - off : WINDOW);
  if (!r->no_peek && r->win_len && off >= r->win_off + r->win_len + GAP && len <= PEEK && want > PEEK) {
    int64_t n = dl__pread_cached(r->fd, r->win, PEEK, off);
    if (n == PEEK) {
      r->win_off = off;
      r->win_len = PEEK;
      return r->win;
    }
    r->no_peek = true; /* not cached (or not to be told): the rest in windows, read ahead in order */
  }
  int64_t n = dl__pread_full(r->fd, r->win, want, off);
  size_t got = n > 0 ? (size_t)n : 0;
  r->err = n < 0 ? (int)n : 0;
  if (n >= 0 && got < want) { /* the size was taken at open: the file shrank, or a read came up short */
    r->err = DL_ECORRUPT;
    r->ended_at = off + got;
  }
  r->win_off = off;
  r->win_len = got;
  return got >= len ? r->win : NULL;
}

static bool is_zero_block(const uint8_t *h) {
  for (int i = 0; i < BLOCK; i++)
    if (h[i])
      return false;
  return true;
}

static bool checksum_ok(const uint8_t *h) {
  uint64_t stored = 0;
  int i = 148, digits = 0;
  while (i < 156 && h[i] == ' ')
    i++;
  for (; i < 156 && h[i] >= '0' && h[i] <= '7'; i++, digits++)
    stored = stored * 8 + (uint64_t)(h[i] - '0');
  if (!digits)
    return false;
  int64_t usum = 0, ssum = 0;
  for (i = 0; i < BLOCK; i++) {
    uint8_t c = (i >= 148 && i < 156) ? ' ' : h[i];
    usum += c;
    ssum += (int8_t)c;
  }
  return (int64_t)stored == usum || (int64_t)stored == ssum;
}

/* Octal (NUL/space padded) or GNU base-256 numeric field; -1 when malformed. */
static int64_t parse_number(const uint8_t *f, int len) {
  if (f[0] & 0x80) {
    if (f[0] != 0x80)
      return -1; /* negative base-256 */
    uint64_t v = 0;
    for (int i = 1; i < len; i++) {
      if (v >> 55)
        return -1;
      v = (v << 8) | f[i];
    }
    return (int64_t)v;
  }
  int i = 0;
  while (i < len && f[i] == ' ')
    i++;
  uint64_t v = 0;
  int digits = 0;
  for (; i < len && f[i] >= '0' && f[i] <= '7'; i++, digits++) {
    if (v >> 60)
      return -1;
    v = v * 8 + (uint64_t)(f[i] - '0');
  }
  for (; i < len; i++)
    if (f[i] != ' ' && f[i] != 0)
      return -1;
  return digits ? (int64_t)v : 0;
}

/* What a pax extended header says of the member after it. */
typedef struct pax {
  char path[NAME_MAX_LEN];
  int64_t size; /* -1: the member's own header says */
  bool sparse;  /* GNU tar's sparse records: the member's bytes are a map and its data, not the file */
  bool sparse_name;
} pax;

/* Nothing said of the next member (the path only emptied: clearing all of it per member costs). */
static void pax_reset(pax *x) {
  x->path[0] = 0;
  x->size = -1;
  x->sparse = x->sparse_name = false;
}

/* Applies the "path", "size" and GNU.sparse.* records of a pax extended header. */
static int parse_pax(const uint8_t *p, size_t n, pax *x) {
  size_t i = 0;
  while (i < n) {
    size_t len = 0, j = i;
    while (j < n && isdigit(p[j])) {
      len = len * 10 + (size_t)(p[j] - '0');
      if (len > n)
        return -1;
      j++;
    }
    if (j == i || j >= n || p[j] != ' ' || len < (j - i) + 2 || i + len > n || p[i + len - 1] != '\n')
      return -1;
    const uint8_t *kv = p + j + 1, *end = p + i + len - 1;
    const uint8_t *eq = memchr(kv, '=', (size_t)(end - kv));
    if (!eq)
      return -1;
    size_t klen = (size_t)(eq - kv), vlen = (size_t)(end - eq - 1);
    bool sparse_name = klen == 15 && !memcmp(kv, "GNU.sparse.name", 15);
    if (klen > 11 && !memcmp(kv, "GNU.sparse.", 11))
      x->sparse = true;
    if ((klen == 4 && !memcmp(kv, "path", 4) && !x->sparse_name) || sparse_name) {
      /* A sparse file's own name; "path" holds a made-up GNUSparseFile.N/NAME. */
      if (vlen == 0 || vlen >= sizeof x->path)
        return -1;
      memcpy(x->path, eq + 1, vlen);
      x->path[vlen] = 0;
      x->sparse_name |= sparse_name;
    } else if (klen == 4 && !memcmp(kv, "size", 4)) {
      int64_t v = 0;
      for (size_t k = 0; k < vlen; k++) {
        if (!isdigit(eq[1 + k]) || v > INT64_MAX / 10 - 10)
          return -1;
        v = v * 10 + (eq[1 + k] - '0');
      }
      x->size = v;
    }
    i += len;
  }
  return 0;
}


typedef struct group {
  char key[NAME_MAX_LEN];
  size_t key_len;
  bool open;
  bool exact_image; /* image came from an extension that is exactly jpg/jpeg/png */
  dl__sample s;
  char image_name[NAME_MAX_LEN];
  uint64_t image_off, image_size;
  uint64_t span_start, span_end; /* the sample's bytes a worker reads: its image and fields */
  dl__fref refs[DL__MAX_FIELDS];
  uint64_t ref_off[DL__MAX_FIELDS];
  int nrefs;
  uint64_t ext_hash[32]; /* the extensions it has, to catch a member that repeats one */
  int next;
  bool fields_left_out; /* a member had no field to go to: said once, and the shard not cached */
  uint64_t bad_labels;  /* .cls members that hold no integer label (-1 used): said once, not cached */
  char bad_label[400];  /* the first of them, and why */
  uint64_t hidden;    /* members left out because their base name starts with a dot */
} group;

static void widen(group *g, uint64_t off, uint64_t size) {
  if (off < g->span_start)
    g->span_start = off;
  if (off + size > g->span_end)
    g->span_end = off + size;
}

static int flush(dl__dataset *ds, group *g) {
  if (!g->open)
    return 0;
  g->open = false;
  const char *name = g->s.codec != DL__CODEC_NONE ? g->image_name : g->key;
  uint32_t at = dl__dataset_intern(ds, name, strlen(name));
  if (at == UINT32_MAX)
    return -ENOMEM;
  g->s.name = at;
  g->s.key = dl__dataset_intern(ds, g->key, g->key_len);
  if (g->s.key == UINT32_MAX)
    return -ENOMEM;
  if (g->span_end > g->span_start) {
    g->s.offset = g->span_start;
    g->s.size = g->span_end - g->span_start;
  }
  if (g->s.codec != DL__CODEC_NONE) {
    g->s.image_at = (uint32_t)(g->image_off - g->span_start);
    g->s.image_len = (uint32_t)(g->image_size < UINT32_MAX ? g->image_size : UINT32_MAX);
  }
  g->s.first_ref = (uint32_t)ds->nrefs;
  g->s.nrefs = (uint8_t)g->nrefs;
  for (int i = 0; i < g->nrefs; i++) {
    g->refs[i].at = (uint32_t)(g->ref_off[i] - g->span_start);
    if (dl__dataset_add_ref(ds, &g->refs[i]))
      return -ENOMEM;
  }
  return dl__dataset_push(ds, &g->s);
}

int64_t dl__parse_label(const uint8_t *p, size_t n, const char **why) {
  size_t i = 0;
  while (i < n && isspace(p[i]))
    i++;
  bool neg = i < n && p[i] == '-';
  if (i < n && (p[i] == '-' || p[i] == '+')) /* as Python's int() reads them */
    i++;
  int64_t v = 0;
  size_t digits = 0;
  bool over = false;
  for (; i < n && isdigit(p[i]); i++, digits++) {
    over |= v > INT64_MAX / 10 - 10;
    v = over ? v : v * 10 + (p[i] - '0');
  }
  while (i < n && isspace(p[i]))
    i++;
  *why = !digits || i != n ? "is not an integer" : over ? "is out of range (past 2^63)" : NULL;
  return *why ? -1 : neg ? -v : v;
}

/* Adds a regular member to the current group or starts a new sample. */
/* A member with no field to go to (past the dataset's distinct fields, a name too long, 4 GiB or
 * more) is left out: said once per shard, and the shard is not cached so that every open says so. */
static int left_out(const dl__dataset *ds, group *g, uint32_t file, const char *name, const char *why) {
  if (!g->fields_left_out)
    dl__log(DL__LOG_WARN, "shard %s member %s: left out, %s", ds->files[file], name, why);
  g->fields_left_out = true;
  return 0;
}

static int add_member(dl__dataset *ds, group *g, uint32_t file, const char *name, uint64_t off,
                      uint64_t size, reader *r) {
  const char *base = strrchr(name, '/');
  base = base ? base + 1 : name;
  const char *dot = strchr(base, '.');
  if (!dot || base[0] == 0)
    return 0; /* no extension: not a field of any sample */
  if (base[0] == '.') {
    /* A hidden file: macOS tar stores "._000.jpg" (the metadata of 000.jpg) before each member and
     * ".DS_Store" beside them. As WebDataset does, it belongs to no sample; taken as one it split
     * each sample from its label and added one of junk. */
    g->hidden++;
    return 0;
  }
  size_t key_len = (size_t)(dot - name);
  const char *ext = dot + 1;
  uint64_t eh = dl__rfs_checksum(ext, strlen(ext));
  bool repeat = false;
  for (int i = 0; g->open && i < g->next && !repeat; i++)
    repeat = g->ext_hash[i] == eh;
  if (repeat && key_len == g->key_len && !memcmp(name, g->key, key_len))
    /* Two members of one name: WebDataset refuses the shard; here the second starts a sample of
     * its own rather than mixing one sample's image with another's label. */
    dl__log(DL__LOG_WARN, "shard %s: member %s repeats a member of sample %s; it starts a new sample",
            ds->files[file], name, g->key);
  if (repeat || !g->open || key_len != g->key_len || memcmp(name, g->key, key_len)) {
    int rc = flush(ds, g);
    if (rc)
      return rc;
    memcpy(g->key, name, key_len);
    g->key[key_len] = 0;
    g->key_len = key_len;
    g->open = true;
    g->exact_image = false;
    memset(&g->s, 0, sizeof g->s);
    g->s.file = file;
    g->s.label = -1;
    g->span_start = UINT64_MAX;
    g->span_end = 0;
    g->nrefs = 0;
    g->next = 0;
  }
  if (g->next < (int)DL__ARRAY_LEN(g->ext_hash))
    g->ext_hash[g->next++] = eh;
  size_t elen = strlen(ext);
  bool zst = elen > 4 && !strcasecmp(ext + elen - 4, ".zst");
  size_t stem = zst ? elen - 4 : elen; /* the extension without a trailing .zst */
  char plain[NAME_MAX_LEN];
  snprintf(plain, sizeof plain, "%.*s", (int)stem, ext);
  int codec = dl__codec_of_ext(plain); /* "jpg.zst" is a zstd-compressed JPEG */
  bool exact = strchr(plain, '.') == NULL;
  bool npy = stem >= 3 && !strncasecmp(ext + stem - 3, "npy", 3) && (stem == 3 || ext[stem - 4] == '.');
  if (codec != DL__CODEC_NONE && (g->s.codec == DL__CODEC_NONE || (exact && !g->exact_image))) {
    g->s.codec = (uint8_t)codec;
    g->s.flags = zst ? DL__SAMPLE_IMAGE_ZST : 0;
    g->image_off = off;
    g->image_size = size;
    widen(g, off, size);
    g->exact_image = exact;
    snprintf(g->image_name, sizeof g->image_name, "%s", name);
  } else if (npy) {
    /* "depth.npy" is field "depth"; a bare "npy" member is field "npy"; ".zst" means zstd. */
    size_t flen = stem == 3 ? 3 : stem - 4;
    int f = g->nrefs < DL__MAX_FIELDS ? dl__dataset_field(ds, ext, flen) : -1;
    if (f < 0)
      return left_out(ds, g, file, name, dl__field_refusal(ds, flen));
    g->refs[g->nrefs] = (dl__fref){.name = (uint16_t)f, .kind = zst ? DL__REF_NPY_ZST : DL__REF_NPY,
                                   .len = (uint32_t)(size < UINT32_MAX ? size : UINT32_MAX)};
    g->ref_off[g->nrefs++] = off;
    widen(g, off, size);
  } else if (!strcasecmp(ext, "cls") && size <= 64) {
    const uint8_t *p = read_at(r, off, (size_t)size);
    if (!p && r->err)
      return r->err;
    const char *why = "cannot be read";
    if (p)
      g->s.label = dl__parse_label(p, (size_t)size, &why);
    if (why) {
      g->s.label = -1;
      if (!g->bad_labels++)
        snprintf(g->bad_label, sizeof g->bad_label, "member %.300s: label %s", name, why);
    }
  } else if (size < UINT32_MAX) {
    /* Any other member (a caption, JSON, a second image) is field EXT, delivered as its bytes:
     * "000123.caption.txt" is field "caption.txt", as WebDataset names it. A sample's fields
     * have distinct names (a repeated one starts a new sample), so one past DL__MAX_FIELDS
     * refs is past the distinct names too. */
    int f = g->nrefs < DL__MAX_FIELDS ? dl__dataset_field(ds, ext, strlen(ext)) : -1;
    if (f < 0)
      return left_out(ds, g, file, name, dl__field_refusal(ds, strlen(ext)));
    g->refs[g->nrefs] = (dl__fref){.name = (uint16_t)f, .kind = DL__REF_BYTES, .len = (uint32_t)size};
    g->ref_off[g->nrefs++] = off;
    widen(g, off, size);
  } else {
    return left_out(ds, g, file, name, "it is 4 GiB or larger");
  }
  return 0;
}

static bool label_only(const dl__sample *s) { return s->codec == DL__CODEC_NONE && s->nrefs == 0 && s->label != -1; }

/*
 * A shard written as "tar cf x.tar *.jpg *.cls" keeps each label far from its image, so the members
 * of one key make two samples. A label is read while indexing, so a sample that holds only a label
 * is folded into the other sample of its key and dropped. Anything else apart from its key's first
 * members cannot be joined to them (the sample's bytes would span the shard between): named, and
 * NAMED set. Samples FIRST.. of the dataset are this shard's.
 */
static int regroup(dl__dataset *ds, size_t first, const char *shard, bool *named) {
  size_t n = ds->n - first, cap = 16;
  *named = false;
  if (n == 0)
    return 0;
  while (cap < 2 * n)
    cap *= 2;
  uint32_t *slot = calloc(cap, sizeof *slot); /* index + 1 of the first sample of each key; 0: empty */
  if (!slot)
    return -ENOMEM;
  dl__sample *sm = ds->samples + first;
  size_t kept = 0, folded = 0, apart = 0;
  const char *example = NULL;
  for (size_t i = 0; i < n; i++) {
    const char *key = ds->pool + sm[i].key;
    size_t h = (size_t)dl__rfs_checksum(key, strlen(key)) & (cap - 1);
    while (slot[h] && strcmp(ds->pool + sm[slot[h] - 1].key, key))
      h = (h + 1) & (cap - 1);
    if (!slot[h]) {
      sm[kept] = sm[i];
      slot[h] = (uint32_t)++kept;
      continue;
    }
    dl__sample *at = &sm[slot[h] - 1];
    if (label_only(&sm[i]) && at->label == -1) {
      at->label = sm[i].label;
      folded++;
      continue;
    }
    if (label_only(at) && sm[i].label == -1) {
      int64_t label = at->label;
      *at = sm[i];
      at->label = label;
      folded++;
      continue;
    }
    if (slot[h] != kept) { /* not the sample just before: a repeated member is named where it is read */
      apart++;
      example = example ? example : key;
    }
    sm[kept++] = sm[i];
  }
  free(slot);
  ds->n = first + kept;
  *named = apart > 0;
  if (folded)
    dl__log(DL__LOG_INFO, "shard %s: %zu labels stood apart from the rest of their samples' members; joined to them",
            shard, folded);
  if (apart)
    dl__log(DL__LOG_WARN, "shard %s: the members of %zu samples are not next to each other (sample %s): each run of "
            "them is a sample of its own; write each sample's members together (tar --sort=name, or ringfeed's "
            "Writer)", shard, apart, example);
  return 0;
}

/* Why a file whose first block is no tar header is not a shard: a compressed file that is not read
 * (xz, or compressed data left after a shard's own decompression: compressed twice), or not a tar
 * at all. Gzip, zstd and bzip2 tars are read through copies (dl__tar_load, dl__tar_load_fetched),
 * so the scan sees their data only inside another's. */
static const char *not_a_tar(const uint8_t *h, int *code) {
  static const struct {
    const char *magic;
    size_t n;
    const char *why;
  } kinds[] = {
      {"\x1f\x8b", 2, "gzip-compressed data where the tar should begin (compressed twice?): decompress it "
                      "to the tar"},
      {"\x28\xb5\x2f\xfd", 4, "zstd-compressed data where the tar should begin (compressed twice?): "
                              "decompress it to the tar"},
      {"\xfd" "7zXZ", 5, "an xz-compressed file, not a tar: shards are read uncompressed, or gzip, zstd or bzip2 "
                         "compressed (unxz it)"},
      {"BZh", 3, "bzip2-compressed data where the tar should begin (compressed twice?): decompress it to the "
                 "tar"},
      {"PK\x03\x04", 4, "a zip archive, not a tar"},
  };
  *code = DL_EUNSUPPORTED;
  for (size_t i = 0; i < DL__ARRAY_LEN(kinds); i++)
    if (!memcmp(h, kinds[i].magic, kinds[i].n))
      return kinds[i].why;
  *code = DL_ECORRUPT;
  return "not a tar archive (its first block is no tar header)";
}

int dl__tar_scan(dl__dataset *ds, uint32_t file, int fd, uint64_t file_size, int on_error) {
  const char *shard = ds->files[file];
  size_t first = ds->n;
  uint64_t links = 0, sparse_files = 0;
  char link_example[320] = "", sparse_example[320] = "";
  reader r = {.fd = fd, .size = file_size, .win = malloc(WINDOW)};
  group *g = calloc(1, sizeof *g);
  char *long_name = malloc(NAME_MAX_LEN), *name = malloc(NAME_MAX_LEN);
  pax *x = malloc(sizeof *x);
  int rc = 0;
  if (!r.win || !g || !long_name || !name || !x) {
    rc = dl__fail(-ENOMEM, "out of memory scanning %s", shard);
    goto done;
  }
  long_name[0] = 0;
  pax_reset(x);
  uint64_t off = 0;
  const char *damage = NULL, *not_tar = NULL;
  int not_tar_code = 0;
  while (off + BLOCK <= file_size) {
    const uint8_t *h = read_at(&r, off, BLOCK);
    if (!h && r.err)
      break;
    if (!h) {
      damage = "the file ends early";
      break;
    }
    if (is_zero_block(h))
      break;
    if (!checksum_ok(h)) {
      damage = "bad header checksum";
      if (off == 0)
        not_tar = not_a_tar(h, &not_tar_code);
      break;
    }
    int64_t size = parse_number(h + 124, 12);
    if (x->size >= 0)
      size = x->size;
    if (size < 0) {
      damage = "bad size field";
      break;
    }
    uint64_t data = off + BLOCK;
    uint64_t next = data + (((uint64_t)size + BLOCK - 1) / BLOCK) * BLOCK;
    char type = (char)h[156];
    if (type == 'L' || type == 'x') {
      if (data + (uint64_t)size > file_size) {
        damage = "extended header runs past the end";
        break;
      }
      if ((uint64_t)size > WINDOW) {
        /* pax records of extended attributes (GNU tar --xattrs, macOS tar) run to some KiB. */
        damage = "extended header over 256 KiB";
        break;
      }
      const uint8_t *p = read_at(&r, data, (size_t)size);
      if (!p && r.err)
        break;
      if (!p) {
        damage = "extended header unreadable";
        break;
      }
      if (type == 'L') {
        size_t n = strnlen((const char *)p, (size_t)size);
        if (n == 0 || n >= NAME_MAX_LEN) {
          damage = "bad GNU long name";
          break;
        }
        memcpy(long_name, p, n);
        long_name[n] = 0;
      } else if (parse_pax(p, (size_t)size, x)) {
        damage = "bad pax header";
        break;
      }
      off = next;
      continue;
    }
    if (x->path[0])
      snprintf(name, NAME_MAX_LEN, "%s", x->path);
    else if (long_name[0])
      snprintf(name, NAME_MAX_LEN, "%s", long_name);
    else if (!memcmp(h + 257, "ustar\0", 6) && h[345])
      snprintf(name, NAME_MAX_LEN, "%.155s/%.100s", (const char *)h + 345, (const char *)h);
    else
      snprintf(name, NAME_MAX_LEN, "%.100s", (const char *)h);
    long_name[0] = 0;
    bool sparse = type == 'S' || x->sparse;
    pax_reset(x);
    if (type == 'S' && h[482]) {
      /* GNU's old sparse format continues the header's map in further blocks before the data. */
      bool more = true;
      while (more && data + BLOCK <= file_size) {
        const uint8_t *ext = read_at(&r, data, BLOCK);
        if (!ext)
          break;
        more = ext[504] != 0;
        data += BLOCK;
      }
      next = data + (((uint64_t)size + BLOCK - 1) / BLOCK) * BLOCK;
      if (more) {
        if (r.err)
          break;
        damage = "sparse member's map runs past the end";
        break;
      }
    }
    if (sparse) {
      /* Holes are not in the shard's bytes: reading them as the file would give wrong data. */
      if (!sparse_files++)
        snprintf(sparse_example, sizeof sparse_example, "%.300s", name);
    } else if (type == '0' || type == '\0' || type == '7') {
      const char *member = name[0] == '.' && name[1] == '/' ? name + 2 : name;
      rc = add_member(ds, g, file, member, data, (uint64_t)size, &r);
      if (rc && r.err)
        break;
      if (rc) {
        rc = dl__fail(rc, "out of memory scanning %s", shard);
        goto done;
      }
      if (data + (uint64_t)size > file_size) {
        /* Keep the member: its read fails later with a per-sample error naming it. */
        damage = "member data runs past the end of the file";
        break;
      }
    } else if ((type == '1' || type == '2') && !links++) {
      /* A hard or symbolic link holds no bytes: its sample lacks that member. */
      snprintf(link_example, sizeof link_example, "%.200s -> %.100s", name, (const char *)h + 157);
    }
    off = next;
  }
  /* A failing disk is not a damaged file: nothing of the shard is trusted, whatever on_error says. */
  if (r.err == DL_ECORRUPT) {
    rc = dl__fail(r.err, "shard %s: the file ends at offset %llu while being indexed, before the %llu bytes it had "
                  "when opened (truncated meanwhile)", shard, (unsigned long long)r.ended_at,
                  (unsigned long long)file_size);
    goto done;
  }
  if (r.err) {
    rc = dl__fail(r.err, "shard %s: read error at offset %llu while indexing it: %s", shard, (unsigned long long)off,
                  strerror(-r.err));
    goto done;
  }
  if (!damage && off + BLOCK > file_size && off < file_size)
    damage = "trailing partial block";
  bool apart = false;
  rc = flush(ds, g);
  if (!rc)
    rc = regroup(ds, first, shard, &apart);
  if (rc) {
    rc = dl__fail(rc, "out of memory scanning %s", shard);
    goto done;
  }
  if (links)
    dl__log(DL__LOG_WARN, "shard %s: %llu members are links, not files (%s): links are not followed, so their "
            "samples lack them; make the shard with tar --dereference --hard-dereference", shard,
            (unsigned long long)links, link_example);
  if (sparse_files)
    dl__log(DL__LOG_WARN, "shard %s: %llu %s (%s), whose holes tar leaves out of the shard: not read, so their "
            "samples lack them; make the shard without tar --sparse (-S)", shard, (unsigned long long)sparse_files,
            sparse_files == 1 ? "member is a sparse file" : "members are sparse files", sparse_example);
  if (g->bad_labels)
    dl__log(DL__LOG_WARN, "shard %s: %llu .cls member%s hold%s no integer label, and -1 is used (%s)", shard,
            (unsigned long long)g->bad_labels, g->bad_labels == 1 ? "" : "s", g->bad_labels == 1 ? "s" : "",
            g->bad_label);
  if (g->hidden)
    dl__log(DL__LOG_INFO, "shard %s: %llu hidden members (such as macOS's ._NAME and .DS_Store) belong to no "
            "sample; left out", shard, (unsigned long long)g->hidden);
  if (not_tar) {
    if (on_error == DL__ON_ERROR_FAIL) {
      rc = dl__fail(not_tar_code, "shard %s: %s", shard, not_tar);
      goto done;
    }
    dl__log(DL__LOG_WARN, "shard %s: %s; no samples from it", shard, not_tar);
    if (!ds->skipped_shard[0])
      snprintf(ds->skipped_shard, sizeof ds->skipped_shard, "shard %s: %s", shard, not_tar);
    rc = 1;
  } else if (damage) {
    if (on_error == DL__ON_ERROR_FAIL) {
      rc = dl__fail(DL_ECORRUPT, "shard %s: %s at offset %llu (truncated or corrupt tar)", shard,
                    damage, (unsigned long long)off);
      goto done;
    }
    dl__log(DL__LOG_WARN, "shard %s: %s at offset %llu; keeping the members before it", shard,
            damage, (unsigned long long)off);
    rc = 1; /* usable, but not worth caching */
  } else if (links || sparse_files || apart || g->fields_left_out || g->bad_labels) {
    rc = 1; /* not cached, so that every open says what is wrong with it */
  }
done:
  free(r.win);
  free(g);
  free(long_name);
  free(name);
  free(x);
  return rc;
}

/* ---- compressed shards ---- */

const char *dl__tar_compression(const uint8_t *h, size_t n) {
  if (n < 10 || (n >= BLOCK && checksum_ok(h)))
    return NULL;
  bool bzip2 = !memcmp(h, "BZh", 3) && h[3] >= '1' && h[3] <= '9' &&
               (!memcmp(h + 4, "1AY&SY", 6) || !memcmp(h + 4, "\x17\x72\x45\x38\x50\x90", 6));
  return !memcmp(h, "\x1f\x8b", 2) ? "gz" : !memcmp(h, "\x28\xb5\x2f\xfd", 4) ? "zstd" : bzip2 ? "bz2" : NULL;
}

static const char *compression_of(int fd) {
  uint8_t h[BLOCK] = {0};
  int64_t n = dl__pread_full(fd, h, BLOCK, 0);
  return n < 0 ? NULL : dl__tar_compression(h, (size_t)n);
}

typedef struct packed {
  int fd;                  /* the compressed shard, or -1: FETCH gives it (a remote one, downloaded) */
  int (*fetch)(void *arg); /* a descriptor of the compressed bytes, closed after use, or an error */
  void *fetch_arg;
  const char *how, *path;
  uint64_t made;
} packed;

static int unpack_shard(int fd, uint64_t most, void *arg) {
  packed *p = arg;
  int in = p->fd >= 0 ? p->fd : p->fetch(p->fetch_arg);
  if (in < 0)
    return in;
  int rc = dl__unpack(in, p->how, 0, most, fd, "shard", p->path, &p->made);
  if (in != p->fd)
    close(in);
  return rc;
}

/*
 * A compressed tar shard (gzip, zstd or bzip2, as WebDataset writes .tar.gz) is read from an
 * uncompressed copy, for random access: kept in cache_dir when one is given (made once, for later
 * opens and the host's other ranks), else a temporary file made at every open. Neither may grow
 * past the room for it (cache_limit, or what the disk had free less a tenth): nothing bounds a
 * tar's size but that. A remote one is fetched only where no kept copy serves.
 */
static int uncompressed_copy(packed *p, const dl__shard_id *id, const dl__options *o, int *copy,
                             uint64_t *size) {
  *copy = -1;
  const char *path = p->path;
  int fd = -1;
  if (o->cache_dir[0] && id) {
    uint64_t version = dl__rfs_checksum(id, sizeof *id);
    fd = dl__shard_cache_keep_unsized(o, path, version, unpack_shard, p);
    if (fd == -EBUSY || fd == -ENOSPC || fd == DL_ELIMIT) /* a copy larger than the cache: as a remote shard */
      dl__log(DL__LOG_INFO, "shard %s: its uncompressed copy is not kept in cache_dir (%s); a temporary one is made",
              path, fd == -EBUSY ? "another process is making it" : "no room within cache_limit");
    else if (fd < 0 && fd != DL_ECORRUPT) /* damaged: a temporary copy holds what comes before the damage */
      return fd;
  }
  bool damaged = false;
  if (fd < 0) {
    if ((fd = dl__scratch_file(0, path)) < 0)
      return fd;
    struct statvfs v; /* a temporary copy leaves the disk a tenth of what it had free */
    uint64_t room = fstatvfs(fd, &v) ? UINT64_MAX : (uint64_t)((double)v.f_bavail * (double)v.f_frsize * 0.9);
    int rc = unpack_shard(fd, room, p);
    /* Damaged or cut short: the members before the damage are read, as from a truncated tar. */
    damaged = rc == DL_ECORRUPT && o->on_error != DL__ON_ERROR_FAIL;
    if (rc && !damaged) {
      close(fd);
      const char *tmp = getenv("TMPDIR");
      return rc != DL_ELIMIT ? rc
                             : dl__fail(rc, "shard %s: its uncompressed copy does not fit in %s (%llu bytes free, "
                                        "less a tenth): give cache_dir= on a larger disk, or decompress it there once",
                                        path, tmp && *tmp ? tmp : "/tmp", (unsigned long long)(room / 9 * 10));
    }
    if (!o->cache_dir[0] && !damaged)
      dl__log(DL__LOG_INFO, "shard %s: decompressed into a temporary copy (%llu bytes); cache_dir= keeps such "
              "copies for later opens", path, (unsigned long long)p->made);
  }
  struct stat st;
  if (fstat(fd, &st)) {
    int e = errno;
    close(fd);
    return dl__fail(-e, "shard %s: its uncompressed copy: %s", path, strerror(e));
  }
  *copy = fd;
  *size = (uint64_t)st.st_size;
  return damaged;
}

int dl__tar_uncompressed(int in, const char *path, const dl__shard_id *id, const dl__options *o, int *copy,
                         uint64_t *size) {
  *copy = -1;
  packed p = {.fd = in, .how = compression_of(in), .path = path};
  return p.how ? uncompressed_copy(&p, id, o, copy, size) : 0;
}

/* A shard is scanned under its flock, so that the host's ranks, which open the same shards at once,
 * scan each once: the one that finds it held reads the index its holder writes. A file system
 * without flock locks nothing, and every rank scans, as before. This takes FD's lock where it is
 * free, and says whether another process holds it. */
static bool held_elsewhere(int fd) {
  return flock(fd, LOCK_EX | LOCK_NB) && errno == EWOULDBLOCK;
}

/* FD's lock, waited for while another process holds it, though no longer than a minute (a scan takes
 * far less, even of a shard read whole from a disk): false where it is not had. */
static bool lock_for_scan(int fd) {
  for (double t0 = dl__now(); held_elsewhere(fd);) {
    if (dl__now() - t0 > 60)
      return false;
    usleep(1000);
  }
  return true;
}

/* FILE's sample table: from the index cache where it holds version ID, else scanned from its
 * descriptor (SIZE bytes) and cached, unless DAMAGED (so that every open says what is wrong). */
static int index_tar(dl__dataset *ds, uint32_t file, const char *path, const dl__shard_id *id, uint64_t size,
                     bool damaged, const dl__options *o) {
  if (!damaged && dl__index_file_read(ds, file, path, id) == 0)
    return 0;
  size_t first = ds->n;
  int rc = dl__tar_scan(ds, file, ds->fds[file], size, o->on_error);
  if (rc < 0)
    return rc;
  if (rc == 0 && !damaged)
    dl__index_file_write(ds, first, path, id);
  return 0;
}

/* A local tar's sample table, as index_tar gives it, but scanned under the shard's lock: where a
 * rank scans it at the moment, its index is waited for and read instead. Only the shard itself is
 * locked so: an uncompressed copy in cache_dir carries the cache's shared lock for as long as it is
 * read, which this lock would wait for and then drop. */
static int index_local_tar(dl__dataset *ds, uint32_t file, const char *path, const dl__shard_id *id,
                           uint64_t size, const dl__options *o) {
  if (dl__index_file_read(ds, file, path, id) == 0)
    return 0;
  int fd = ds->fds[file];
  bool locked = lock_for_scan(fd);
  int rc = index_tar(ds, file, path, id, size, false, o); /* reads the holder's index, if it wrote one */
  if (locked)
    flock(fd, LOCK_UN); /* the descriptor stays open for the loader's reads */
  return rc;
}

/* FILE read through the uncompressed copy of P: the index cache is kept by the compressed
 * object's identity ID (its copies are all the same tar). */
static int load_copy(dl__dataset *ds, uint32_t file, packed *p, dl__shard_id *id, const dl__options *o) {
  int copy;
  uint64_t size;
  double t0 = dl__now();
  int rc = uncompressed_copy(p, id, o, &copy, &size);
  if (rc < 0)
    return rc;
  bool damaged = rc == 1;
  if (damaged) {
    dl__log(DL__LOG_WARN, "%s; keeping the members before it", dl_last_error());
    if (!ds->skipped_shard[0])
      snprintf(ds->skipped_shard, sizeof ds->skipped_shard, "%s", dl_last_error());
  }
  if (ds->fds[file] >= 0)
    close(ds->fds[file]);
  ds->fds[file] = copy;
  ds->unpacked++;
  id->data_size = size;
  struct stat st; /* a temporary copy has no name; a kept one is in cache_dir */
  if (!fstat(copy, &st) && st.st_nlink == 0) {
    ds->unpacked_temp++;
    ds->unpacked_temp_bytes += size;
    ds->unpacked_temp_s += dl__now() - t0;
  }
  return index_tar(ds, file, p->path, id, size, damaged, o);
}

/* PATH's index file written ahead of its load, on a helper thread of dl__source_load, where PATH is
 * an uncompressed tar without one: scanned here, saying nothing, and saved only from a scan that had
 * nothing to say (no damage, links, holes or notes), so that the load still says what it finds.
 * A shard another process scans at the moment is left to it: the load waits for its index. True
 * where it scanned PATH. */
bool dl__tar_index_ahead(const char *path, const dl__options *o) {
  dl__dataset ds = {0};
  uint32_t file;
  uint64_t size;
  dl__shard_id id;
  unsigned said = 0;
  bool scanned = false;
  dl__log_hold(&said);
  if (!dl__dataset_open_file(&ds, path, &file, &size, &id) && !compression_of(ds.fds[file]) &&
      !dl__index_file_current(path, &id) && !held_elsewhere(ds.fds[file]) &&
      !dl__index_file_current(path, &id)) { /* again: written between the first look and the lock */
    scanned = true;
    if (!dl__tar_scan(&ds, file, ds.fds[file], size, o->on_error) && !said) /* 1: damaged, or notes */
      dl__index_file_write(&ds, 0, path, &id);
  }
  dl__log_hold(NULL);
  dl__dataset_free(&ds);
  return scanned;
}

int dl__tar_load(dl__dataset *ds, const char *path, const dl__options *o) {
  uint32_t file;
  uint64_t size;
  dl__shard_id id;
  int rc = dl__dataset_open_file(ds, path, &file, &size, &id);
  if (rc)
    return rc;
  packed p = {.fd = ds->fds[file], .how = compression_of(ds->fds[file]), .path = path};
  return p.how ? load_copy(ds, file, &p, &id, o) : index_local_tar(ds, file, path, &id, size, o);
}

int dl__tar_load_fetched(dl__dataset *ds, uint32_t file, const char *how, dl__shard_id *id,
                         int (*fetch)(void *arg), void *arg, const dl__options *o) {
  packed p = {.fd = -1, .fetch = fetch, .fetch_arg = arg, .how = how, .path = ds->files[file]};
  return load_copy(ds, file, &p, id, o);
}

/* ---- a remote shard, and verifying ---- */

static int scan_tar(dl__dataset *ds, uint32_t file, int fd, uint64_t size, void *on_error) {
  return dl__tar_scan(ds, file, fd, size, *(const int *)on_error);
}

typedef struct whole {
  dl__probe *p;
  const dl__options *o;
} whole;

static int fetch_whole(void *arg) {
  const whole *w = arg;
  return dl__probe_copy(w->p, w->o);
}

/* A remote tar: indexed from one download (its index saved by the object's version), its members
 * read by the workers' ranged requests. A compressed one (HOW: gzip, zstd or bzip2, as WebDataset
 * writes .tar.gz) is read as a local one is, from an uncompressed copy made at open (kept in
 * cache_dir by the object's version, so that later opens fetch nothing), downloaded whole for it,
 * of the version probed. */
static int tar_open_remote(dl__dataset *ds, const char *url, const dl__options *o, dl__probe *p) {
  size_t n;
  const uint8_t *head = dl__probe_head(p, &n);
  const char *how = dl__tar_compression(head, n);
  if (!how)
    return dl__probe_scan(ds, p, o, scan_tar, (void *)&o->on_error, 0);
  uint32_t file;
  whole w = {p, o};
  int rc = dl__dataset_add_file(ds, url, &file);
  if (!rc)
    rc = dl__tar_load_fetched(ds, file, how, dl__probe_id(p), fetch_whole, &w, o);
  uint64_t version = dl__probe_version(p);
  if (!rc) /* the copy has no identity of its own to name the GPU check's verdicts by */
    dl__dataset_file_named(ds, file, &version, sizeof version);
  return rc;
}

static int tar_verify(const char *path, int packed, uint64_t size, dl__checker *c, dl__verified *n, FILE *out) {
  /* A compressed shard is checked through a temporary uncompressed copy, as the loader reads it;
   * damage to its compressed data is a bad record, and what came before it is checked. */
  dl__options o;
  dl__options_parse(&o, "on_error=skip");
  int copy, fd = packed;
  int rc = dl__tar_uncompressed(packed, path, NULL, &o, &copy, &size);
  if (rc) {
    fprintf(out, "%s\n", dl_last_error());
    n->bad++;
    if (copy < 0)
      return 0;
  }
  if (copy >= 0)
    fd = copy;
  dl__dataset ds = {0};
  uint32_t file;
  dl__dataset_add_file(&ds, path, &file);
  rc = dl__tar_scan(&ds, file, fd, size, DL__ON_ERROR_FAIL);
  if (rc < 0) {
    fprintf(out, "%s\n", dl_last_error());
    n->bad++;
  }
  ds.fds[file] = -1; /* the caller closes fd */
  dl__buf buf = {0};
  bool has_images = dl__any_image(&ds);
  for (size_t i = 0; i < ds.n; i++) {
    const dl__sample *s = &ds.samples[i];
    dl__err e = {0};
    if (dl__verify_sample(c, &ds, s, has_images, fd, &buf, &e)) {
      fprintf(out, "%s: member %s (offset %llu): %s\n", path, ds.pool + s->name, (unsigned long long)s->offset,
              e.msg);
      n->bad++;
    }
  }
  dl__buf_free(&buf);
  dl__dataset_free(&ds);
  if (copy >= 0)
    close(copy);
  return 0;
}

static bool tar_by_bytes(const uint8_t *head, size_t n) {
  (void)head, (void)n;
  return true; /* asked last: what no other format takes is read as a tar */
}

const dl__format dl__tar_format = {.name = "tar", .what = "tar", .by_bytes = tar_by_bytes, .open = dl__tar_load,
                                   .open_remote = tar_open_remote, .verify = tar_verify};
