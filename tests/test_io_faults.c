/*
 * Faults injected into every Nth read (DL_IO_FAULTS, lib/util/fault.c) of tar shards, ringfeed
 * shards (one with tensor fields that reads put straight into the slots, in pieces) and an
 * ImageFolder, for io=pread, io_uring and mmap, with indexes built under the faults
 * and cached before them. Each run is a child process (the faults are read once per process);
 * the parent compares what it delivered, sample by sample, with a run without faults:
 *   - interrupted (eintr, eagain) and short reads are continued: the same pixels, no error;
 *   - eio and early ends (zero) fail dl_open naming the file, or become per-sample errors that
 *     the stats count; every other sample has exactly its pixels. No crash, hang or silent loss.
 *   - every read failing (a disk or a mount gone) stops the run once 32 reads in a row failed,
 *     whatever on_error says, instead of handing out batches of zeros;
 *   - the tar's index made with the shard dropped from the page cache (read whole) is the one
 *     made with it cached (its headers read alone).
 */
#include "ringfeed.h"
#include "synthetic.h"
#include "tar_writer.h"
#include "test.h"
#include "test_data.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* PAD_BYTES: a member the tar's scan steps over (lib/source/tar.c reads past such gaps a few
 * blocks at a time where the file is cached), so that faults land on those reads too. */
enum { SAMPLES = 48, IMAGES = 6, BIG_BYTES = 6000, PAD_BYTES = 20000 };

static char dir[256];

/* What a child printed: one line per sample ("KEY HASH" or "KEY error"), then "errors N", or one
 * line "open CODE MESSAGE". */
typedef struct outcome {
  char text[SAMPLES * 2][512];
  int lines;
} outcome;

static uint64_t fnv(const void *p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++)
    h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
  return h;
}

/* The child: runs SOURCE with IO and prints what it got. */
static int child(const char *source, const char *io) {
  alarm(60);
  char opts[256];
  snprintf(opts, sizeof opts, "batch_size=5 workers=3 io_depth=4 prefetch=2 shuffle=0 epochs=1 image_size=24 "
                              "crop=resize on_error=skip log=quiet io=%s", io);
  dl_loader *l;
  int r = dl_open(&l, source, opts);
  if (r) {
    printf("open %s %s\n", dl_errname(r), dl_last_error());
    return 0;
  }
  dl_batch *b;
  int errors = 0;
  while ((r = dl_next_batch(l, &b)) == 0) {
    DLTensor image, label, big;
    if (dl_batch_field(b, "image", &image) || dl_batch_field(b, "label", &label))
      return 2;
    bool has_big = dl_batch_field(b, "big", &big) == 0; /* the tensor records' field */
    size_t each = 24 * 24 * 3;
    for (int i = 0; i < dl_batch_size(b); i++) {
      if (dl_batch_sample_error(b, i)) {
        printf("%s error\n", dl_batch_key(b, i));
        errors++;
        continue;
      }
      uint64_t h = fnv((const uint8_t *)image.data + i * each, each, 14695981039346656037ull);
      h = fnv((const int64_t *)label.data + i, sizeof(int64_t), h);
      if (has_big)
        h = fnv((const uint8_t *)big.data + (size_t)i * BIG_BYTES, BIG_BYTES, h);
      printf("%s %016llx\n", dl_batch_key(b, i), (unsigned long long)h);
    }
    dl_batch_release(b, NULL);
  }
  if (r != DL_EOF) {
    printf("run %s %s\n", dl_errname(r), dl_last_error());
    return 0;
  }
  char stats[4096];
  if (dl_stats_json(l, stats, sizeof stats) <= 0)
    return 4;
  const char *e = strstr(stats, "\"errors\":");
  if (!e || atoi(e + 9) != errors)
    return 5; /* an error the stats did not count, or the other way round */
  printf("errors %d\n", errors);
  dl_close(l);
  return 0;
}

static void run(const char *self, const char *faults, const char *source, const char *io, outcome *o) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "DL_IO_FAULTS='%s' DL_LOG_LEVEL=0 '%s' child '%s' '%s'", faults, self, source, io);
  FILE *p = popen(cmd, "r");
  ASSERT(p);
  o->lines = 0;
  while (o->lines < (int)(sizeof o->text / sizeof *o->text) && fgets(o->text[o->lines], sizeof o->text[0], p)) {
    o->text[o->lines][strcspn(o->text[o->lines], "\n")] = 0;
    o->lines++;
  }
  int status = pclose(p);
  if (status != 0)
    FAIL_AT("DL_IO_FAULTS=%s io=%s %s: the child ended with status %d", faults, io, source, status);
}

static const char *key_of(const char *line, char *key, size_t cap) {
  snprintf(key, cap, "%.*s", (int)strcspn(line, " "), line);
  return key;
}

/* Checks run O against the reference REF; returns the number of samples lost to errors. */
static int check(const outcome *ref, const outcome *o, const char *faults, const char *source, bool exact) {
  if (o->lines == 1 && strncmp(o->text[0], "open ", 5) == 0) {
    if (exact)
      FAIL_AT("DL_IO_FAULTS=%s: %s", faults, o->text[0]);
    /* The message names the file that failed (a shard, or a file of the folder). */
    if (!strstr(o->text[0], dir) || !(strstr(o->text[0], "Input/output error") || strstr(o->text[0], "truncated") ||
                                      strstr(o->text[0], "ends") || strstr(o->text[0], "short")))
      FAIL_AT("DL_IO_FAULTS=%s %s: an open failure without the file or the reason: %s", faults, source, o->text[0]);
    return -1;
  }
  if (o->lines != ref->lines)
    FAIL_AT("DL_IO_FAULTS=%s %s: %d lines, %d without faults", faults, source, o->lines, ref->lines);
  int lost = 0;
  for (int i = 0; i < o->lines - 1; i++) {
    char k1[64], k2[64];
    if (strcmp(key_of(o->text[i], k1, sizeof k1), key_of(ref->text[i], k2, sizeof k2)) != 0)
      FAIL_AT("DL_IO_FAULTS=%s %s: sample %d is %s, %s without faults", faults, source, i, k1, k2);
    if (strstr(o->text[i], " error") && !exact) {
      lost++;
      continue;
    }
    if (strcmp(o->text[i], ref->text[i]) != 0)
      FAIL_AT("DL_IO_FAULTS=%s %s: '%s', '%s' without faults", faults, source, o->text[i], ref->text[i]);
  }
  return lost;
}

/* A .npy of N int32 values FIRST, FIRST + 1, ... (shape (N,)), with EXTRA bytes after the data. */
static size_t npy_of(uint8_t *out, int n, int first, int extra) {
  char header[118];
  int h = snprintf(header, sizeof header, "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }", n);
  memset(header + h, ' ', sizeof header - 1 - (size_t)h);
  header[sizeof header - 1] = '\n';
  memcpy(out, "\x93NUMPY\x01\x00\x76\x00", 10); /* header of 118 bytes: 128 in all */
  memcpy(out + 10, header, sizeof header);
  for (int i = 0; i < n; i++) {
    int32_t v = first + i;
    memcpy(out + 128 + 4 * (size_t)i, &v, 4);
  }
  memset(out + 128 + 4 * (size_t)n, 0x77, (size_t)extra);
  return 128 + 4 * (size_t)n + (size_t)extra;
}

/* Records with an image and a tensor field large enough to be read straight into the slot
 * (scattered reads, resumed after short ones); every fifth .npy has bytes after its data. */
static void write_tensors(char *path, size_t cap) {
  snprintf(path, cap, "%s/tensors.rfs", dir);
  unsigned char *jpg;
  unsigned long len;
  ASSERT_EQ(synthetic_jpeg(1, SYNTHETIC_DEFAULT, &jpg, &len), 0);
  dl_writer *w;
  ASSERT_EQ(dl_writer_open(&w, path, ""), 0);
  static uint8_t npy[BIG_BYTES + 256];
  for (int i = 0; i < SAMPLES; i++) {
    char key[32];
    snprintf(key, sizeof key, "t%04d", i);
    ASSERT_EQ(dl_writer_begin(w, key, i), 0);
    ASSERT_EQ(dl_writer_field(w, "image", "jpeg", jpg, len), 0);
    size_t n = npy_of(npy, BIG_BYTES / 4, i * 1000, i % 5 == 2 ? 24 : 0);
    ASSERT_EQ(dl_writer_field(w, "big", "raw", npy, n), 0);
    ASSERT_EQ(dl_writer_end(w), 0);
  }
  ASSERT_EQ(dl_writer_close(w), 0);
  free(jpg);
}

static void write_sources(char *tar, char *rfs, char *folder, size_t cap) {
  unsigned char *jpg[IMAGES];
  unsigned long len[IMAGES];
  snprintf(tar, cap, "%s/shard.tar", dir);
  snprintf(rfs, cap, "%s/shard.rfs", dir);
  snprintf(folder, cap, "%s/folder", dir);
  FILE *f = fopen(tar, "wb");
  ASSERT(f);
  dl_writer *w;
  ASSERT_EQ(dl_writer_open(&w, rfs, "align=512"), 0);
  for (int i = 0; i < SAMPLES; i++) {
    char key[32], name[600], text[32];
    snprintf(key, sizeof key, "k%04d", i);
    if (i < IMAGES) {
      test_tar_sample(f, key, i, i, &jpg[i], &len[i]);
    } else {
      snprintf(name, sizeof name, "%s.jpg", key);
      ASSERT_EQ(tar_write_member(f, name, jpg[i % IMAGES], len[i % IMAGES]), 0);
      snprintf(name, sizeof name, "%s.cls", key);
      int n = snprintf(text, sizeof text, "%d", i);
      ASSERT_EQ(tar_write_member(f, name, text, (size_t)n), 0);
    }
    static uint8_t pad[PAD_BYTES];
    memset(pad, i, sizeof pad);
    snprintf(name, sizeof name, "%s.pad", key);
    ASSERT_EQ(tar_write_member(f, name, pad, sizeof pad), 0);
    ASSERT_EQ(dl_writer_begin(w, key, i), 0);
    ASSERT_EQ(dl_writer_field(w, "image", "jpeg", jpg[i % IMAGES], len[i % IMAGES]), 0);
    ASSERT_EQ(dl_writer_end(w), 0);
    snprintf(name, sizeof name, "%s/c%d/%s.jpg", folder, i % 3, key);
    test_write_file(name, jpg[i % IMAGES], len[i % IMAGES]);
  }
  ASSERT_EQ(tar_write_end(f), 0);
  fclose(f);
  ASSERT_EQ(dl_writer_close(w), 0);
  for (int i = 0; i < IMAGES; i++)
    free(jpg[i]);
}

static char *whole(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ASSERT(f);
  char *p = malloc(1 << 20);
  ASSERT(p);
  *n = fread(p, 1, 1 << 20, f);
  fclose(f);
  return p;
}

/* The tar's index made with the shard cached (its pads stepped over) and with it dropped from the
 * page cache (read in windows): the same bytes, and the same samples. Where the file system keeps
 * the pages, both are the cached case, and it says so. */
static void index_uncached(const char *self, const char *tar, const char *index, const outcome *ref) {
  size_t n1, n2;
  char *cached = whole(index, &n1);
  unlink(index);
  int fd = open(tar, O_RDONLY);
  ASSERT(fd >= 0);
  ASSERT_EQ(fdatasync(fd), 0);
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  char b[512];
  struct iovec one = {b, sizeof b};
  bool dropped = preadv2(fd, &one, 1, 65536, RWF_NOWAIT) < 0 && errno == EAGAIN;
  close(fd);
  static outcome got;
  run(self, "", tar, "pread", &got);
  check(ref, &got, "(none, the shard not cached)", tar, true);
  char *uncached = whole(index, &n2);
  ASSERT_EQ(n1, n2);
  ASSERT(memcmp(cached, uncached, n1) == 0);
  printf("the tar's index made with the shard %s: the same %zu bytes as with it cached\n",
         dropped ? "dropped from the page cache" : "still cached (this file system keeps it)", n1);
  free(cached);
  free(uncached);
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "child") == 0)
    return child(argv[2], argv[3]);
  alarm(600);
  char self[1024];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT(n > 0);
  self[n] = 0;
  snprintf(dir, sizeof dir, "/tmp/ringfeed-faults-%d", (int)getpid());
  ASSERT_EQ(mkdir(dir, 0755), 0);
  char tar[512], rfs[512], folder[512], tensors[512], index[600];
  write_sources(tar, rfs, folder, sizeof tar);
  write_tensors(tensors, sizeof tensors);
  snprintf(index, sizeof index, "%s.rfidx", tar);
  const char *sources[] = {tar, rfs, folder, tensors};
  const char *ios[] = {"pread", "uring", "mmap"};
  static const char *const continued[] = {"eintr:2", "eagain:3", "short:2", "short:3,eintr:5"};
  static const char *const failing[] = {"eio:3", "eio:11", "zero:4", "zero:13", "eio:29,short:2,zero:31"};
  static outcome ref, got;
  int runs = 0, lost = 0, refused = 0;
  for (int s = 0; s < 4; s++) {
    for (int m = 0; m < 3; m++) {
      run(self, "", sources[s], ios[m], &ref); /* also caches the tar's index */
      if (ref.lines == 1 && m == 1 && strncmp(ref.text[0], "open ", 5) == 0) {
        printf("io=uring: not available here (%s)\n", ref.text[0]);
        continue;
      }
      ASSERT_EQ(ref.lines, SAMPLES + 1);
      ASSERT_STR_EQ(ref.text[SAMPLES], "errors 0");
      if (s == 0 && m == 0)
        index_uncached(self, tar, index, &ref);
      for (int cached = 0; cached < 2; cached++) {
        for (size_t f = 0; f < sizeof continued / sizeof *continued; f++) {
          if (!cached)
            unlink(index);
          run(self, continued[f], sources[s], ios[m], &got);
          check(&ref, &got, continued[f], sources[s], true);
          runs++;
        }
        for (size_t f = 0; f < sizeof failing / sizeof *failing; f++) {
          if (!cached)
            unlink(index);
          run(self, failing[f], sources[s], ios[m], &got);
          int k = check(&ref, &got, failing[f], sources[s], false);
          refused += k < 0;
          lost += k > 0 ? k : 0;
          runs++;
        }
      }
    }
  }
  for (int m = 0; m < 2; m++) { /* pread, io_uring; an ImageFolder opens without a read */
    run(self, "eio:1", folder, ios[m], &got);
    if (got.lines == 1 && m == 1 && strncmp(got.text[0], "open ", 5) == 0)
      continue; /* no io_uring here */
    const char *last = got.text[got.lines - 1];
    if (strncmp(last, "run EIO ", 8) || !strstr(last, " reads in a row failed: the storage is down"))
      FAIL_AT("every read failing, io=%s: the run went on or ended otherwise: %s", ios[m], last);
    printf("every read failing, io=%s: %d samples counted, then \"%s\"\n", ios[m], got.lines - 1, last + 4);
  }
  printf("%d runs under injected read faults: interrupted and short reads changed nothing; errors and early "
         "ends failed %d opens naming the file and cost %d samples, each counted, every other one exact\n",
         runs, refused, lost);
  ASSERT_GT(lost, 0);
  ASSERT_GT(refused, 0);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT_EQ(system(cmd), 0);
  return 0;
}
