/* Built without CUDA: device=cuda fails with a clear error, host batches work as always. */
#include "gpu/gpu.h"

#include <stdio.h>

int dl__cuda_open(dl_loader *l) {
  (void)l;
  return dl__fail(DL_ENODEVICE, "option device=cuda: this ringfeed was built without CUDA");
}
int dl__cuda_start(dl_loader *l) {
  (void)l;
  return DL_ENODEVICE;
}
void dl__cuda_stop(dl_loader *l) { (void)l; }
void dl__cuda_close(dl_loader *l) { (void)l; }
void *dl__host_alloc(dl_loader *l, size_t bytes) {
  (void)l;
  return dl__slots_map(bytes);
}
void dl__host_free(dl_loader *l, void *p, size_t bytes) {
  (void)l;
  dl__slots_unmap(p, bytes);
}
int dl__cuda_field(const dl_batch *b, const char *name, DLTensor *out) {
  (void)b, (void)name, (void)out;
  return DL_ENODEVICE;
}
int dl__cuda_wait(dl_batch *b, void *stream) {
  (void)b, (void)stream;
  return 0;
}
int dl__cuda_copy(dl_batch *b, void *dst, const void *src, size_t bytes, void *stream) {
  (void)b, (void)dst, (void)src, (void)bytes, (void)stream;
  return DL_ENODEVICE;
}
void dl__cuda_release_locked(dl_batch *b) { (void)b; }
bool dl__cuda_consumer_busy_locked(dl_loader *l, int stream) {
  (void)l, (void)stream;
  return false;
}
int dl__gpu_decoders_open(dl_loader *l, char *why, size_t cap) {
  (void)l;
  snprintf(why, cap, "this ringfeed was built without CUDA");
  return -1;
}
int dl__gpu_decoders_take_kept(dl_loader *l, char *why, size_t cap) {
  (void)l;
  snprintf(why, cap, "this ringfeed was built without CUDA");
  return -1;
}
bool dl__gpu_decoders_available(char *why, size_t cap) {
  snprintf(why, cap, "this ringfeed was built without CUDA");
  return false;
}
int dl__cuda_stats(dl_loader *l, char *buf, size_t cap) {
  (void)l;
  if (cap)
    buf[0] = 0;
  return 0;
}
