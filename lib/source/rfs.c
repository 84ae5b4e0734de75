/*
 * Reading ringfeed shards (docs/format.md): the trailer, then the index, every count and offset
 * checked against the file before use. Records become samples whose image is the "image" field
 * (or the first JPEG/PNG field); workers check each record's checksum when they read it.
 */
#include "source/source.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

/* text and json: bytes whose kind the reader is told (a caption, a JSON document), as an MDS
 * column's str and json encodings say it. */
/* The codecs of fields that are not images; an image field's is its codec's (decode/codecs.c). */
static const char *const field_codecs[DL__RFS_CODECS] = {
    [DL__RFS_RAW] = "raw", [DL__RFS_ZSTD] = "zstd", [DL__RFS_BYTES] = "bytes", [DL__RFS_TEXT] = "text",
    [DL__RFS_JSON] = "json"};

const char *dl__rfs_codec_name(int c) {
  if (c < 0 || c >= DL__RFS_CODECS)
    return NULL;
  const dl__codec *image = dl__codec_of_rfs(c);
  return field_codecs[c] ? field_codecs[c] : image ? image->name : NULL;
}


#define TRAILER 32
#define HEADER 64
#define RECORD_ENTRY 34
#define FIELD_ENTRY 20

static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint16_t get16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}

void dl__rfs_free(dl__rfs *r) {
  for (uint32_t i = 0; r->names && i < r->nnames; i++)
    free(r->names[i]);
  free(r->names);
  free(r->records);
  free(r->fields);
  free(r->keys);
  for (uint32_t i = 0; r->classes && i < r->nclasses; i++)
    free(r->classes[i]);
  free(r->classes);
  memset(r, 0, sizeof *r);
}

#define BAD(...)                                                                                   \
  do {                                                                                             \
    snprintf(why, cap, __VA_ARGS__);                                                               \
    return DL_ECORRUPT;                                                                            \
  } while (0)

int dl__rfs_parse_index(dl__rfs *r, const uint8_t *p, size_t n, uint64_t first, uint64_t index_offset,
                        char *why, size_t cap) {
  size_t at = 0;
  if (n < 28 || memcmp(p, "RFINDEX1", 8))
    BAD("index magic missing");
  uint64_t nrec = get64(p + 8);
  uint32_t nnames = get32(p + 16);
  at = 20;
  if (nnames > 65535 || nnames > n)
    BAD("index names %u more than the index holds", nnames);
  r->names = calloc(nnames ? nnames : 1, sizeof *r->names);
  if (!r->names)
    return -ENOMEM;
  r->nnames = nnames;
  for (uint32_t i = 0; i < nnames; i++) {
    if (at + 2 > n)
      BAD("index ends inside the field names");
    uint16_t len = get16(p + at);
    at += 2;
    if (len == 0 || at + len > n)
      BAD("field name %u has a bad length", i);
    if (!(r->names[i] = strndup((const char *)p + at, len)))
      return -ENOMEM;
    at += len;
  }
  if (at + 8 > n)
    BAD("index ends before the keys");
  uint64_t klen = get64(p + at);
  at += 8;
  if (klen > n - at)
    BAD("key blob of %llu bytes runs past the index", (unsigned long long)klen);
  if (klen && p[at + klen - 1] != 0)
    BAD("key blob is not terminated");
  r->keys = malloc(klen ? klen : 1);
  if (!r->keys)
    return -ENOMEM;
  memcpy(r->keys, p + at, klen);
  r->keys_len = klen;
  at += klen;
  if (nrec > (n - at) / RECORD_ENTRY)
    BAD("%llu records claimed, the index holds fewer", (unsigned long long)nrec);
  r->nrecords = nrec;
  r->records = calloc(nrec ? nrec : 1, sizeof *r->records);
  size_t fcap = 16;
  r->fields = malloc(fcap * sizeof *r->fields);
  if (!r->records || !r->fields)
    return -ENOMEM;
  for (uint64_t i = 0; i < nrec; i++) {
    if (at + RECORD_ENTRY > n)
      BAD("index ends inside record %llu", (unsigned long long)i);
    dl__rfs_record *rec = &r->records[i];
    const uint8_t *e = p + at;
    rec->offset = get64(e);
    rec->size = get32(e + 8);
    rec->key = get32(e + 12);
    rec->label = (int64_t)get64(e + 16);
    rec->checksum = get64(e + 24);
    rec->nfields = get16(e + 32);
    at += RECORD_ENTRY;
    if (rec->offset < first || rec->offset > index_offset || rec->size > index_offset - rec->offset)
      BAD("record %llu lies outside the data area", (unsigned long long)i);
    if (r->align > 1 && rec->offset % r->align)
      BAD("record %llu is not aligned to %u", (unsigned long long)i, r->align);
    if (rec->key >= klen)
      BAD("record %llu has a key outside the key blob", (unsigned long long)i);
    if ((size_t)rec->nfields * FIELD_ENTRY > n - at)
      BAD("record %llu's fields run past the index", (unsigned long long)i);
    rec->first_field = r->nfields_total;
    for (uint16_t f = 0; f < rec->nfields; f++, at += FIELD_ENTRY) {
      if (r->nfields_total == fcap) {
        fcap *= 2;
        dl__rfs_field *nf = realloc(r->fields, fcap * sizeof *nf);
        if (!nf)
          return -ENOMEM;
        r->fields = nf;
      }
      dl__rfs_field *fd = &r->fields[r->nfields_total++];
      const uint8_t *q = p + at;
      fd->name = get16(q);
      fd->codec = q[2];
      fd->scan = q[3] == DL__RFS_SCAN_CLEAN ? DL__RFS_SCAN_CLEAN : 0; /* other values: a later version's */
      fd->offset = get32(q + 4);
      fd->size = get32(q + 8);
      fd->raw_size = get64(q + 12);
      if (fd->name >= nnames || !dl__rfs_codec_name(fd->codec) || fd->offset > rec->size ||
          fd->size > rec->size - fd->offset)
        BAD("record %llu field %u is malformed", (unsigned long long)i, f);
    }
  }
  if (at != n)
    BAD("%zu bytes after the last index entry", n - at);
  return 0;
}

/* The class table's N bytes at P (docs/format.md): the names of the shard's labels, as the
 * ImageFolder it was made from had them. What is read before a fault is freed with R. */
static int parse_classes(dl__rfs *r, const uint8_t *p, size_t n, char *why, size_t cap) {
  if (memcmp(p, "RFCLASS1", 8))
    BAD("class table magic missing");
  size_t at = 12, end = n - 8;
  if (dl__rfs_checksum(p, end) != get64(p + end))
    BAD("class table checksum mismatch");
  uint32_t count = get32(p + 8);
  if (count > (end - at) / 3) /* each name takes 3 bytes or more */
    BAD("class table claims %u names, it holds fewer", count);
  if (!(r->classes = calloc(count ? count : 1, sizeof *r->classes)))
    return -ENOMEM;
  for (uint32_t i = 0; i < count; i++) {
    uint16_t len = at + 2 <= end ? get16(p + at) : 0;
    at += 2;
    if (len == 0 || len > end - at || memchr(p + at, 0, len))
      BAD("class table name %u is empty, holds a NUL or runs past the table", i);
    r->nclasses = i + 1;
    if (!(r->classes[i] = strndup((const char *)p + at, len)))
      return -ENOMEM;
    at += len;
  }
  if (at != end)
    BAD("%zu bytes after the last class name", end - at);
  return 0;
}

/* The class table the header places at OFF (SIZE bytes), between the records (from FIRST) and
 * the index at IOFF. */
static int read_classes(dl__rfs *r, int fd, uint64_t off, uint64_t size, uint64_t first, uint64_t ioff, char *why,
                        size_t cap) {
  if (off < first || off > ioff || size < 20 || size > ioff - off || size > DL__RFS_CLASS_TABLE_MAX)
    BAD("class table at %llu (%llu bytes) lies outside the data area", (unsigned long long)off,
        (unsigned long long)size);
  uint8_t *p = malloc(size);
  if (!p)
    return -ENOMEM;
  int64_t got = dl__pread_full(fd, p, size, off);
  int rc = got == (int64_t)size ? parse_classes(r, p, size, why, cap) : DL_ECORRUPT;
  if (got != (int64_t)size)
    snprintf(why, cap, "cannot read the class table: %s", got < 0 ? strerror((int)-got) : "the file ends early");
  free(p);
  return rc;
}

int dl__rfs_open(dl__rfs *r, int fd, uint64_t file_size, char *why, size_t cap) {
  memset(r, 0, sizeof *r);
  uint8_t head[HEADER], tail[TRAILER];
  if (file_size < HEADER + TRAILER)
    BAD("file of %llu bytes is too short", (unsigned long long)file_size);
  int64_t got_head = dl__pread_full(fd, head, HEADER, 0), got_tail = dl__pread_full(fd, tail, TRAILER, file_size - TRAILER);
  if (got_head != HEADER || got_tail != TRAILER)
    BAD("cannot read header and trailer: %s", got_head < 0   ? strerror((int)-got_head)
                                              : got_tail < 0 ? strerror((int)-got_tail)
                                                             : "the file ends early (truncated?)");
  if (memcmp(head, DL__RFS_MAGIC, 8) || get32(head + 8) != 1)
    BAD("not a version-1 ringfeed shard");
  r->align = get32(head + 12);
  if (r->align == 0 || r->align > (1u << 20) || (r->align & (r->align - 1)))
    BAD("bad alignment %u", r->align);
  if (memcmp(tail + 24, "RFTAIL1", 8))
    BAD("trailer magic missing (truncated?)");
  uint64_t ioff = get64(tail), isize = get64(tail + 8);
  uint64_t first = r->align > HEADER ? r->align : HEADER;
  if (ioff < first || isize > file_size || ioff != file_size - TRAILER - isize || isize > (1ull << 32))
    BAD("index at %llu (%llu bytes) does not end at the trailer", (unsigned long long)ioff,
        (unsigned long long)isize);
  uint8_t *idx = malloc(isize ? isize : 1);
  if (!idx)
    return -ENOMEM;
  int64_t got = dl__pread_full(fd, idx, isize, ioff);
  if (got != (int64_t)isize) {
    free(idx);
    BAD("cannot read the index: %s", got < 0 ? strerror((int)-got) : "the file ends early (truncated?)");
  }
  int rc;
  if (dl__rfs_checksum(idx, isize) != get64(tail + 16)) {
    snprintf(why, cap, "index checksum mismatch");
    rc = DL_ECORRUPT;
  } else {
    rc = dl__rfs_parse_index(r, idx, isize, first, ioff, why, cap);
  }
  free(idx);
  if (!rc && get64(head + 16)) /* bytes 16-31 were zero before the class table: none */
    rc = read_classes(r, fd, get64(head + 16), get64(head + 24), first, ioff, why, cap);
  if (rc)
    dl__rfs_free(r);
  return rc;
}

/* The records of R as samples of FILE, and the names of their classes where R has them (taken). */
static int add_records(dl__dataset *ds, uint32_t file, dl__rfs *r, const char *path) {
  int rc = 0;
  bool left_out = false, twice = false;
  for (uint64_t i = 0; i < r->nrecords && !rc; i++) {
    uint32_t seen = 0; /* field indexes this record has given a value */
    const dl__rfs_record *rec = &r->records[i];
    dl__sample s = {.offset = rec->offset, .size = rec->size, .checksum = rec->checksum,
                    .label = rec->label, .file = file, .flags = DL__SAMPLE_CHECKSUM};
    const dl__rfs_field *img = NULL;
    s.first_ref = (uint32_t)ds->nrefs;
    for (uint16_t f = 0; f < rec->nfields; f++) {
      const dl__rfs_field *fd_ = &r->fields[rec->first_field + f];
      if (dl__codec_of_rfs(fd_->codec)) {
        if (!img || !strcmp(r->names[fd_->name], "image"))
          img = fd_;
        continue;
      }
      /* Tensors (NPY payloads, stored or zstd) and bytes. Each name once per record, so a record
       * holds at most the DL__MAX_FIELDS a dataset does. */
      const char *fname = r->names[fd_->name];
      int idx = dl__dataset_field(ds, fname, strlen(fname));
      if (idx < 0) {
        if (!left_out)
          dl__log(DL__LOG_WARN, "shard %s record %llu field %s: left out, %s", path, (unsigned long long)i, fname,
                  dl__field_refusal(ds, strlen(fname)));
        left_out = true; /* said once per shard */
        continue;
      }
      if (seen >> idx & 1) {
        /* Another writer's record (ours refuses it): the first value is the one kept. */
        if (!twice)
          dl__log(DL__LOG_WARN, "shard %s record %llu field %s: given twice, the first value kept", path,
                  (unsigned long long)i, fname);
        twice = true;
        continue;
      }
      seen |= 1u << idx;
      bool bytes = fd_->codec == DL__RFS_BYTES || fd_->codec == DL__RFS_TEXT || fd_->codec == DL__RFS_JSON;
      uint8_t kind = fd_->codec == DL__RFS_ZSTD ? DL__REF_NPY_ZST : bytes ? DL__REF_BYTES : DL__REF_NPY;
      /* bytes leaves the kind to the name's extension (caption.txt is text), as for tar members */
      if (fd_->codec != DL__RFS_BYTES && bytes && ds->bytes_kind[idx] == DL__BYTES_BY_NAME)
        ds->bytes_kind[idx] = fd_->codec == DL__RFS_TEXT ? DL__BYTES_TEXT : DL__BYTES_JSON;
      dl__fref ref = {.name = (uint16_t)idx, .kind = kind, .at = fd_->offset, .len = fd_->size};
      if (dl__dataset_add_ref(ds, &ref) == 0)
        s.nrefs++;
    }
    if (img) {
      s.image_at = img->offset;
      s.image_len = img->size;
      s.codec = (uint8_t)dl__codec_of_rfs(img->codec)->id;
      if (img->scan == DL__RFS_SCAN_CLEAN && s.codec == DL__CODEC_JPEG)
        s.flags |= DL__SAMPLE_SCAN_CLEAN;
    }
    const char *key = r->keys + rec->key;
    char name[600];
    snprintf(name, sizeof name, "%.500s (record %llu)", key, (unsigned long long)i);
    s.key = dl__dataset_intern(ds, key, strlen(key));
    s.name = dl__dataset_intern(ds, name, strlen(name));
    if (s.key == UINT32_MAX || s.name == UINT32_MAX || dl__dataset_push(ds, &s))
      rc = dl__fail(-ENOMEM, "out of memory reading %s", path);
  }
  if (!rc && r->classes)
    dl__dataset_classes(ds, &r->classes, r->nclasses, r->nrecords);
  return rc;
}

int dl__rfs_load(dl__dataset *ds, const char *path, int direct) {
  uint32_t file;
  uint64_t size;
  int rc = dl__dataset_open_file(ds, path, &file, &size, NULL);
  if (rc)
    return rc;
  int fd = ds->fds[file];
  dl__rfs r;
  char why[256];
  rc = dl__rfs_open(&r, fd, size, why, sizeof why);
  if (rc)
    return dl__fail(rc, "shard %s: %s", path, rc == -ENOMEM ? "out of memory" : why);
  if (direct && r.align >= 4096) {
    int dfd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (dfd >= 0) {
      close(fd);
      ds->fds[file] = dfd;
      ds->direct[file] = 4096;
    } else {
      dl__log(DL__LOG_INFO, "shard %s: O_DIRECT unavailable here (%s); reading through the page cache",
              path, strerror(errno));
    }
  }
  rc = add_records(ds, file, &r, path);
  dl__rfs_free(&r);
  return rc;
}

int dl__rfs_load_fd(dl__dataset *ds, uint32_t file, int fd, uint64_t size) {
  dl__rfs r;
  char why[256];
  int rc = dl__rfs_open(&r, fd, size, why, sizeof why);
  if (rc)
    return dl__fail(rc, "shard %s: %s", ds->files[file], rc == -ENOMEM ? "out of memory" : why);
  rc = add_records(ds, file, &r, ds->files[file]);
  dl__rfs_free(&r);
  return rc;
}

/* ---- a remote shard, and verifying ---- */

#define RFS_TRAILER 32

static int write_at(int fd, const uint8_t *p, size_t n, uint64_t off) {
  for (size_t done = 0; done < n;) {
    ssize_t w = pwrite(fd, p + done, n - done, (off_t)(off + done));
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return w < 0 ? -errno : -EIO;
    done += (size_t)w;
  }
  return 0;
}

/* A sparse temporary file holding a ringfeed shard's head and index at their places: what
 * parsing its index reads. */
static int rfs_index_copy(dl__probe *p, const dl__options *o) {
  size_t head_len;
  const uint8_t *head = dl__probe_head(p, &head_len);
  uint64_t size = dl__probe_size(p);
  const char *url = dl__probe_name(p);
  if (size < RFS_TRAILER + 64)
    return dl__fail(DL_ECORRUPT, "shard %s: %llu bytes, too short for a ringfeed shard", url, (unsigned long long)size);
  /* One read of the last 256 KiB usually holds the whole index; a larger one takes a second. */
  size_t tail_len = size < (256u << 10) ? (size_t)size : (256u << 10);
  uint64_t tail_at = size - tail_len;
  uint8_t *tail = malloc(tail_len);
  if (!tail)
    return dl__fail(-ENOMEM, "out of memory reading %s", url);
  int rc = dl__probe_range(p, o, tail_at, tail_len, tail);
  uint64_t ioff = rc ? 0 : get64(tail + tail_len - RFS_TRAILER);
  uint64_t isize = rc ? 0 : get64(tail + tail_len - RFS_TRAILER + 8);
  if (!rc && (isize > (1ull << 32) || ioff > size || ioff + isize + RFS_TRAILER != size))
    rc = dl__fail(DL_ECORRUPT, "shard %s: trailer magic or index position wrong (truncated?)", url);
  /* The class table, where the header places one, lies before the index: read from there (a
   * larger one than the reader takes is left unread, and found wanting when the index is parsed). */
  uint64_t from = ioff, classes = head_len >= 32 ? get64(head + 16) : 0;
  if (!rc && classes && classes < ioff && ioff - classes <= DL__RFS_CLASS_TABLE_MAX)
    from = classes;
  uint8_t *more = NULL;
  if (!rc && from < tail_at) {
    more = malloc(tail_at - from);
    rc = more ? dl__probe_range(p, o, from, tail_at - from, more) : dl__fail(-ENOMEM, "out of memory reading %s", url);
  }
  int fd = rc ? -1 : dl__scratch_file(size, url);
  if (!rc && fd < 0)
    rc = fd;
  if (!rc && (write_at(fd, head, head_len, 0) || write_at(fd, tail, tail_len, tail_at) ||
              (more && write_at(fd, more, tail_at - from, from))))
    rc = dl__fail(-EIO, "source %s: cannot write its index to a temporary file", url);
  free(tail);
  free(more);
  if (rc && fd >= 0)
    close(fd);
  return rc ? rc : fd;
}

/* A remote shard: its index read by ranged requests of its end, its records by the workers'. */
static int rfs_open_remote(dl__dataset *ds, const char *url, const dl__options *o, dl__probe *p) {
  (void)url;
  uint32_t file;
  int rc = dl__probe_add(ds, p, &file);
  int fd = rc ? rc : rfs_index_copy(p, o);
  if (fd < 0)
    return fd;
  rc = dl__rfs_load_fd(ds, file, fd, dl__probe_size(p));
  close(fd);
  return rc;
}

/* Whether record I of R has an image field. */
static bool rfs_image(const dl__rfs *r, uint64_t i) {
  for (uint16_t f = 0; f < r->records[i].nfields; f++)
    if (dl__codec_of_rfs(r->fields[r->records[i].first_field + f].codec))
      return true;
  return false;
}

static int rfs_verify(const char *path, int fd, uint64_t size, dl__checker *c, dl__verified *n, FILE *out) {
  dl__rfs r;
  char why[256];
  int rc = dl__rfs_open(&r, fd, size, why, sizeof why);
  if (rc) {
    fprintf(out, "%s: %s\n", path, why);
    n->bad++;
    return 1;
  }
  dl__buf buf = {0};
  bool has_images = false;
  for (uint64_t i = 0; i < r.nrecords && !has_images; i++)
    has_images = rfs_image(&r, i);
  for (uint64_t i = 0; i < r.nrecords; i++) {
    const dl__rfs_record *rec = &r.records[i];
    const char *key = r.keys + rec->key;
    dl__err e = {0};
    if (has_images && !rfs_image(&r, i)) {
      dl__err_set(&e, DL_ENOFIELD, DL__NO_IMAGE);
    } else if (dl__buf_reserve(&buf, rec->size ? rec->size : 1) ||
        pread(fd, buf.p, rec->size, (off_t)rec->offset) != (ssize_t)rec->size) {
      dl__err_set(&e, DL_ECORRUPT, "cannot read the record's %u bytes", rec->size);
    } else if (dl__rfs_checksum(buf.p, rec->size) != rec->checksum) {
      dl__err_set(&e, DL_ECORRUPT, "checksum mismatch");
    } else {
      for (uint16_t f = 0; f < rec->nfields && !e.code; f++) {
        const dl__rfs_field *fd_ = &r.fields[rec->first_field + f];
        const uint8_t *p = buf.p + fd_->offset;
        if (dl__codec_of_rfs(fd_->codec)) {
          if (!dl__check_image(c, p, fd_->size, false, false, &e) && fd_->scan == DL__RFS_SCAN_CLEAN)
            dl__check_scan_claim(p, fd_->size, &e);
        } else if (fd_->codec == DL__RFS_ZSTD && ZSTD_getFrameContentSize(p, fd_->size) != fd_->raw_size)
          dl__err_set(&e, DL_ECORRUPT, "zstd frame does not declare its %llu bytes",
                      (unsigned long long)fd_->raw_size);
        else if (fd_->codec == DL__RFS_ZSTD)
          dl__check_npy(c, p, fd_->size, true, &e);
        else if (fd_->raw_size != fd_->size)
          dl__err_set(&e, DL_ECORRUPT, "raw field of %u bytes claims %llu", fd_->size,
                      (unsigned long long)fd_->raw_size);
        else if (fd_->codec == DL__RFS_RAW) /* a tensor; bytes, text and JSON are delivered as they are */
          dl__check_npy(c, p, fd_->size, false, &e);
        if (e.code)
          dl__err_prefix(&e, "field %s: ", r.names[fd_->name]);
      }
    }
    if (e.code) {
      fprintf(out, "%s: record %llu (key %s, offset %llu): %s\n", path, (unsigned long long)i, key,
              (unsigned long long)rec->offset, e.msg);
      n->bad++;
    }
  }
  dl__buf_free(&buf);
  dl__rfs_free(&r);
  return 0;
}

static bool rfs_by_bytes(const uint8_t *head, size_t n) { return n >= 8 && !memcmp(head, DL__RFS_MAGIC, 8); }

static int rfs_open(dl__dataset *ds, const char *path, const dl__options *o) { return dl__rfs_load(ds, path, o->direct); }

const dl__format dl__rfs_format = {.name = "rfs", .what = "ringfeed shard", .by_bytes = rfs_by_bytes, .open = rfs_open,
                                   .open_remote = rfs_open_remote, .index_copy = rfs_index_copy, .verify = rfs_verify};
