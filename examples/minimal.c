/*
 * The smallest complete ringfeed program: open a loader over tar shards, take batches in order,
 * read their tensors, release them, close. Build: cc minimal.c $(pkg-config --cflags --libs ringfeed)
 * Usage: minimal SOURCE [OPTIONS]   e.g.  minimal 'train-{000000..000009}.tar' "batch_size=64 workers=4"
 */
#include <inttypes.h>
#include <stdio.h>

#include <ringfeed.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SOURCE [OPTIONS]\n", argv[0]);
    return 2;
  }
  dl_loader *loader;
  int r = dl_open(&loader, argv[1], argc > 2 ? argv[2] : "batch_size=64 image_size=224");
  if (r) {
    fprintf(stderr, "%s: %s\n", dl_errname(r), dl_last_error());
    return 1;
  }
  dl_batch *batch;
  int64_t seen = 0;
  while ((r = dl_next_batch(loader, &batch)) == 0) {
    DLTensor image, label;
    dl_batch_field(batch, "image", &image);
    dl_batch_field(batch, "label", &label);
    if (seen == 0)
      printf("image [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] uint8, first key %s, label %" PRId64 "\n",
             image.shape[0], image.shape[1], image.shape[2], image.shape[3], dl_batch_key(batch, 0),
             ((const int64_t *)label.data)[0]);
    seen += dl_batch_size(batch);
    dl_batch_release(batch, NULL); /* the slot goes back to the workers */
  }
  if (r != DL_EOF)
    fprintf(stderr, "%s: %s\n", dl_errname(r), dl_last_error());
  printf("%" PRId64 " samples\n", seen);
  dl_close(loader);
  return r == DL_EOF ? 0 : 1;
}
