/* Error codes, per-thread messages and the loader's log. */
#include "util/util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[DL__MSG_MAX];

int dl__log_level = DL__LOG_WARN;

const char *dl_version(void) {
#define DL__STR2(x) #x
#define DL__STR(x) DL__STR2(x)
  return DL__STR(DL_VERSION_MAJOR) "." DL__STR(DL_VERSION_MINOR) "." DL__STR(DL_VERSION_PATCH);
}

const char *dl_strerror(int err) {
  switch (err) {
  case 0:
    return "success";
  case DL_EOF:
    return "end of data";
#define DL__ERR_MSG(name, value, msg)                                                              \
  case value:                                                                                      \
    return msg;
    DL_ERRNO_MAP(DL__ERR_MSG)
#undef DL__ERR_MSG
  }
  if (err < 0 && err > -4096)
    return strerror(-err);
  return "unknown error";
}

const char *dl_errname(int err) {
  switch (err) {
  case 0:
    return "OK";
  case DL_EOF:
    return "DL_EOF";
#define DL__ERR_NAME(name, value, msg)                                                             \
  case value:                                                                                      \
    return #name;
    DL_ERRNO_MAP(DL__ERR_NAME)
#undef DL__ERR_NAME
  }
  if (err < 0 && err > -4096) {
    const char *name = strerrorname_np(-err);
    if (name)
      return name;
  }
  return "UNKNOWN";
}

const char *dl_last_error(void) { return last_error; }

/* Messages name URLs as they were given, and a user name and password in one
 * (https://user:pw@host/...) must not reach a log: each message loses them here, wherever it was
 * made. RFC 3986 keeps '/' out of that part, so it ends at the first '@' before any '/'. */
void dl__without_credentials(char *msg) {
  for (char *p = msg; (p = strstr(p, "://"));) {
    char *host = p += 3;
    size_t n = strcspn(host, "/@ \t\n\"'");
    if (host[n] == '@')
      memmove(host, host + n + 1, strlen(host + n + 1) + 1);
  }
}

/* Whether a typed letter X stands for a name's Y: case, and '-' for '_', are free. */
static bool same_letter(char x, char y) {
  int cx = tolower((unsigned char)x), cy = tolower((unsigned char)y);
  return cx == cy || (cx == '-' && cy == '_');
}

/* Letters to add, leave out, change or swap to make A into B (names are short: past 63 letters,
 * more than any suggestion allows). */
static int edits(const char *a, const char *b) {
  enum { MAX = 63 };
  size_t n = strlen(a), m = strlen(b);
  if (n > MAX || m > MAX)
    return MAX;
  int d[MAX + 1][MAX + 1];
  for (size_t i = 0; i <= n; i++)
    for (size_t j = 0; j <= m; j++) {
      if (!i || !j) {
        d[i][j] = (int)(i + j);
        continue;
      }
      int best = d[i - 1][j - 1] + !same_letter(a[i - 1], b[j - 1]);
      if (d[i - 1][j] + 1 < best)
        best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best)
        best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && same_letter(a[i - 1], b[j - 2]) && same_letter(a[i - 2], b[j - 1]) &&
          d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[n][m];
}

bool dl__nearer(const char *typed, const char *name, int *least) {
  int e = edits(typed, name);
  if (e >= *least || 3 * e > (int)strlen(name))
    return false;
  *least = e;
  return true;
}

int dl__fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  dl__without_credentials(last_error);
  return code;
}

int dl__err_set(dl__err *e, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  dl__without_credentials(e->msg);
  e->code = code;
  return code;
}

int dl__err_prefix(dl__err *e, const char *fmt, ...) {
  char prefix[DL__MSG_MAX], msg[DL__MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  snprintf(msg, sizeof msg, "%s%s", prefix, e->msg);
  dl__without_credentials(msg);
  memcpy(e->msg, msg, sizeof e->msg);
  return e->code;
}

static _Thread_local unsigned *log_held;

void dl__log_hold(unsigned *held) { log_held = held; }

void dl__log(int level, const char *fmt, ...) {
  static const char *names[] = {"", "error", "warning", "info", "debug"};
  if (log_held) {
    *log_held += level <= DL__LOG_INFO;
    return;
  }
  if (level > dl__log_level)
    return;
  char line[DL__MSG_MAX + 64];
  int n = snprintf(line, sizeof line, "ringfeed %s: ", names[level]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  dl__without_credentials(line + n);
  /* One write per line so lines from several threads never interleave. */
  size_t len = strlen(line);
  line[len] = '\n';
  fwrite(line, 1, len + 1, stderr);
}
