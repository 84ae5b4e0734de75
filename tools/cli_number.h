/* Numbers on the tools' command lines, read whole: "10abc" is no 10, and a flag that gets one
 * says so by name. */
#ifndef RINGFEED_CLI_NUMBER_H
#define RINGFEED_CLI_NUMBER_H

#include "tools.h"

#include <errno.h>
#include <getopt.h>
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

/* Another loader's name for a flag, such as --batch-size or --num-workers: the first of its words
 * (between '-' or '_') of four letters or more that is a flag of LONGOPTS, or NULL. */
static inline const char *cli_flag_in_words(const char *typed, const struct option *longopts) {
  for (const char *w = typed; *w; w += strspn(w, "-_")) {
    size_t n = strcspn(w, "-_");
    for (const struct option *o = longopts; n >= 4 && o->name; o++)
      if (strlen(o->name) == n && !strncmp(w, o->name, n))
        return o->name;
    w += n;
  }
  return NULL;
}

/* What getopt_long (opterr 0, OPTSTRING starting with ':') refused, as one line on stderr that
 * ends the output, not the first of thirty lines of usage: C (':' a value missing, else unknown),
 * ARGV and getopt's optind/optopt tell which flag. Returns 2, the status of a bad command line. */
static inline int cli_bad_flag(const char *tool, int c, char **argv, int optind_, int optopt_,
                               const struct option *longopts) {
  const char *arg = argv[optind_ - 1];
  char shortopt[3] = {'-', (char)optopt_, 0};
  const char *flag = optopt_ > 0 && optopt_ < 128 ? shortopt : arg;
  if (c == ':') {
    fprintf(stderr, "%s: %s needs a value (%s --help lists the options)\n", tool, flag, tool);
    return 2;
  }
  /* A long flag mistyped (--wokers, --batch-size): the one it most likely meant. */
  const char *near = NULL;
  char typed[64] = "";
  if (!strncmp(flag, "--", 2))
    snprintf(typed, sizeof typed, "%.*s", (int)strcspn(flag + 2, "="), flag + 2);
  int least = 3;
  for (const struct option *o = longopts; *typed && o->name; o++)
    if (dl_tool_nearer(typed, o->name, &least))
      near = o->name;
  if (!near && *typed)
    near = cli_flag_in_words(typed, longopts);
  if (near)
    fprintf(stderr, "%s: unknown option '%s' (did you mean --%s? %s --help lists the options)\n", tool, flag,
            near, tool);
  else
    fprintf(stderr, "%s: unknown option '%s' (%s --help lists the options)\n", tool, flag, tool);
  return 2;
}

#endif
