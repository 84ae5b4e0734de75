/* Replays saved inputs through a fuzz entry point as an ordinary test: every file named, or every
 * file under the folders named. Exit 77 (skipped) when none of the paths exists. */
#include <dirent.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long replayed;

static void replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    replayed++;
  }
  free(buf);
  fclose(f);
}

static void replay(const char *path) {
  struct stat st;
  if (stat(path, &st))
    return;
  if (!S_ISDIR(st.st_mode)) {
    replay_file(path);
    return;
  }
  DIR *d = opendir(path);
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (de->d_name[0] == '.')
      continue;
    char sub[PATH_MAX];
    snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
    replay(sub);
  }
  if (d)
    closedir(d);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    replay(argv[i]);
  if (!replayed) {
    fprintf(stderr, "skipped: no saved inputs found\n");
    return 77;
  }
  printf("replayed %ld inputs\n", replayed);
  return 0;
}
