/*
 * ringfeed shards: the writer's records read back bit-exact (raw, zstd, jpeg) and as batch tensors
 * through the loader, conversion by
 * dlshard keeps the stream (tar -> rfs and ImageFolder -> rfs give the same digests, with and
 * without O_DIRECT), an ImageFolder's class names travel in its shards, and damage is found:
 * dlshard verify names every flipped, truncated or mis-summed record, and the loader with
 * on_error=skip reports exactly those.
 */
#include "core.h"
#include "synthetic.h"
#include "tar_writer.h"
#include "test.h"
#include "test_data.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static char dir[256];
static const char *dlshard;

static void sh(const char *fmt, const char *a, const char *b, int want) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  int st = system(cmd);
  int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (rc != want)
    FAIL_AT("`%s` exited %d, expected %d", cmd, rc, want);
}

static uint64_t stream_digest(const char *src, const char *opts, int *errors) {
  dl_loader *l;
  OPEN_OK(l, src, opts);
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  dl_batch *b;
  *errors = 0;
  while (dl_next_batch(l, &b) == 0) {
    DLTensor img, lab;
    dl_batch_field(b, "image", &img);
    dl_batch_field(b, "label", &lab);
    XXH3_64bits_update(&st, img.data, (size_t)img.shape[0] * img.shape[1] * img.shape[2] * img.shape[3]);
    XXH3_64bits_update(&st, lab.data, (size_t)lab.shape[0] * 8);
    for (int i = 0; i < dl_batch_size(b); i++) {
      XXH3_64bits_update(&st, dl_batch_key(b, i), strlen(dl_batch_key(b, i)));
      *errors += dl_batch_sample_error(b, i) != 0;
    }
    dl_batch_release(b, NULL);
  }
  dl_close(l);
  return XXH3_64bits_digest(&st);
}

/* A .npy v1 payload of int32 values 0, 1, 2, ... of shape (rows, 3). */
static size_t make_npy(uint8_t *out, int rows, int first) {
  char header[128];
  int n = snprintf(header, sizeof header, "{'descr': '<i4', 'fortran_order': False, 'shape': (%d, 3), }", rows);
  int total = 10 + n + 1;
  int pad = (64 - total % 64) % 64;
  memcpy(out, "\x93NUMPY\x01\x00", 8);
  uint16_t hl = (uint16_t)(n + pad + 1);
  memcpy(out + 8, &hl, 2);
  memcpy(out + 10, header, (size_t)n);
  memset(out + 10 + n, ' ', (size_t)pad);
  out[10 + n + pad] = '\n';
  size_t at = (size_t)(10 + n + pad + 1);
  for (int i = 0; i < rows * 3; i++) {
    int32_t v = first + i;
    memcpy(out + at + 4 * (size_t)i, &v, 4);
  }
  return at + 12 * (size_t)rows;
}

static void writer_round_trip(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/rt.rfs", dir);
  dl_writer *w;
  ASSERT_EQ(dl_writer_open(&w, path, "align=bogus"), DL_EOPTION);
  ASSERT_EQ(dl_writer_open(&w, path, "align=3000"), DL_EOPTION);
  ASSERT_EQ(dl_writer_open(&w, path, "align=4096 zstd_level=5"), 0);
  uint8_t raw[5000], npy[512];
  unsigned char *jpg;
  unsigned long jlen;
  ASSERT_EQ(synthetic_jpeg(3, SYNTHETIC_DEFAULT, &jpg, &jlen), 0);
  for (int r = 0; r < 20; r++) {
    char key[32];
    snprintf(key, sizeof key, "k/%03d", r);
    ASSERT_EQ(dl_writer_begin(w, key, r * 10), 0);
    size_t nl = make_npy(npy, 4, r * 100);
    ASSERT_EQ(dl_writer_field(w, "tensor", "raw", npy, nl), 0);
    size_t rl = make_npy(raw, 400, r);
    ASSERT_EQ(dl_writer_field(w, "packed", "zstd", raw, rl), 0);
    ASSERT_EQ(dl_writer_field(w, "image", "jpeg", jpg, jlen), 0);
    ASSERT_EQ(dl_writer_end(w), 0);
  }
  /* A field refused drops its record, key and all, and the writer goes on: no record is written
   * without a field its writer meant it to have. */
  ASSERT_EQ(dl_writer_begin(w, NULL, 0), -EINVAL);
  ASSERT_EQ(dl_writer_begin(w, "dropped", 1), 0);
  ASSERT_EQ(dl_writer_field(w, "tensor", "raw", npy, make_npy(npy, 4, 0)), 0);
  ASSERT_EQ(dl_writer_field(w, "x", "lz4", raw, 1), DL_EOPTION);
  ASSERT_EQ(dl_writer_end(w), -EINVAL);
  ASSERT_EQ(dl_writer_begin(w, "dropped too", 1), 0);
  ASSERT_EQ(dl_writer_field(w, NULL, "raw", raw, 1), -EINVAL);
  ASSERT_EQ(dl_writer_field(w, "x", "raw", raw, 1), -EINVAL); /* outside a record now */
  ASSERT_EQ(dl_writer_open(NULL, path, ""), -EINVAL);
  dl_writer *none = NULL;
  ASSERT_EQ(dl_writer_open(&none, dir, ""), -EISDIR); /* a folder: refused before a byte is written */
  ASSERT_CONTAINS(dl_last_error(), "it is a folder");
  ASSERT(none == NULL);
  /* A NULL writer (one closed and set to NULL, as the Python binding does) is refused, not a crash. */
  ASSERT_EQ(dl_writer_begin(NULL, "k", 0), -EINVAL);
  ASSERT_EQ(dl_writer_field(NULL, "x", "raw", raw, 1), -EINVAL);
  ASSERT_EQ(dl_writer_end(NULL), -EINVAL);
  ASSERT_EQ(dl_writer_close(NULL), -EINVAL);
  ASSERT_CONTAINS(dl_last_error(), "the writer is NULL");
  ASSERT_EQ(dl_writer_close(w), 0);
  int fd = open(path, O_RDONLY);
  struct stat st;
  fstat(fd, &st);
  dl__rfs r;
  char why[256];
  ASSERT_EQ(dl__rfs_open(&r, fd, (uint64_t)st.st_size, why, sizeof why), 0);
  ASSERT_EQ(r.nrecords, 20);
  ASSERT_EQ(r.nnames, 3);
  uint8_t *buf = malloc(1 << 20), out[5000];
  for (uint64_t i = 0; i < r.nrecords; i++) {
    const dl__rfs_record *rec = &r.records[i];
    ASSERT_EQ(rec->offset % 4096, 0);
    ASSERT_EQ(rec->label, (int64_t)i * 10);
    ASSERT_EQ(pread(fd, buf, rec->size, (off_t)rec->offset), rec->size);
    ASSERT_EQ(dl__rfs_checksum(buf, rec->size), rec->checksum);
    const dl__rfs_field *f = &r.fields[rec->first_field];
    ASSERT_EQ(f[0].codec, DL__RFS_RAW);
    size_t nl = make_npy(npy, 4, (int)i * 100), rl = make_npy(raw, 400, (int)i);
    ASSERT_EQ(f[0].size, nl);
    ASSERT_EQ(memcmp(buf + f[0].offset, npy, nl), 0);
    ASSERT_EQ(f[1].codec, DL__RFS_ZSTD);
    ASSERT_LT(f[1].size, rl);
    ASSERT_EQ(ZSTD_decompress(out, sizeof out, buf + f[1].offset, f[1].size), rl);
    ASSERT_EQ(memcmp(out, raw, rl), 0);
    ASSERT_EQ(f[2].size, jlen);
    ASSERT_EQ(memcmp(buf + f[2].offset, jpg, jlen), 0);
  }
  dl__rfs_free(&r);
  close(fd);
  free(buf);
  free(jpg);
  /* Through the loader: the image field decodes, labels and keys come from the index. */
  dl_loader *l;
  OPEN_OK(l, path, "batch_size=20 image_size=32 shuffle=0 workers=2");
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  ASSERT_STR_EQ(dl_batch_key(b, 7), "k/007");
  DLTensor lab, ten, pk;
  dl_batch_field(b, "label", &lab);
  ASSERT_EQ(((int64_t *)lab.data)[7], 70);
  ASSERT_EQ(dl_batch_sample_error(b, 19), 0);
  /* The tensor fields: [B, 4, 3] and [B, 400, 3] int32, bit-exact, the zstd one decompressed. */
  ASSERT_EQ(dl_batch_field_count(b), 4);
  ASSERT_STR_EQ(dl_batch_field_name(b, 2), "tensor");
  ASSERT_EQ(dl_batch_field(b, "tensor", &ten), 0);
  ASSERT_EQ(dl_batch_field(b, "packed", &pk), 0);
  ASSERT_EQ(ten.ndim, 3);
  ASSERT_EQ(ten.shape[1], 4);
  ASSERT_EQ(ten.dtype.code, kDLInt);
  ASSERT_EQ(ten.dtype.bits, 32);
  ASSERT_EQ(pk.shape[1], 400);
  for (int i = 0; i < 20; i++) {
    ASSERT_EQ(((int32_t *)ten.data)[i * 12 + 5], i * 100 + 5);
    ASSERT_EQ(((int32_t *)pk.data)[i * 1200 + 1199], i + 1199);
  }
  dl_batch_release(b, NULL);
  dl_close(l);
  sh("'%s' verify '%s' > /dev/null", dlshard, path, 0);
  printf("writer: raw, zstd and jpeg fields read back bit-exact\n");
}

static void conversions_keep_the_stream(void) {
  char tars[600], out[600], rfs[700], folder[600];
  for (int s = 0; s < 3; s++) {
    char path[600];
    snprintf(path, sizeof path, "%s/t-%d.tar", dir, s);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 25; i++) {
      long id = s * 25 + i;
      unsigned char *jpg;
      unsigned long len;
      char key[32], file[700];
      snprintf(key, sizeof key, "sub/%04ld", id);
      test_tar_sample(f, key, id + 100, id % 4, &jpg, &len);
      snprintf(file, sizeof file, "%s/folder/c%ld/%04ld.jpg", dir, id % 4, id);
      test_write_file(file, jpg, len);
      free(jpg);
    }
    tar_write_end(f);
    fclose(f);
  }
  snprintf(tars, sizeof tars, "%s/t-{0..2}.tar", dir);
  snprintf(out, sizeof out, "%s/conv", dir);
  sh("'%s' create '%s' --samples-per-shard 20 > /dev/null 2>&1", dlshard, out, 2); /* no input */
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' create '%s' '%s' --samples-per-shard 20 --threads 3 > /dev/null", dlshard, out, tars);
  ASSERT_EQ(system(cmd), 0);
  snprintf(rfs, sizeof rfs, "%s/conv-{000000..000003}.rfs", dir);
  const char *opts = "batch_size=16 image_size=40 flip=1 seed=4 workers=3";
  int e1, e2, e3;
  uint64_t a = stream_digest(tars, opts, &e1), b = stream_digest(rfs, opts, &e2);
  char direct[256];
  snprintf(direct, sizeof direct, "%s direct=1", opts);
  uint64_t c = stream_digest(rfs, direct, &e3);
  ASSERT_EQ(a, b);
  ASSERT_EQ(a, c);
  snprintf(direct, sizeof direct, "%s io=mmap", opts);
  ASSERT_EQ(stream_digest(rfs, direct, &e3), a);
  ASSERT_EQ(stream_digest(tars, direct, &e3), a);
  ASSERT_EQ(e1 + e2 + e3, 0);
  /* ImageFolder -> rfs likewise (its own order: classes, then names). */
  snprintf(folder, sizeof folder, "%s/folder", dir);
  snprintf(out, sizeof out, "%s/fold", dir);
  snprintf(cmd, sizeof cmd, "'%s' create '%s' '%s' --shard-size 1MB > /dev/null", dlshard, out, folder);
  ASSERT_EQ(system(cmd), 0);
  snprintf(rfs, sizeof rfs, "%s/fold-*.rfs", dir);
  ASSERT_EQ(stream_digest(folder, opts, &e1), stream_digest(rfs, opts, &e2));
  printf("conversion: tar -> rfs and ImageFolder -> rfs deliver the same stream (O_DIRECT too)\n");
}

/* A shard's parsed index and its bytes in memory, for tests that damage a copy of it. */
static uint8_t *load_shard(const char *path, dl__rfs *r, struct stat *st) {
  int fd = open(path, O_RDONLY);
  ASSERT(fd >= 0 && fstat(fd, st) == 0);
  char why[256];
  ASSERT_EQ(dl__rfs_open(r, fd, (uint64_t)st->st_size, why, sizeof why), 0);
  uint8_t *copy = malloc((size_t)st->st_size);
  ASSERT_EQ(pread(fd, copy, (size_t)st->st_size, 0), st->st_size);
  close(fd);
  return copy;
}

static void damage_is_found(void) {
  char src[700], bad[700], cmd[2048];
  snprintf(src, sizeof src, "%s/conv-000000.rfs", dir);
  snprintf(bad, sizeof bad, "%s/bad.rfs", dir);
  struct stat st;
  dl__rfs r;
  uint8_t *copy = load_shard(src, &r, &st);
  /* Flip one byte in records 3 and 11 (inside the image data). */
  copy[r.records[3].offset + r.records[3].size / 2] ^= 0x40;
  copy[r.records[11].offset + 100] ^= 0x01;
  FILE *f = fopen(bad, "wb");
  fwrite(copy, 1, (size_t)st.st_size, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "'%s' verify '%s' > %s/verify.txt", dlshard, bad, dir);
  int status = system(cmd);
  ASSERT_EQ(WEXITSTATUS(status), 1);
  char report[700], line[1024];
  snprintf(report, sizeof report, "%s/verify.txt", dir);
  f = fopen(report, "r");
  int named = 0;
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, "record 3 ") || strstr(line, "record 11 ")) {
      ASSERT_CONTAINS(line, "checksum mismatch");
      named++;
    }
  }
  fclose(f);
  ASSERT_EQ(named, 2);
  /* The loader (skip) reports exactly those records, and fail stops on the first. */
  dl_loader *l;
  OPEN_OK(l, bad, "batch_size=20 image_size=16 shuffle=0 workers=2 log=quiet");
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  for (int i = 0; i < dl_batch_size(b); i++)
    ASSERT_EQ(dl_batch_sample_error(b, i) != 0, i == 3 || i == 11);
  ASSERT_EQ(dl_batch_sample_error(b, 3), DL_ECORRUPT);
  dl_batch_release(b, NULL);
  dl_close(l);
  OPEN_OK(l, bad, "batch_size=20 image_size=16 shuffle=0 workers=2 log=quiet io=mmap");
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  ASSERT_EQ(dl_batch_sample_error(b, 11), DL_ECORRUPT);
  ASSERT_EQ(dl_batch_sample_error(b, 12), 0);
  dl_batch_release(b, NULL);
  dl_close(l);
  OPEN_OK(l, bad, "batch_size=20 image_size=16 shuffle=0 workers=2 on_error=fail log=quiet");
  ASSERT_EQ(dl_next_batch(l, &b), DL_ECORRUPT);
  ASSERT_CONTAINS(dl_last_error(), "checksum mismatch");
  ASSERT_CONTAINS(dl_last_error(), "record 3");
  dl_close(l);
  /* A truncated shard: its trailer is gone, and both verify and the loader say so by name. */
  ASSERT_EQ(truncate(bad, st.st_size - 100), 0);
  snprintf(cmd, sizeof cmd, "'%s' verify '%s' > /dev/null", dlshard, bad);
  ASSERT_EQ(WEXITSTATUS(system(cmd)), 1);
  ASSERT_EQ(dl_open(&l, bad, ""), DL_ECORRUPT);
  ASSERT_CONTAINS(dl_last_error(), "bad.rfs");
  ASSERT_CONTAINS(dl_last_error(), "truncated");
  dl__rfs_free(&r);
  free(copy);
  printf("damage: flipped bytes and truncation named by verify and by the loader\n");
}

/* The index of shard COPY (SIZE bytes in memory) and its length, for tests that edit it. */
static uint8_t *index_of(uint8_t *copy, off_t size, uint64_t *isize) {
  uint64_t ioff;
  memcpy(&ioff, copy + size - 32, 8);
  memcpy(isize, copy + size - 24, 8);
  return copy + ioff;
}

/* Where the index IDX of a shard with NNAMES field names lists its records, past its name table
 * and key blob. */
static size_t index_records_at(const uint8_t *idx, uint32_t nnames) {
  size_t at = 8 + 8 + 4;
  for (uint32_t i = 0; i < nnames; i++) {
    uint16_t len;
    memcpy(&len, idx + at, 2);
    at += 2 + len;
  }
  uint64_t klen;
  memcpy(&klen, idx + at, 8);
  return at + 8 + klen;
}

/* Writes COPY to PATH with its index hash made anew, so that only what a test changed is wrong. */
static void write_edited(const char *path, uint8_t *copy, off_t size) {
  uint64_t isize;
  uint8_t *idx = index_of(copy, size, &isize);
  uint64_t h = dl__rfs_checksum(idx, isize);
  memcpy(copy + size - 16, &h, 8);
  FILE *f = fopen(path, "wb");
  ASSERT(f && fwrite(copy, 1, (size_t)size, f) == (size_t)size && fclose(f) == 0);
}

static void index_checksum_is_checked(void) {
  char src[700], bad[700];
  snprintf(src, sizeof src, "%s/conv-000001.rfs", dir);
  snprintf(bad, sizeof bad, "%s/badsum.rfs", dir);
  struct stat st;
  dl__rfs r;
  uint8_t *copy = load_shard(src, &r, &st);
  /* Change record 5's stored checksum and fix up the index hash, so only the record check fails. */
  uint64_t isize;
  uint8_t *idx = index_of(copy, st.st_size, &isize);
  size_t at = index_records_at(idx, r.nnames);
  for (int i = 0; i < 5; i++) {
    uint16_t nf;
    memcpy(&nf, idx + at + 32, 2);
    at += 34 + 20 * (size_t)nf;
  }
  idx[at + 24] ^= 0xff;
  write_edited(bad, copy, st.st_size);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' verify '%s' | grep -c 'record 5 .*checksum mismatch' | grep -qx 1", dlshard, bad);
  ASSERT_EQ(system(cmd), 0);
  dl__rfs_free(&r);
  free(copy);
  printf("checksums: a wrong stored checksum is reported for its record\n");
}

/* Class names as dl_class_name gives them for SRC: "c0 c1 ..." into OUT, "" for none. */
static const char *class_names(const char *src, char *out, size_t cap) {
  dl_loader *l;
  OPEN_OK(l, src, "batch_size=4 image_size=16 log=quiet");
  size_t n = 0;
  out[0] = 0;
  for (int64_t c = 0; dl_class_name(l, c) && n < cap; c++)
    n += (size_t)snprintf(out + n, cap - n, "%s%s", c ? " " : "", dl_class_name(l, c));
  dl_close(l);
  return out;
}

/* An ImageFolder's class names travel in the shards made from it, every shard naming them all;
 * a damaged class table is named as the index's damage is. */
static void class_names_travel(void) {
  char cmd[2048], src[700], names[256];
  snprintf(cmd, sizeof cmd, "'%s' create '%s/fcls' '%s/folder' --samples-per-shard 20 > /dev/null", dlshard, dir, dir);
  ASSERT_EQ(system(cmd), 0);
  snprintf(src, sizeof src, "%s/folder", dir);
  ASSERT_STR_EQ(class_names(src, names, sizeof names), "c0 c1 c2 c3");
  snprintf(src, sizeof src, "%s/fcls-{000000..000003}.rfs", dir);
  ASSERT_STR_EQ(class_names(src, names, sizeof names), "c0 c1 c2 c3");
  snprintf(src, sizeof src, "%s/fcls-000003.rfs", dir); /* its records are all of c3 */
  ASSERT_STR_EQ(class_names(src, names, sizeof names), "c0 c1 c2 c3");
  snprintf(src, sizeof src, "%s/conv-000000.rfs", dir); /* made from tars: nothing names its labels */
  ASSERT_STR_EQ(class_names(src, names, sizeof names), "");
  snprintf(src, sizeof src, "%s/fcls-000000.rfs::%s/conv-000000.rfs", dir, dir);
  ASSERT_STR_EQ(class_names(src, names, sizeof names), "");
  snprintf(cmd, sizeof cmd, "'%s' ls '%s/fcls-000001.rfs' | grep -qx '  classes 4: c0 c1 c2 c3'", dlshard, dir);
  ASSERT_EQ(system(cmd), 0);
  /* The writer's call: a second replaces the first, none clears, a bad name is refused and leaves
   * the table as it was. */
  const char *two[] = {"a", "b"}, *one[] = {"x"}, *empty[] = {""};
  snprintf(src, sizeof src, "%s/named.rfs", dir);
  dl_writer *w;
  ASSERT_EQ(dl_writer_open(&w, src, NULL), 0);
  ASSERT_EQ(dl_writer_classes(w, two, 2), 0);
  ASSERT_EQ(dl_writer_classes(w, one, 1), 0);
  ASSERT_EQ(dl_writer_classes(w, empty, 1), DL_ELIMIT);
  ASSERT_CONTAINS(dl_last_error(), "class name 0");
  ASSERT_EQ(dl_writer_classes(w, NULL, 3), -EINVAL);
  const char *late[] = {"y", ""}; /* refused at its second name */
  ASSERT_EQ(dl_writer_classes(w, late, 2), DL_ELIMIT);
  ASSERT_CONTAINS(dl_last_error(), "class name 1");
  ASSERT_EQ(dl_writer_begin(w, "k", 0), 0); /* a label alone */
  ASSERT_EQ(dl_writer_end(w), 0);
  ASSERT_EQ(dl_writer_close(w), 0);
  ASSERT_STR_EQ(class_names(src, names, sizeof names), "x");
  ASSERT_EQ(dl_writer_open(&w, src, NULL), 0);
  ASSERT_EQ(dl_writer_classes(w, two, 2), 0);
  ASSERT_EQ(dl_writer_classes(w, NULL, 0), 0);
  ASSERT_EQ(dl_writer_begin(w, "k", 0), 0);
  ASSERT_EQ(dl_writer_end(w), 0);
  ASSERT_EQ(dl_writer_close(w), 0);
  uint8_t head[32];
  int fd = open(src, O_RDONLY);
  ASSERT(fd >= 0 && pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head);
  close(fd);
  for (int i = 16; i < 32; i++) /* no table: the header as it always was */
    ASSERT_EQ(head[i], 0);
  /* Damage: a name's byte flipped, and a header placing the table outside the data area. */
  snprintf(src, sizeof src, "%s/fcls-000002.rfs", dir);
  char bad[700];
  snprintf(bad, sizeof bad, "%s/badcls.rfs", dir);
  struct stat st;
  dl__rfs r;
  uint8_t *copy = load_shard(src, &r, &st);
  ASSERT_EQ(r.nclasses, 4u);
  uint64_t at;
  memcpy(&at, copy + 16, 8);
  copy[at + 14] ^= 0x20; /* the first name's first byte */
  write_edited(bad, copy, st.st_size);
  dl_loader *l;
  ASSERT_EQ(dl_open(&l, bad, "log=quiet"), DL_ECORRUPT);
  ASSERT_CONTAINS(dl_last_error(), "badcls.rfs");
  ASSERT_CONTAINS(dl_last_error(), "class table checksum mismatch");
  snprintf(cmd, sizeof cmd, "'%s' verify '%s' | grep -q 'badcls.rfs: class table checksum mismatch'", dlshard, bad);
  ASSERT_EQ(system(cmd), 0);
  copy[at + 14] ^= 0x20;
  uint64_t outside = 8;
  memcpy(copy + 16, &outside, 8);
  write_edited(bad, copy, st.st_size);
  ASSERT_EQ(dl_open(&l, bad, "log=quiet"), DL_ECORRUPT);
  ASSERT_CONTAINS(dl_last_error(), "class table at 8");
  dl__rfs_free(&r);
  free(copy);
  printf("classes: an ImageFolder's names in every shard made from it; a damaged table named\n");
}

/* Every batch of SRC with OPTS: the "big" field (600 x 3 int32, record r holding r * 10000 + i)
 * and the "small" one (4 x 3, r * 100 + i), checked value by value. Returns the samples that
 * failed; BAD (or -1) is the one record expected to fail, whose fields must then be zeros. */
static int check_tensors(const char *src, const char *opts, int bad, int64_t *placed, int64_t *again) {
  dl_loader *l;
  OPEN_OK(l, src, opts);
  dl_batch *b;
  int failed = 0, seen = 0;
  while (dl_next_batch(l, &b) == 0) {
    DLTensor big, small, lab;
    ASSERT_EQ(dl_batch_field(b, "big", &big), 0);
    ASSERT_EQ(dl_batch_field(b, "small", &small), 0);
    ASSERT_EQ(dl_batch_field(b, "label", &lab), 0);
    ASSERT_EQ(big.shape[1], 600);
    for (int i = 0; i < dl_batch_size(b); i++, seen++) {
      int r = (int)((int64_t *)lab.data)[i];
      const int32_t *g = (const int32_t *)big.data + (size_t)i * 1800, *t = (const int32_t *)small.data + i * 12;
      int err = dl_batch_sample_error(b, i);
      if (err) {
        ASSERT_EQ(r, bad); /* a failed sample keeps its label; its fields are zeros */
        ASSERT_EQ(err, DL_ECORRUPT);
        ASSERT(g[0] == 0 && g[1799] == 0 && t[11] == 0);
        failed++;
        continue;
      }
      ASSERT(r != bad);
      for (int k = 0; k < 1800; k++)
        if (g[k] != r * 10000 + k)
          FAIL_AT("%s (%s): record %d, big[%d] = %d", src, opts, r, k, g[k]);
      for (int k = 0; k < 12; k++)
        ASSERT_EQ(t[k], r * 100 + k);
    }
    dl_batch_release(b, NULL);
  }
  char stats[4096];
  ASSERT_GT(dl_stats_json(l, stats, sizeof stats), 0);
  const char *p = strstr(stats, "\"tensors_read_in_place\":"), *q = strstr(stats, "\"tensors_read_again\":");
  ASSERT(p && q);
  *placed = atoll(p + strlen("\"tensors_read_in_place\":"));
  *again = atoll(q + strlen("\"tensors_read_again\":"));
  dl_close(l);
  ASSERT_EQ(seen, 30);
  return failed;
}

/* Tensor payloads go from the file straight into their place in the batch slot (the pieces of the
 * record between them into the worker's buffer), with io_uring and pread; mmap copies them. All
 * deliver the same values, a payload whose .npy has bytes after its data (the read's guess of its
 * header misses) included, and damage inside a payload fails that record's checksum. */
static void tensors_straight_into_slots(void) {
  char rfs[600], tar[600], bad[600];
  snprintf(rfs, sizeof rfs, "%s/tensors.rfs", dir);
  snprintf(tar, sizeof tar, "%s/tensors.tar", dir);
  dl_writer *w;
  ASSERT_EQ(dl_writer_open(&w, rfs, ""), 0);
  FILE *t = fopen(tar, "wb");
  ASSERT(t);
  static uint8_t big[8192], small[256];
  for (int r = 0; r < 30; r++) {
    char key[32], name[64], cls[16];
    snprintf(key, sizeof key, "t%03d", r);
    size_t bl = make_npy(big, 600, r * 10000), sl = make_npy(small, 4, r * 100);
    if (r % 7 == 3) { /* bytes after the array: legal, and not what the straight read assumes */
      memset(big + bl, 0x5a, 16);
      bl += 16;
    }
    ASSERT_EQ(dl_writer_begin(w, key, r), 0);
    ASSERT_EQ(dl_writer_field(w, "small", "raw", small, sl), 0);
    ASSERT_EQ(dl_writer_field(w, "big", "raw", big, bl), 0);
    ASSERT_EQ(dl_writer_end(w), 0);
    snprintf(name, sizeof name, "%s.small.npy", key);
    ASSERT_EQ(tar_write_member(t, name, small, sl), 0);
    snprintf(name, sizeof name, "%s.big.npy", key);
    ASSERT_EQ(tar_write_member(t, name, big, bl), 0);
    snprintf(name, sizeof name, "%s.cls", key);
    int n = snprintf(cls, sizeof cls, "%d", r);
    ASSERT_EQ(tar_write_member(t, name, cls, (size_t)n), 0);
  }
  ASSERT_EQ(dl_writer_close(w), 0);
  ASSERT_EQ(tar_write_end(t), 0);
  fclose(t);
  const char *ios[] = {"io=uring", "io=pread", "io=mmap", "direct=1"};
  int64_t placed, again;
  for (int k = 0; k < 4; k++) {
    char opts[200];
    snprintf(opts, sizeof opts, "batch_size=7 shuffle=1 seed=3 workers=3 %s", ios[k]);
    for (int s = 0; s < (k < 3 ? 2 : 1); s++) {
      ASSERT_EQ(check_tensors(s ? tar : rfs, opts, -1, &placed, &again), 0);
      /* Straight into the slots with a read that takes pieces: 26 records, and the 4 whose .npy
       * has bytes after its data read again; a mapping and O_DIRECT copy. */
      ASSERT_EQ(placed, k < 2 ? 26 : 0);
      ASSERT_EQ(again, k < 2 ? 4 : 0);
    }
  }
  /* One byte of record 5's big payload flipped: its checksum fails on every path. */
  struct stat st;
  dl__rfs r;
  uint8_t *copy = load_shard(rfs, &r, &st);
  const dl__rfs_field *f = &r.fields[r.records[5].first_field + 1];
  copy[r.records[5].offset + f->offset + f->size / 2] ^= 0x10;
  snprintf(bad, sizeof bad, "%s/tensors-bad.rfs", dir);
  FILE *o = fopen(bad, "wb");
  fwrite(copy, 1, (size_t)st.st_size, o);
  fclose(o);
  free(copy);
  dl__rfs_free(&r);
  for (int k = 0; k < 4; k++) {
    char opts[200];
    snprintf(opts, sizeof opts, "batch_size=7 shuffle=0 workers=2 log=quiet %s", ios[k]);
    ASSERT_EQ(check_tensors(bad, opts, 5, &placed, &again), 1);
  }
  printf("tensor payloads read straight into the slots (io_uring, pread) equal the copied ones (mmap, "
         "O_DIRECT), tar and rfs, a .npy with bytes after its data included; damage in one fails its checksum\n");
}

/* What dl_open of SRC with OPTS writes to stderr, into TEXT; the loader stays open in *L. */
static void open_logged(dl_loader **l, const char *src, const char *opts, char *text, size_t cap) {
  char log[600];
  snprintf(log, sizeof log, "%s/open.log", dir);
  int saved = stderr_into(log);
  int rc = dl_open(l, src, opts);
  stderr_back(saved);
  ASSERT_EQ(rc, 0);
  memset(text, 0, cap);
  FILE *f = fopen(log, "r");
  ASSERT(f);
  ASSERT(fread(text, 1, cap - 1, f) < cap);
  fclose(f);
}

/* A record names each field once: the writer refuses a second value under a name (a reader would
 * have to pick one), and a shard from another writer that has one keeps the first, said at open.
 * Fields past the 16 a dataset holds are left out and named too, on every open. */
/* An image field whose bytes no read could decode as its codec says is refused, naming the codec
 * they are; bytes of no known kind go in (dlshard create --keep-bad keeps such samples). */
static void image_bytes_of_another_kind_refused(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/kinds.rfs", dir);
  dl_writer *w;
  ASSERT_EQ(dl_writer_open(&w, path, ""), 0);
  static const uint8_t png[] = "\x89PNG\r\n\x1a\n\0\0\0\rIHDR", jpeg[] = "\xff\xd8\xff\xe0\0\x10JFIF";
  uint8_t npy[256]; /* a 128-byte header, then one row of 3 int32 */
  size_t npy_len = make_npy(npy, 1, 0);
  ASSERT_EQ(dl_writer_begin(w, "r0", 0), 0);
  ASSERT_EQ(dl_writer_field(w, "image", "jpeg", png, sizeof png), DL_EOPTION);
  ASSERT_CONTAINS(dl_last_error(),
                  "field 'image' of record 'r0': codec jpeg, but its bytes are a PNG file (give codec png)");
  ASSERT_EQ(dl_writer_begin(w, "r1", 1), 0);
  ASSERT_EQ(dl_writer_field(w, "image", "webp", jpeg, sizeof jpeg), DL_EOPTION);
  ASSERT_CONTAINS(dl_last_error(), "codec webp, but its bytes are a JPEG file (give codec jpeg)");
  ASSERT_EQ(dl_writer_begin(w, "r2", 2), 0);
  ASSERT_EQ(dl_writer_field(w, "image", "png", npy, npy_len), DL_EOPTION);
  ASSERT_CONTAINS(dl_last_error(), "codec png, but its bytes are an array's .npy payload (encode the image first");
  ASSERT_EQ(dl_writer_begin(w, "r3", 3), 0);
  ASSERT_EQ(dl_writer_field(w, "image", "jpeg", "no image", 8), 0);
  ASSERT_EQ(dl_writer_field(w, "depth", "raw", npy, npy_len), 0);
  ASSERT_EQ(dl_writer_end(w), 0);
  ASSERT_EQ(dl_writer_close(w), 0);
  printf("image fields: another codec's bytes and an array's refused by the writer, unknown bytes kept\n");
}

static void fields_given_twice_or_past_the_limit(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/twice.rfs", dir);
  dl_writer *w;
  ASSERT_EQ(dl_writer_open(&w, path, "align=1"), 0);
  ASSERT_EQ(dl_writer_begin(w, "refused", 0), 0);
  ASSERT_EQ(dl_writer_field(w, "f", "bytes", "A", 1), 0);
  ASSERT_EQ(dl_writer_field(w, "f", "bytes", "B", 1), DL_EOPTION);
  ASSERT_CONTAINS(dl_last_error(), "field 'f' given twice in record 'refused'");
  ASSERT_EQ(dl_writer_end(w), -EINVAL); /* the record was dropped */
  for (int r = 0; r < 2; r++) {
    ASSERT_EQ(dl_writer_begin(w, r ? "k1" : "k0", r), 0);
    ASSERT_EQ(dl_writer_field(w, "f", "bytes", r ? "first1" : "first0", 6), 0);
    ASSERT_EQ(dl_writer_field(w, "g", "bytes", "second", 6), 0);
    for (int k = 0; k < 16; k++) { /* with f, 17 distinct fields: x15 is one too many */
      char name[8], value[8];
      snprintf(name, sizeof name, "x%02d", k);
      snprintf(value, sizeof value, "v%02d", k);
      ASSERT_EQ(dl_writer_field(w, name, "bytes", value, 3), 0);
    }
    ASSERT_EQ(dl_writer_end(w), 0);
  }
  ASSERT_EQ(dl_writer_close(w), 0);
  /* Another writer's shard: record 0's second field (g) renamed to f, the index hash made anew. */
  struct stat st;
  dl__rfs r;
  uint8_t *copy = load_shard(path, &r, &st);
  uint64_t isize;
  uint8_t *idx = index_of(copy, st.st_size, &isize);
  size_t at = index_records_at(idx, r.nnames) + 34 + 20; /* record 0's second field entry */
  uint16_t f_name = r.fields[r.records[0].first_field].name;
  memcpy(idx + at, &f_name, 2);
  write_edited(path, copy, st.st_size);
  free(copy);
  dl__rfs_free(&r);
  for (int open_no = 0; open_no < 2; open_no++) {
    dl_loader *l;
    char text[4096];
    open_logged(&l, path, "batch_size=2 image_size=8 shuffle=0 workers=1 log=warn", text, sizeof text);
    ASSERT_CONTAINS(text, "record 0 field f: given twice, the first value kept");
    ASSERT_CONTAINS(text, "record 0 field x15: left out, a dataset has at most 16 distinct fields");
    dl_batch *b;
    ASSERT_EQ(dl_next_batch(l, &b), 0);
    size_t n;
    const void *p = dl_batch_bytes(b, "f", 0, &n);
    ASSERT(p && n == 6 && !memcmp(p, "first0", 6));
    p = dl_batch_bytes(b, "f", 1, &n);
    ASSERT(p && n == 6 && !memcmp(p, "first1", 6));
    p = dl_batch_bytes(b, "x14", 1, &n);
    ASSERT(p && n == 3 && !memcmp(p, "v14", 3));
    ASSERT(dl_batch_bytes(b, "x15", 0, &n) == NULL);
    dl_batch_release(b, NULL);
    dl_close(l);
  }
  printf("fields: one given twice refused by the writer, the first kept by the reader; past 16 named at every open\n");
}

/* Bytes fields say what they hold: text and json by their codec whatever the name, bytes by the
 * name's extension (a caption.txt is text, as a tar member). A codec past json is a malformed
 * field, said at open. */
static void bytes_kinds_by_codec(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/kinds.rfs", dir);
  dl_writer *w;
  ASSERT_EQ(dl_writer_open(&w, path, "align=1"), 0);
  for (int r = 0; r < 2; r++) {
    ASSERT_EQ(dl_writer_begin(w, r ? "k1" : "k0", r), 0);
    ASSERT_EQ(dl_writer_field(w, "caption", "text", "a photo", 7), 0);
    ASSERT_EQ(dl_writer_field(w, "meta", "json", "{\"i\": 1}", 8), 0);
    ASSERT_EQ(dl_writer_field(w, "blob", "bytes", "\0\1", 2), 0);
    ASSERT_EQ(dl_writer_field(w, "notes.txt", "bytes", "n", 1), 0);
    ASSERT_EQ(dl_writer_end(w), 0);
  }
  ASSERT_EQ(dl_writer_close(w), 0);
  dl_loader *l;
  OPEN_OK(l, path, "batch_size=2 image_size=8 shuffle=0 workers=1");
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  const char *want[][2] = {{"caption", "text"}, {"meta", "json"}, {"blob", "bytes"}, {"notes.txt", "text"}};
  ASSERT_EQ(dl_batch_bytes_count(b), 4);
  for (int f = 0; f < 4; f++)
    for (int k = 0; k < 4; k++)
      if (!strcmp(dl_batch_bytes_name(b, f), want[k][0]))
        ASSERT_STR_EQ(dl_batch_bytes_kind(b, f), want[k][1]);
  size_t n;
  const void *p = dl_batch_bytes(b, "meta", 1, &n);
  ASSERT(p && n == 8 && !memcmp(p, "{\"i\": 1}", 8));
  dl_batch_release(b, NULL);
  dl_close(l);
  /* Record 0's first field given codec 8, the index hash made anew. */
  struct stat st;
  dl__rfs r;
  uint8_t *copy = load_shard(path, &r, &st);
  uint64_t isize;
  uint8_t *idx = index_of(copy, st.st_size, &isize);
  idx[index_records_at(idx, r.nnames) + 34 + 2] = 8;
  write_edited(path, copy, st.st_size);
  free(copy);
  dl__rfs_free(&r);
  ASSERT(dl_open(&l, path, "batch_size=2 image_size=8 workers=1 log=quiet") != 0);
  ASSERT_CONTAINS(dl_last_error(), "record 0 field 0 is malformed");
  printf("bytes fields: text and json by their codec, bytes by the name; codec 8 named as a malformed field\n");
}

int main(void) {
  dlshard = getenv("DL_DLSHARD");
  if (!dlshard || access(dlshard, X_OK)) {
    fprintf(stderr, "skipped: DL_DLSHARD does not name the dlshard tool\n");
    return TEST_SKIP;
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/ringfeed-test-rfs-XXXXXX", tmp ? tmp : "/tmp");
  ASSERT(mkdtemp(dir));
  char folder[300];
  snprintf(folder, sizeof folder, "%s/folder", dir);
  mkdir(folder, 0755);
  writer_round_trip();
  conversions_keep_the_stream();
  damage_is_found();
  index_checksum_is_checked();
  class_names_travel();
  image_bytes_of_another_kind_refused();
  fields_given_twice_or_past_the_limit();
  bytes_kinds_by_codec();
  tensors_straight_into_slots();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT_EQ(system(cmd), 0);
  return 0;
}
