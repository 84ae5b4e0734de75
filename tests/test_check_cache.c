/*
 * The GPU check's verdicts kept across runs (lib/gpu/check_verdicts.c): a second open of the same shards
 * takes every verdict the first made and reads no scan; what one loader learnt and another learnt
 * are both kept; a damaged, forged or stale file is ignored and written again; a shard changed
 * under it names another file. Image folders keep theirs too, named by their files' identities.
 * Ringfeed shards carry their writer's verdicts, which a first open takes.
 * The loaders here decode on the CPU, and the walks the GPU path would ask for are asked directly.
 */
#include "core.h"
#include "entropy_damaged.h"
#include "test.h"
#include "test_data.h"
#include "tar_writer.h"

#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

enum { IMAGES = 12 };
static char dir[256], shard[300], cache[300];

/* Image I of IMAGES synthetic JPEGs (malloc'd), the last one's data cut short. */
static unsigned char *image(int i, unsigned long *len) {
  unsigned char *jpg;
  ASSERT_EQ(synthetic_jpeg(700 + i, SYNTHETIC_DEFAULT, &jpg, len), 0);
  if (i == IMAGES - 1) {
    *len = *len / 2;
    jpg[*len - 2] = 0xFF, jpg[*len - 1] = 0xD9;
  }
  return jpg;
}

/* A shard of the images. */
static void write_shard(void) {
  FILE *f = fopen(shard, "wb");
  ASSERT(f);
  for (int i = 0; i < IMAGES; i++) {
    unsigned long len;
    unsigned char *jpg = image(i, &len);
    char name[32];
    snprintf(name, sizeof name, "s%04d.jpg", i);
    ASSERT_EQ(tar_write_member(f, name, jpg, len), 0);
    snprintf(name, sizeof name, "s%04d.cls", i);
    ASSERT_EQ(tar_write_member(f, name, "1", 1), 0);
    free(jpg);
  }
  ASSERT_EQ(tar_write_end(f), 0);
  ASSERT_EQ(fclose(f), 0);
}

/* The same images as an image folder: root/<class>/<image>, or all in ROOT (flat). */
static void write_folder(const char *root, bool flat) {
  char path[400];
  ASSERT_EQ(dl__mkdirs(root), 0);
  for (int i = 0; i < IMAGES; i++) {
    unsigned long len;
    unsigned char *jpg = image(i, &len);
    if (flat) {
      snprintf(path, sizeof path, "%s/s%04d.jpg", root, i);
    } else {
      snprintf(path, sizeof path, "%s/c%d", root, i % 2);
      ASSERT_EQ(dl__mkdirs(path), 0);
      snprintf(path, sizeof path, "%s/c%d/s%04d.jpg", root, i % 2, i);
    }
    test_write_file(path, jpg, len);
    free(jpg);
  }
}

static dl_loader *open_source(const char *source) {
  dl_loader *l;
  OPEN_OK(l, source, "workers=1 batch_size=4");
  ASSERT(l->jpeg_rows);
  ASSERT_EQ(l->ds.n, IMAGES);
  dl__check_verdicts_load(l);
  return l;
}

static dl_loader *open_loader(void) { return open_source(shard); }

/* The walk the GPU path asks for, of samples [FROM, TO); each verdict into V. */
static void walk(dl_loader *l, int from, int to, int *v) {
  for (int i = from; i < to; i++) {
    const dl__sample *s = &l->ds.samples[i];
    uint8_t *p = malloc(s->image_len);
    ASSERT(p);
    int fd = l->ds.nremote ? open(shard, O_RDONLY) /* what the server serves */
             : l->ds.fds[s->file] >= 0 ? l->ds.fds[s->file] : open(l->ds.files[s->file], O_RDONLY);
    ASSERT(fd >= 0);
    ASSERT_EQ(pread(fd, p, s->image_len, (off_t)(s->offset + s->image_at)), (ssize_t)s->image_len);
    if (fd != l->ds.fds[s->file])
      close(fd);
    v[i] = dl__jpeg_rows_clean(l->jpeg_rows, (uint32_t)i, p, s->image_len, l->o.max_pixels);
    free(p);
  }
}

/* SOURCE opened twice: the first open reads every scan (the last image's is damaged) and keeps
 * the verdicts, the second takes them all and reads none. */
static void kept_across_opens(const char *source) {
  int first[IMAGES], again[IMAGES], damaged = 0;
  dl_loader *l = open_source(source);
  ASSERT_EQ(l->st.check_kept, 0);
  walk(l, 0, IMAGES, first);
  for (int i = 0; i < IMAGES; i++)
    damaged += !first[i];
  ASSERT_EQ(damaged, 1);
  dl_close(l);
  l = open_source(source);
  ASSERT_EQ(l->st.check_kept, IMAGES);
  walk(l, 0, IMAGES, again);
  ASSERT_EQ(dl__jpeg_rows_walked(l->jpeg_rows), 0);
  ASSERT(!memcmp(first, again, sizeof first));
  dl_close(l);
}

/* The verdicts files in the cache folder: how many, and the first one's path and bytes. */
static int cache_files(char *path, size_t cap, uint8_t **p, size_t *len) {
  char pattern[400];
  snprintf(pattern, sizeof pattern, "%s/*.rfcheck", cache);
  glob_t g;
  if (glob(pattern, 0, NULL, &g))
    return 0;
  int n = (int)g.gl_pathc;
  if (path) {
    snprintf(path, cap, "%s", g.gl_pathv[0]);
    ASSERT_EQ(dl__read_file(path, 1, p, len), 0);
  }
  globfree(&g);
  return n;
}

static void rewrite(const char *path, uint8_t *p, size_t len, bool fix_sum) {
  if (fix_sum) {
    uint64_t sum = XXH64(p, len - 8, 0);
    memcpy(p + len - 8, &sum, 8);
  }
  ASSERT_EQ(dl__write_file(path, p, len), 0);
}

/* In the ringfeed shard at PATH, every field entry's scan byte (docs/format.md), which its writer
 * set to WROTE[record], set to SCAN; the index's checksum made good. */
static void set_scan_bytes(const char *path, const uint8_t *wrote, int scan) {
  uint8_t *p;
  size_t len;
  ASSERT_EQ(dl__read_file(path, 1, &p, &len), 0);
  uint64_t at, size, n, keys;
  memcpy(&at, p + len - 32, 8);
  memcpy(&size, p + len - 24, 8);
  uint8_t *x = p + at, *q = x + 8;
  uint32_t names;
  memcpy(&n, q, 8), q += 8;
  memcpy(&names, q, 4), q += 4;
  for (uint32_t i = 0; i < names; i++)
    q += 2 + (q[0] | q[1] << 8);
  memcpy(&keys, q, 8), q += 8 + keys;
  for (uint64_t r = 0; r < n; r++) {
    uint16_t fields = (uint16_t)(q[32] | q[33] << 8);
    q += 34;
    for (uint16_t f = 0; f < fields; f++, q += 20) {
      ASSERT_EQ(q[3], wrote[r]);
      q[3] = (uint8_t)scan;
    }
  }
  ASSERT(q == x + size);
  uint64_t sum = XXH3_64bits(x, size);
  memcpy(p + len - 16, &sum, 8);
  rewrite(path, p, len, false);
  free(p);
}

/* JPEGS (N of them) as a ringfeed shard at PATH, one image field a record. */
static void write_rfs_of(const char *path, uint8_t *const *jpegs, const size_t *lens, int n) {
  dl_writer *w;
  ASSERT_EQ(dl_writer_open(&w, path, NULL), 0);
  for (int i = 0; i < n; i++) {
    char key[16];
    snprintf(key, sizeof key, "s%04d", i);
    ASSERT_EQ(dl_writer_begin(w, key, 1), 0);
    ASSERT_EQ(dl_writer_field(w, "image", "jpeg", jpegs[i], lens[i]), 0);
    ASSERT_EQ(dl_writer_end(w), 0);
  }
  ASSERT_EQ(dl_writer_close(w), 0);
}

/* The images as a ringfeed shard at PATH: the writer reads the 11 sound ones clean; with SCAN >= 0,
 * every scan byte then set to it. */
static void write_rfs(const char *path, int scan) {
  uint8_t *jpegs[IMAGES], wrote[IMAGES];
  size_t lens[IMAGES];
  for (int i = 0; i < IMAGES; i++) {
    unsigned long len;
    jpegs[i] = image(i, &len);
    lens[i] = len;
    wrote[i] = i < IMAGES - 1;
  }
  write_rfs_of(path, jpegs, lens, IMAGES);
  for (int i = 0; i < IMAGES; i++)
    free(jpegs[i]);
  if (scan >= 0)
    set_scan_bytes(path, wrote, scan);
}

/* A progressive JPEG and a sequential one in a ringfeed shard: its writer says the second reads
 * clean, not the first, of which it cannot (a loader reads such a file itself), and dlshard ls
 * counts them; a shard that says so of the first is named by dlshard verify, which reads the file
 * through (DLSHARD: its path). */
static void claims_verified(const char *dlshard) {
  char path[400], cmd[1000], out[400];
  snprintf(path, sizeof path, "%s/claims.rfs", dir);
  snprintf(out, sizeof out, "%s/claims.txt", dir);
  uint8_t *jpegs[2], wrote[2] = {0, 1};
  size_t lens[2];
  unsigned long len;
  jpegs[0] = several_scans_jpeg(1, &lens[0]);
  jpegs[1] = image(0, &len);
  lens[1] = len;
  write_rfs_of(path, jpegs, lens, 2);
  snprintf(cmd, sizeof cmd, "%s ls %s > %s 2>&1", dlshard, path, out);
  ASSERT_EQ(system(cmd), 0);
  uint8_t *text;
  size_t n;
  ASSERT_EQ(dl__read_file(out, 1, &text, &n), 0);
  text[n - 1] = 0;
  ASSERT(strstr((char *)text, "(1 of 2 JPEGs read clean by the writer)"));
  free(text);
  snprintf(cmd, sizeof cmd, "%s verify %s > %s 2>&1", dlshard, path, out);
  ASSERT_EQ(system(cmd), 0);
  set_scan_bytes(path, wrote, 1);
  int st = system(cmd);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 1);
  ASSERT_EQ(dl__read_file(out, 1, &text, &n), 0);
  text[n - 1] = 0;
  ASSERT(strstr((char *)text, "s0000") && strstr((char *)text, "says its JPEG's codes read clean"));
  ASSERT(!strstr((char *)text, "s0001"));
  printf("dlshard verify names a record whose shard says a progressive JPEG reads clean: %s\n", (char *)text);
  free(text);
  free(jpegs[0]);
  free(jpegs[1]);
  unlink(path);
}

/* The test shard compressed with zstd into PATH. */
static void write_packed(const char *path) {
  uint8_t *plain;
  size_t plain_len;
  ASSERT_EQ(dl__read_file(shard, 1, &plain, &plain_len), 0);
  size_t cap = ZSTD_compressBound(plain_len);
  uint8_t *z = malloc(cap);
  ASSERT(z);
  size_t z_len = ZSTD_compress(z, cap, plain, plain_len, 3);
  ASSERT(!ZSTD_isError(z_len));
  test_write_file(path, z, z_len);
  free(z);
  free(plain);
}

/* With "URL FOLDER": the shard written into FOLDER, which a web server serves at URL
 * (tests/remote/test_cache.py starts nginx): named by its URL and version, its verdicts are kept;
 * changed on the server (a new ETag), they are not. */
static int over_http(const char *url, const char *folder) {
  snprintf(shard, sizeof shard, "%s/shard.tar", folder);
  write_shard();
  char source[600];
  snprintf(source, sizeof source, "%s/shard.tar", url);
  kept_across_opens(source);
  struct timespec when[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
  ASSERT_EQ(utimensat(AT_FDCWD, shard, when, 0), 0);
  dl_loader *l = open_source(source);
  ASSERT_EQ(l->ds.nremote, 1);
  ASSERT_EQ(l->st.check_kept, 0);
  dl_close(l);
  printf("a shard over HTTP: a second open keeps every verdict; the shard changed on the server, none\n");
  /* Compressed, it is read from a local copy made at every open: named by the same version. */
  char packed[600];
  snprintf(packed, sizeof packed, "%s/packed.tar.zst", folder);
  write_packed(packed);
  snprintf(source, sizeof source, "%s/packed.tar.zst", url);
  kept_across_opens(source);
  ASSERT_EQ(utimensat(AT_FDCWD, packed, when, 0), 0);
  l = open_source(source);
  ASSERT_EQ(l->ds.nremote, 0);
  ASSERT_EQ(l->ds.unpacked_temp, 1);
  ASSERT_EQ(l->st.check_kept, 0);
  dl_close(l);
  printf("a compressed shard over HTTP, read from a local copy: a second open keeps every verdict; changed on "
         "the server, none\n");
  return 0;
}

int main(int argc, char **argv) {
  snprintf(dir, sizeof dir, "/tmp/rf_check_cache_XXXXXX");
  ASSERT(mkdtemp(dir));
  snprintf(shard, sizeof shard, "%s/shard.tar", dir);
  snprintf(cache, sizeof cache, "%s/cache/ringfeed", dir);
  char xdg[300];
  snprintf(xdg, sizeof xdg, "%s/cache", dir);
  setenv("XDG_CACHE_HOME", xdg, 1);
  if (argc == 3) {
    int rc = over_http(argv[1], argv[2]);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ASSERT_EQ(system(cmd), 0);
    return rc;
  }
  write_shard();

  /* The first run reads every scan and keeps what it found. */
  int first[IMAGES], again[IMAGES];
  dl_loader *l = open_loader();
  ASSERT_EQ(l->st.check_kept, 0);
  walk(l, 0, IMAGES, first);
  ASSERT_EQ(dl__jpeg_rows_walked(l->jpeg_rows), IMAGES);
  for (int i = 0; i < IMAGES; i++)
    ASSERT_EQ(first[i], i == IMAGES - 1 ? 0 : 1);
  dl_close(l);
  char path[600];
  size_t len;
  uint8_t *p = NULL;
  ASSERT_EQ(cache_files(path, sizeof path, &p, &len), 1);
  ASSERT_EQ(len, 24 + IMAGES + 8);

  /* The second takes them all, and reads none. */
  l = open_loader();
  ASSERT_EQ(l->st.check_kept, IMAGES);
  walk(l, 0, IMAGES, again);
  ASSERT_EQ(dl__jpeg_rows_walked(l->jpeg_rows), 0);
  ASSERT(!memcmp(first, again, sizeof first));
  dl_close(l);
  printf("a second open: %d verdicts kept, no scan read again\n", IMAGES);

  /* Damaged (a flipped byte), forged (a value no verdict has, its hash made good), cut short:
   * ignored, the scans read again, and the file written again. */
  for (int k = 0; k < 3; k++) {
    uint8_t *bad = malloc(len);
    memcpy(bad, p, len);
    if (k == 0)
      bad[24 + 3] ^= 1;
    if (k == 1)
      bad[24 + 3] = 7;
    rewrite(path, bad, k == 2 ? len - 5 : len, k == 1);
    free(bad);
    l = open_loader();
    ASSERT_EQ(l->st.check_kept, 0);
    walk(l, 0, IMAGES, again);
    ASSERT_EQ(dl__jpeg_rows_walked(l->jpeg_rows), IMAGES);
    ASSERT(!memcmp(first, again, sizeof first));
    dl_close(l);
    l = open_loader();
    ASSERT_EQ(l->st.check_kept, IMAGES);
    dl_close(l);
  }
  printf("a damaged, a forged and a truncated file: ignored, the scans read again and kept\n");

  /* Two loaders at once, each learning half: both halves are kept. */
  unlink(path);
  dl_loader *a = open_loader(), *b = open_loader();
  walk(a, 0, IMAGES / 2, again);
  walk(b, IMAGES / 2, IMAGES, again);
  dl_close(a);
  dl_close(b);
  l = open_loader();
  ASSERT_EQ(l->st.check_kept, IMAGES);
  walk(l, 0, IMAGES, again);
  ASSERT(!memcmp(first, again, sizeof first));
  dl_close(l);
  printf("two loaders learning half each: both halves kept\n");

  /* The shard changed (its mtime): the verdicts are not its any more. */
  struct timespec when[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
  ASSERT_EQ(utimensat(AT_FDCWD, shard, when, 0), 0);
  l = open_loader();
  ASSERT_EQ(l->st.check_kept, 0);
  dl_close(l);
  /* Nor kept without gpu_check. */
  OPEN_OK(l, shard, "workers=1 batch_size=4 gpu_check=0");
  dl__check_verdicts_load(l);
  ASSERT_EQ(l->st.check_kept, 0);
  walk(l, 0, 2, again);
  dl_close(l);
  ASSERT_EQ(cache_files(NULL, 0, NULL, NULL), 1);
  printf("a shard changed, or gpu_check=0: no verdicts taken\n");

  /* Image folders, whose files are opened per read: named by what stat said of each at open. */
  for (int flat = 0; flat < 2; flat++) {
    char root[400], one[460];
    snprintf(root, sizeof root, "%s/%s", dir, flat ? "flat" : "classes");
    write_folder(root, flat);
    kept_across_opens(root);
    /* One image rewritten (its mtime and ctime move): the folder's verdicts are read again. */
    snprintf(one, sizeof one, flat ? "%s/s0003.jpg" : "%s/c1/s0003.jpg", root);
    ASSERT_EQ(utimensat(AT_FDCWD, one, when, 0), 0);
    l = open_source(root);
    ASSERT_EQ(l->st.check_kept, 0);
    dl_close(l);
  }
  printf("image folders, with classes and flat: a second open keeps every verdict; one image touched, "
         "none\n");

  /* A compressed shard, read from a temporary copy made at every open: named by the compressed
   * file, so a second open keeps the verdicts. */
  char packed[400];
  snprintf(packed, sizeof packed, "%s/packed.tar.zst", dir);
  write_packed(packed);
  l = open_source(packed);
  ASSERT_EQ(l->ds.unpacked_temp, 1);
  dl_close(l);
  kept_across_opens(packed);
  printf("a compressed shard read from a temporary copy: a second open keeps every verdict\n");

  /* A ringfeed shard of the images: its writer read each JPEG's codes, and an open takes the 11
   * sound ones' verdicts from it (with gpu_check=0 too) and reads only the damaged one; with the
   * byte that says so 0 (a writer before it) or a value this version does not know, none. */
  char rfs[400];
  snprintf(rfs, sizeof rfs, "%s/shard.rfs", dir);
  for (int k = 0; k < 4; k++) {
    write_rfs(rfs, k < 2 ? -1 : k == 2 ? 0 : 7);
    if (k == 1) {
      OPEN_OK(l, rfs, "workers=1 batch_size=4 gpu_check=0");
      dl__check_verdicts_load(l);
    } else {
      l = open_source(rfs);
    }
    ASSERT_EQ(l->st.check_kept, 0);
    ASSERT_EQ(l->st.check_shards, (k < 2 ? IMAGES - 1 : 0));
    walk(l, 0, IMAGES, again);
    ASSERT_EQ(dl__jpeg_rows_walked(l->jpeg_rows), (k < 2 ? 1 : IMAGES));
    ASSERT(!memcmp(first, again, sizeof first));
    dl_close(l);
    char rm[500];
    snprintf(rm, sizeof rm, "rm -f %s %s/*.rfcheck", rfs, cache); /* the next open knows nothing of it */
    ASSERT_EQ(system(rm), 0);
  }
  const char *dlshard = getenv("DL_DLSHARD");
  if (dlshard && *dlshard)
    claims_verified(dlshard);
  printf("a ringfeed shard: its writer's verdicts taken for the %d sound JPEGs (gpu_check on and off), only "
         "the damaged one read; none from a writer before them or a later one's value\n", IMAGES - 1);

  /* A cache folder that cannot be made (its place is a file): nothing kept, nothing lost. */
  char blocked[400];
  snprintf(blocked, sizeof blocked, "%s/not-a-folder", dir);
  test_write_file(blocked, "x", 1);
  setenv("XDG_CACHE_HOME", blocked, 1);
  l = open_loader();
  walk(l, 0, IMAGES, again);
  ASSERT(!memcmp(first, again, sizeof first));
  dl_close(l);
  l = open_loader();
  ASSERT_EQ(l->st.check_kept, 0);
  dl_close(l);
  printf("a cache folder that cannot be made: the verdicts are read again, the same\n");

  free(p);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ASSERT_EQ(system(cmd), 0);
  return 0;
}
