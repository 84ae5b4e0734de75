/* libFuzzer entry point for resume tokens: the first bytes choose the dataset and the run, the
 * rest is the token. A token accepted must resume inside the run (or at its end): every batch it
 * leads to is one of the run's, with samples of the dataset. */
#include "core.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4)
    return 0;
  int64_t n = 1 + data[0] * 7;
  int world = 1 + data[1] % 4, rank = data[2] % world, batch = 1 + data[3] % 9;
  char *token = malloc(size - 4 + 1);
  if (!token)
    return 0;
  memcpy(token, data + 4, size - 4);
  token[size - 4] = 0;
  dl__sampler s;
  if (dl__sampler_init(&s, n, world, rank, batch, data[3] & 16, data[3] & 32, 7, 3, 0, token, 0x1234) == 0) {
    /* A token past the run's last epoch (saved by a longer run) resumes a finished run. */
    if (s.total < 0 || s.start_epoch < 0 || s.start_off < 0 || s.start_off > n || (s.start_epoch >= 3 && s.total))
      abort();
    for (int64_t k = 0; k < s.total && k < 64; k++) {
      int len = dl__sampler_batch_len(&s, k);
      if (len < 1 || len > batch)
        abort();
      for (int i = 0; i < len; i++) {
        int64_t epoch, index = dl__sampler_sample(&s, k, i, &epoch, NULL);
        if (index < 0 || index >= n || epoch < s.start_epoch || epoch >= 3)
          abort();
      }
    }
  }
  free(token);
  return 0;
}
