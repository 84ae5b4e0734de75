/*
 * Files: reads that see interrupted and short reads through, opening only regular files, scratch
 * files, folders made as `mkdir -p` would, and the user's cache folder with its whole-file reads
 * and writes. Every stage reads files through these.
 */
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

int dl__iov_after(const struct iovec *iov, int n, size_t skip, struct iovec *rest) {
  int k = 0, m = 0;
  while (k < n && skip >= iov[k].iov_len)
    skip -= iov[k++].iov_len;
  for (; k < n; k++, skip = 0)
    rest[m++] = (struct iovec){(char *)iov[k].iov_base + skip, iov[k].iov_len - skip};
  return m;
}

/* Reads into the N pieces of IOV, in order, through interrupted and short reads. */
int64_t dl__preadv_full(int fd, const struct iovec *iov, int n, uint64_t off) {
  struct iovec rest[DL__MAX_IOV];
  size_t got = 0;
  for (;;) {
    int m = dl__iov_after(iov, n, got, rest);
    if (!m)
      break;
    ssize_t r = preadv(fd, rest, m, (off_t)(off + got));
    int64_t res = dl__io_fault(r < 0 ? -errno : (int64_t)r);
    if (res == -EINTR || res == -EAGAIN)
      continue;
    if (res < 0)
      return res;
    if (res == 0)
      break;
    got += (size_t)res;
  }
  return (int64_t)got;
}

int64_t dl__pread_full(int fd, void *buf, size_t n, uint64_t off) {
  struct iovec one = {buf, n};
  return dl__preadv_full(fd, &one, 1, off);
}

int64_t dl__pread_cached(int fd, void *buf, size_t n, uint64_t off) {
  struct iovec one = {buf, n};
  ssize_t r = preadv2(fd, &one, 1, (off_t)off, RWF_NOWAIT);
  return dl__io_fault(r < 0 ? -errno : (int64_t)r);
}

int dl__open_regular(const char *path, const char *what, struct stat *st) {
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == EMFILE) { /* dl_open has raised the soft limit to the hard one already */
    struct rlimit r = {0};
    getrlimit(RLIMIT_NOFILE, &r);
    return dl__fail(-EMFILE, "%s %s: too many open files: the process may open %llu (ulimit -n; hard limit %llu), "
                    "and a loader keeps each shard open: raise the limit, or make fewer, larger shards (dlshard "
                    "create)", what, path, (unsigned long long)r.rlim_cur, (unsigned long long)r.rlim_max);
  }
  struct stat own;
  st = st ? st : &own;
  if (fd < 0 || fstat(fd, st)) {
    int rc = dl__fail(-errno, "%s %s: %s", what, path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return rc;
  }
  if (!S_ISREG(st->st_mode)) {
    close(fd);
    return dl__fail(S_ISDIR(st->st_mode) ? -EISDIR : DL_EUNSUPPORTED, "%s %s: %s", what, path,
                    S_ISDIR(st->st_mode) ? "is a folder" : DL__NOT_REGULAR);
  }
  /* Back to blocking reads: io_uring would answer EAGAIN instead of waiting for the disk. */
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK)) {
    int rc = dl__fail(-errno, "%s %s: %s", what, path, strerror(errno));
    close(fd);
    return rc;
  }
  return fd;
}

/* An unnamed file in $TMPDIR (gone when closed), SIZE bytes long (sparse). */
int dl__scratch_file(uint64_t size, const char *url) {
  const char *dir = getenv("TMPDIR");
  dir = dir && *dir ? dir : "/tmp";
  int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    char path[4096];
    snprintf(path, sizeof path, "%s/ringfeed-XXXXXX", dir);
    fd = mkostemp(path, O_CLOEXEC);
    if (fd >= 0)
      unlink(path);
  }
  if (fd < 0 || ftruncate(fd, (off_t)size)) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    return dl__fail(-e, "source %s: no room for a temporary copy in %s: %s", url, dir, strerror(e));
  }
  return fd;
}

int dl__mkdirs(const char *dir) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", dir);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(buf, 0755);
      *p = '/';
    }
  return mkdir(buf, 0755) && errno != EEXIST ? -errno : 0;
}

int dl__user_cache_dir(char *buf, size_t cap) {
  const char *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  int n;
  if (xdg && *xdg)
    n = snprintf(buf, cap, "%s/ringfeed", xdg);
  else if (home && *home)
    n = snprintf(buf, cap, "%s/.cache/ringfeed", home);
  else
    return -1;
  return n > 0 && (size_t)n < cap ? 0 : -1;
}

int dl__read_file(const char *path, size_t least, uint8_t **out, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  struct stat st;
  if (fstat(fd, &st) || st.st_size < (off_t)least || st.st_size > (1ll << 34)) {
    close(fd);
    return -1;
  }
  uint8_t *p = malloc((size_t)st.st_size);
  size_t got = 0;
  while (p && got < (size_t)st.st_size) {
    ssize_t n = read(fd, p + got, (size_t)st.st_size - got);
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  close(fd);
  if (!p || got != (size_t)st.st_size) {
    free(p);
    return -1;
  }
  *out = p;
  *len = got;
  return 0;
}

int dl__write_file(const char *target, const uint8_t *p, size_t len) {
  /* Named by process and thread: two loaders of one process may index one shard at once. */
  char tmp[PATH_MAX + 96];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%ld", target, (long)getpid(), (long)gettid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return -errno;
  size_t done = 0;
  while (done < len) {
    ssize_t n = write(fd, p + done, len - done);
    if (n <= 0) {
      int e = n < 0 ? errno : EIO;
      close(fd);
      unlink(tmp);
      return -e;
    }
    done += (size_t)n;
  }
  if (close(fd) || rename(tmp, target)) {
    int e = errno;
    unlink(tmp);
    return -e;
  }
  return 0;
}
