/*
 * Pixels through the loader, from shards built by GNU tar and by Python's tarfile:
 * libjpeg-turbo's images against its reference image, its arithmetic and progressive codings of
 * one image against the baseline coding (identical pixels), jpeg-decoder's reference
 * JPEGs against their expected PNGs (within the spread of IDCT and upsampling implementations),
 * and 12-bit and lossless JPEGs refused as unsupported.
 */
#include "ringfeed.h"
#include "test.h"

#include <png.h>
#include <stdbool.h>

typedef struct image {
  int w, h;
  unsigned char *rgb;
} image;

static int read_ppm(const char *path, image *im) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -1;
  char magic[3] = {0};
  int maxval;
  if (fscanf(f, "%2s %d %d %d", magic, &im->w, &im->h, &maxval) != 4 || maxval != 255) {
    fclose(f);
    return -1;
  }
  fgetc(f);
  int gray = !strcmp(magic, "P5");
  size_t n = (size_t)im->w * im->h;
  im->rgb = malloc(n * 3);
  size_t got = fread(im->rgb, gray ? 1 : 3, n, f);
  fclose(f);
  if (got != n)
    return -1;
  for (size_t i = n; gray && i-- > 0;)
    im->rgb[3 * i] = im->rgb[3 * i + 1] = im->rgb[3 * i + 2] = im->rgb[i];
  return 0;
}

static int read_png(const char *path, image *im) {
  png_image p;
  memset(&p, 0, sizeof p);
  p.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&p, path))
    return -1;
  p.format = PNG_FORMAT_RGB;
  im->w = (int)p.width;
  im->h = (int)p.height;
  im->rgb = malloc(PNG_IMAGE_SIZE(p));
  if (!png_image_finish_read(&p, NULL, im->rgb, 0, NULL))
    return -1;
  return 0;
}

/* Decodes the one sample of SHARD at its own size; returns its error code. */
static int load(const char *shard, const char *crop, int w, int h, unsigned char *out, char *key,
                size_t keycap) {
  char opts[256];
  snprintf(opts, sizeof opts, "batch_size=1 workers=1 shuffle=0 crop=%s image_size=%dx%d", crop, h, w);
  dl_loader *l;
  OPEN_OK(l, shard, opts);
  dl_batch *b;
  ASSERT_EQ(dl_next_batch(l, &b), 0);
  ASSERT_EQ(dl_batch_size(b), 1);
  int err = dl_batch_sample_error(b, 0);
  DLTensor t;
  ASSERT_EQ(dl_batch_field(b, "image", &t), 0);
  ASSERT_EQ(t.shape[1], h);
  ASSERT_EQ(t.shape[2], w);
  ASSERT_EQ(t.shape[3], 3);
  memcpy(out, t.data, (size_t)w * h * 3);
  snprintf(key, keycap, "%s", dl_batch_key(b, 0));
  dl_batch_release(b, NULL);
  ASSERT_EQ(dl_next_batch(l, &b), DL_EOF);
  dl_close(l);
  return err;
}

/* Regression: a decoder context reused after an ordinary JPEG must not lend its Huffman tables to
 * a Motion-JPEG frame that relies on the standard ones. */
static void regression_stale_jpeg_tables(const char *dir) {
  char both[4096], alone[4096];
  snprintf(both, sizeof both, "%s/stale-tables.tar", dir);
  snprintf(alone, sizeof alone, "%s/mjpeg-alone.tar", dir);
  const char *opts = "batch_size=2 workers=1 shuffle=0 crop=resize image_size=60x80";
  dl_loader *a, *b;
  OPEN_OK(a, both, opts);
  OPEN_OK(b, alone, opts);
  dl_batch *x, *y;
  ASSERT_EQ(dl_next_batch(a, &x), 0);
  ASSERT_EQ(dl_next_batch(b, &y), 0);
  ASSERT_EQ(dl_batch_size(x), 2);
  ASSERT_EQ(dl_batch_sample_error(x, 1), 0);
  DLTensor tx, ty;
  dl_batch_field(x, "image", &tx);
  dl_batch_field(y, "image", &ty);
  ASSERT_EQ(memcmp((uint8_t *)tx.data + 60 * 80 * 3, ty.data, 60 * 80 * 3), 0);
  dl_batch_release(x, NULL);
  dl_batch_release(y, NULL);
  dl_close(a);
  dl_close(b);
  printf("regression: a Motion-JPEG frame after another JPEG decodes as it does alone\n");
}

int main(void) {
  const char *dir = test_shards();
  regression_stale_jpeg_tables(dir);
  char path[4096];
  snprintf(path, sizeof path, "%s/pixels.tsv", dir);
  FILE *list = fopen(path, "r");
  ASSERT(list);
  char line[8192];
  int checked = 0;
  char done_id[256][64];
  image done_img[256];
  int ndone = 0;
  while (fgets(line, sizeof line, list)) {
    char id[64], kind[32], ref[4096], src[4096];
    ASSERT_EQ(sscanf(line, "%63[^\t]\t%31[^\t]\t%4095[^\t]\t%4095[^\n]", id, kind, ref, src), 4);
    image want = {0};
    if (!strcmp(kind, "same")) {
      for (int i = 0; i < ndone; i++)
        if (!strcmp(done_id[i], ref))
          want = done_img[i];
      ASSERT(want.rgb);
    } else if (strcmp(kind, "unsupported") && strcmp(kind, "corrupt")) {
      size_t n = strlen(ref);
      int r = n > 4 && !strcmp(ref + n - 4, ".png") ? read_png(ref, &want) : read_ppm(ref, &want);
      if (r)
        FAIL_AT("cannot read reference %s", ref);
    } else {
      want.w = want.h = 8;
    }
    const char *dialects[] = {"gnu", "py"};
    for (int d = 0; d < 2; d++) {
      char shard[4096], key[256];
      snprintf(shard, sizeof shard, "%s/pixels/%s/%s.tar", dir, dialects[d], id);
      unsigned char *got = malloc((size_t)want.w * want.h * 3);
      bool bad = !strcmp(kind, "unsupported") || !strcmp(kind, "corrupt");
      int err = load(shard, bad ? "resize" : "none", want.w, want.h, got, key, sizeof key);
      ASSERT_STR_EQ(key, id);
      if (bad) {
        int want_err = kind[0] == 'u' ? DL_EUNSUPPORTED : DL_ECORRUPT;
        if (err != want_err)
          FAIL_AT("%s (%s): expected %s, got %s", src, dialects[d], dl_errname(want_err),
                  dl_errname(err));
        free(got);
        continue;
      }
      if (err)
        FAIL_AT("%s (%s): decode failed with %s", src, dialects[d], dl_errname(err));
      size_t n = (size_t)want.w * want.h * 3;
      int max = 0;
      double sum = 0;
      for (size_t i = 0; i < n; i++) {
        int diff = abs((int)got[i] - (int)want.rgb[i]);
        max = diff > max ? diff : max;
        sum += diff;
      }
      double mean = sum / n;
      if (d == 0)
        printf("%-60s %-5s max %3d mean %.3f\n", src + (strlen(src) > 60 ? strlen(src) - 60 : 0),
               kind, max, mean);
      if (!strcmp(kind, "same"))
        ASSERT_EQ(max, 0);
      else if (mean > 1.0 || max > 48)
        FAIL_AT("%s: differs from its reference: max %d, mean %.3f", src, max, mean);
      if (d == 1 && ndone < 256) {
        snprintf(done_id[ndone], sizeof done_id[0], "%s", id);
        done_img[ndone++] = (image){want.w, want.h, got};
      } else {
        free(got);
      }
    }
    if (strcmp(kind, "same"))
      free(want.rgb);
    checked++;
  }
  fclose(list);
  for (int i = 0; i < ndone; i++)
    free(done_img[i].rgb);
  ASSERT_GT(checked, 30);
  printf("pixels: %d reference images match\n", checked);
  return 0;
}
