/* Fuzz inputs as files: the readers take descriptors, so each input goes into an anonymous one. */
#ifndef RINGFEED_FUZZ_INPUT_H
#define RINGFEED_FUZZ_INPUT_H

#include <stdint.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

/* A descriptor holding exactly DATA, or -1. */
static inline int fuzz_input_fd(const uint8_t *data, size_t size) {
  int fd = memfd_create("fuzz-input", MFD_CLOEXEC);
  if (fd >= 0 && write(fd, data, size) != (ssize_t)size) {
    close(fd);
    fd = -1;
  }
  return fd;
}

#endif
