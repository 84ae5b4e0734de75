/*
 * Synthetic ImageNet-like images: smooth value noise over several octaves (shapes and shading),
 * a few soft-edged blobs, and fine grain, so that JPEG sizes and decode costs resemble photos
 * (about 80-120 KB at quality 90 for 500x375) rather than flat colour.
 */
#include "synthetic.h"
#include "tools.h"
#include "tar_writer.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jpeglib.h>

#define PER_SHARD 1000
#define VERSION "v1"
#define GRAIN 56

static uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static float lattice(uint64_t seed, int x, int y) {
  return (float)(mix(seed ^ mix(((uint64_t)(uint32_t)x << 32) | (uint32_t)y)) >> 40) / (float)(1 << 24);
}

/* One octave of value noise: a lattice of random values, smoothly interpolated. */
typedef struct octave {
  float *grid;
  int gw, gh;
  float freq;
} octave;

static int octave_init(octave *o, uint64_t seed, int w, int h, float freq) {
  o->freq = freq;
  o->gw = (int)(w * freq) + 3;
  o->gh = (int)(h * freq) + 3;
  o->grid = malloc(sizeof(float) * (size_t)o->gw * o->gh);
  if (!o->grid)
    return -ENOMEM;
  for (int y = 0; y < o->gh; y++)
    for (int x = 0; x < o->gw; x++)
      o->grid[(size_t)y * o->gw + x] = lattice(seed, x, y);
  return 0;
}

static float octave_at(const octave *o, int x, int y) {
  float fx = x * o->freq, fy = y * o->freq;
  int x0 = (int)fx, y0 = (int)fy;
  fx -= x0;
  fy -= y0;
  fx = fx * fx * (3 - 2 * fx);
  fy = fy * fy * (3 - 2 * fy);
  const float *r0 = o->grid + (size_t)y0 * o->gw + x0, *r1 = r0 + o->gw;
  float top = r0[0] + (r0[1] - r0[0]) * fx, bottom = r1[0] + (r1[1] - r1[0]) * fx;
  return top + (bottom - top) * fy;
}

int synthetic_jpeg(long i, synthetic_coding coding, unsigned char **out, unsigned long *len) {
  uint64_t s = mix((uint64_t)i * 7919 + 17);
  int w = 400 + (int)(mix(s ^ 1) % 201), h = 300 + (int)(mix(s ^ 2) % 151);
  if (coding.width > 0 && coding.height > 0)
    w = coding.width, h = coding.height;
  unsigned char *px = malloc((size_t)w * h * 3);
  if (!px)
    return -ENOMEM;
  float base[3], tint[3];
  for (int c = 0; c < 3; c++) {
    base[c] = 40 + (float)(mix(s ^ (10 + c)) % 160);
    tint[c] = 0.5f + (float)(mix(s ^ (20 + c)) % 100) / 100.f;
  }
  int blobs = 3 + (int)(mix(s ^ 30) % 5);
  float bx[8], by[8], br[8], bc[8][3];
  for (int k = 0; k < blobs; k++) {
    bx[k] = (float)(mix(s ^ (40 + k)) % (unsigned)w);
    by[k] = (float)(mix(s ^ (50 + k)) % (unsigned)h);
    br[k] = 30 + (float)(mix(s ^ (60 + k)) % 120);
    for (int c = 0; c < 3; c++)
      bc[k][c] = (float)(mix(s ^ (70 + k * 3 + c)) % 200) - 100;
  }
  enum { OCTAVES = 6 };
  octave oct[OCTAVES] = {0};
  float amps[OCTAVES], norm = 0, amp = 1, freq = 1.f / 96;
  int r = 0;
  for (int o = 0; o < OCTAVES; o++, amp *= 0.62f, freq *= 2.1f) {
    amps[o] = amp;
    norm += amp;
    r |= octave_init(&oct[o], s + (uint64_t)o, w, h, freq);
  }
  for (int y = 0; y < h && !r; y++)
    for (int x = 0; x < w; x++) {
      float n = 0;
      for (int o = 0; o < OCTAVES; o++)
        n += amps[o] * octave_at(&oct[o], x, y);
      n = n / norm - 0.5f;
      float grain = lattice(s ^ 0xabc, x, y) - 0.5f;
      float add[3] = {0, 0, 0};
      for (int k = 0; k < blobs; k++) {
        float dx = x - bx[k], dy = y - by[k];
        float d2 = (dx * dx + dy * dy) / (br[k] * br[k]);
        if (d2 < 1.44f) {
          float d = sqrtf(d2), f = d < 1 ? 1 : (1.2f - d) * 5;
          for (int c = 0; c < 3; c++)
            add[c] += bc[k][c] * f;
        }
      }
      for (int c = 0; c < 3; c++) {
        float v = base[c] + 190 * n * tint[c] + GRAIN * grain + add[c];
        px[((size_t)y * w + x) * 3 + c] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
      }
    }
  for (int o = 0; o < OCTAVES; o++)
    free(oct[o].grid);
  if (r) {
    free(px);
    return r;
  }
  struct jpeg_compress_struct cj;
  struct jpeg_error_mgr err;
  cj.err = jpeg_std_error(&err);
  jpeg_create_compress(&cj);
  *out = NULL;
  *len = 0;
  jpeg_mem_dest(&cj, out, len);
  cj.image_width = (JDIMENSION)w;
  cj.image_height = (JDIMENSION)h;
  cj.input_components = 3;
  cj.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cj);
  jpeg_set_quality(&cj, coding.quality, TRUE);
  if (coding.subsampling == 444)
    cj.comp_info[0].h_samp_factor = cj.comp_info[0].v_samp_factor = 1;
  cj.restart_interval = (unsigned)coding.restart;
  for (int c = 1; coding.shared_tables && c < cj.num_components; c++)
    cj.comp_info[c].dc_tbl_no = cj.comp_info[c].ac_tbl_no = 0;
  jpeg_start_compress(&cj, TRUE);
  while (cj.next_scanline < cj.image_height) {
    JSAMPROW row = px + (size_t)cj.next_scanline * w * 3;
    jpeg_write_scanlines(&cj, &row, 1);
  }
  jpeg_finish_compress(&cj);
  jpeg_destroy_compress(&cj);
  free(px);
  return 0;
}

typedef struct job {
  const char *dir;
  synthetic_coding coding;
  long n, nshards;
  long next;
  long done; /* samples written, for the progress */
  pthread_mutex_t mu; /* over next, done and err */
  int err;
} job;

static int write_shard(job *j, const char *dir, synthetic_coding coding, long shard, long n) {
  char path[PATH_MAX], tmp[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/synth-%06ld.tar", dir, shard);
  snprintf(tmp, sizeof tmp, "%s.part", path);
  FILE *f = fopen(tmp, "wb");
  if (!f)
    return -errno;
  int r = 0;
  for (long i = shard * PER_SHARD; i < n && i < (shard + 1) * PER_SHARD && !r; i++) {
    unsigned char *jpg;
    unsigned long len;
    if ((r = synthetic_jpeg(i, coding, &jpg, &len)))
      break;
    char name[64], label[32];
    snprintf(name, sizeof name, "%08ld.jpg", i);
    r = tar_write_member(f, name, jpg, len);
    free(jpg);
    int ln = snprintf(label, sizeof label, "%ld", i % 1000);
    snprintf(name, sizeof name, "%08ld.cls", i);
    if (!r)
      r = tar_write_member(f, name, label, (size_t)ln);
    pthread_mutex_lock(&j->mu);
    j->done++;
    pthread_mutex_unlock(&j->mu);
  }
  if (!r)
    r = tar_write_end(f);
  if (fclose(f) && !r)
    r = -EIO;
  if (!r && rename(tmp, path))
    r = -errno;
  if (r)
    unlink(tmp);
  return r;
}

static void *worker(void *arg) {
  job *j = arg;
  for (;;) {
    pthread_mutex_lock(&j->mu);
    long shard = j->err ? j->nshards : j->next++;
    pthread_mutex_unlock(&j->mu);
    if (shard >= j->nshards)
      return NULL;
    int r = write_shard(j, j->dir, j->coding, shard, j->n);
    if (r) {
      pthread_mutex_lock(&j->mu);
      j->err = r;
      pthread_mutex_unlock(&j->mu);
    }
  }
}

/* While the set is written: a bar redrawn on a terminal, else a line at every tenth. */
static void show_progress(job *j, bool tty) {
  struct timespec t0, now, tick = {0, 200 * 1000000};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  long said = 0; /* tenths said */
  for (;;) {
    pthread_mutex_lock(&j->mu);
    long done = j->done;
    bool over = done >= j->n || j->err;
    pthread_mutex_unlock(&j->mu);
    clock_gettime(CLOCK_MONOTONIC, &now);
    double s = (double)(now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) * 1e-9;
    if (tty) {
      int filled = (int)(30 * done / j->n);
      fprintf(stderr, "\r[%.*s%*s] %ld/%ld samples, %.0f s", filled, "##############################", 30 - filled,
              "", done, j->n, s);
      if (over)
        fprintf(stderr, "\n");
    } else {
      for (; said < 10 && done * 10 >= (said + 1) * j->n; said++)
        fprintf(stderr, "dlbench: synthetic set %ld%% (%ld of %ld samples, %.0f s)\n", (said + 1) * 10,
                (said + 1) * j->n / 10, j->n, s);
    }
    if (over)
      return;
    nanosleep(&tick, NULL);
  }
}

int synthetic_dataset(long n, synthetic_coding coding, int threads, char *source, size_t cap) {
  char dir[PATH_MAX], base[PATH_MAX];
  const char *env = getenv("DL_SYNTHETIC_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  if (env && *env)
    snprintf(base, sizeof base, "%s", env);
  else if (xdg && *xdg)
    snprintf(base, sizeof base, "%s/ringfeed", xdg);
  else
    snprintf(base, sizeof base, "%s/.cache/ringfeed", home ? home : "/tmp");
  /* The default coding keeps the folder name it always had. */
  const char *shared = coding.shared_tables ? "-shared" : "";
  if (coding.quality == 90 && coding.subsampling == 420)
    snprintf(dir, sizeof dir, "%s/synthetic-%s-%ld%s", base, VERSION, n, shared);
  else
    snprintf(dir, sizeof dir, "%s/synthetic-%s-%ld-q%d-%d%s", base, VERSION, n, coding.quality, coding.subsampling,
             shared);
  long nshards = (n + PER_SHARD - 1) / PER_SHARD;
  int w = snprintf(source, cap, nshards == 1 ? "%s/synth-%06ld.tar" : "%s/synth-{000000..%06ld}.tar",
                   dir, nshards - 1);
  if (w < 0 || (size_t)w >= cap)
    return -ENAMETOOLONG;
  char done[PATH_MAX + 8];
  snprintf(done, sizeof done, "%s/.complete", dir);
  if (access(done, F_OK) == 0)
    return 0;
  dl_tool_mkdirs(dir);
  fprintf(stderr, "dlbench: generating %ld synthetic samples in %s (once)\n", n, dir);
  job j = {.dir = dir, .coding = coding, .n = n, .nshards = nshards};
  pthread_mutex_init(&j.mu, NULL);
  if (threads < 1)
    threads = 1;
  pthread_t t[64];
  if (threads > 64)
    threads = 64;
  for (int i = 0; i < threads; i++)
    pthread_create(&t[i], NULL, worker, &j);
  show_progress(&j, isatty(2));
  for (int i = 0; i < threads; i++)
    pthread_join(t[i], NULL);
  pthread_mutex_destroy(&j.mu);
  if (j.err) {
    fprintf(stderr, "dlbench: could not write the synthetic set in %s: %s\n", dir, strerror(-j.err));
    return j.err;
  }
  FILE *f = fopen(done, "w");
  if (f)
    fclose(f);
  return 0;
}
