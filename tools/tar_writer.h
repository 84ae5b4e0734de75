/* A minimal ustar writer for the tools: deterministic headers (mtime 0, root-owned, mode 0644). */
#ifndef RINGFEED_TAR_WRITER_H
#define RINGFEED_TAR_WRITER_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Appends a member; returns 0 or -errno. Names up to 255 bytes (split into ustar prefix/name). */
int tar_write_member(FILE *f, const char *name, const void *data, size_t len);
/* Writes the two zero blocks that end an archive. */
int tar_write_end(FILE *f);

#ifdef __cplusplus
}
#endif

#endif
