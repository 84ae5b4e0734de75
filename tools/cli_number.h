/* Numbers on the tools' command lines, read whole: "10abc" is no 10, and a flag that gets one
 * says so by name. */
#ifndef RINGFEED_CLI_NUMBER_H
#define RINGFEED_CLI_NUMBER_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* TEXT as a plain decimal number, all of it: strtod alone would also take hex (0x10), inf and nan. */
static inline bool cli_number(const char *text, double *out) {
  char *end;
  errno = 0;
  *out = strtod(text, &end);
  return end != text && !*end && !errno && strspn(text, "0123456789.eE+-") == strlen(text);
}

/* The whole number TEXT of flag FLAG of tool TOOL, at least MIN; false (said on stderr) otherwise. */
static inline bool cli_whole_number(const char *tool, const char *flag, const char *text, long min, long *out) {
  double v;
  if (!cli_number(text, &v) || v < (double)min || v > 1e15 || v != (double)(long)v) {
    fprintf(stderr, "%s: %s %s: expected a whole number of at least %ld\n", tool, flag, text, min);
    return false;
  }
  *out = (long)v;
  return true;
}

#endif
