/*
 * nvJPEG, opened at run time: builds and CI need neither its header nor its library, and a
 * machine without it decodes on the CPU. Looked for, in order: RINGFEED_NVJPEG (a file or a
 * folder), the dynamic linker's own search (LD_LIBRARY_PATH, ldconfig), the CUDA toolkit
 * (CUDA_HOME, CUDA_PATH, /usr/local/cuda), and the NVIDIA wheels in the site-packages folder of any
 * library already loaded from one (PyTorch's). Version 13 before 12. The library stays loaded for
 * the life of the process.
 */
#include "gpu/nvjpeg.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static dl__nvjpeg api;
static const dl__nvjpeg *loaded;
static char load_error[1024];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const char *const sonames[] = {"libnvjpeg.so.13", "libnvjpeg.so.12"};

/* Appends "PATH" to the list of places tried. */
static void tried(char *list, size_t cap, const char *path) {
  size_t n = strlen(list);
  if (n + 4 < cap)
    snprintf(list + n, cap - n, "%s%s", n ? ", " : "", path);
}

/* A file that is there but does not load (a missing dependency) says why in the list. */
static void *open_file(const char *path, char *list, size_t cap) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h && strchr(path, '/') && access(path, F_OK) == 0) {
    char note[PATH_MAX + 256];
    snprintf(note, sizeof note, "%s (%s)", path, dlerror());
    tried(list, cap, note);
  } else if (!h) {
    tried(list, cap, path);
  }
  return h;
}

/* Tries each soname in folder DIR. */
static void *open_in(const char *dir, char *list, size_t cap) {
  for (size_t i = 0; i < sizeof sonames / sizeof *sonames; i++) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, sonames[i]);
    void *h = open_file(path, list, cap);
    if (h)
      return h;
  }
  return NULL;
}

typedef struct wheel_search {
  char *list;
  size_t cap;
  void *handle;
} wheel_search;

/* For a loaded object under .../site-packages/ (or dist-packages), tries the NVIDIA wheels
 * there: nvidia/cu13/lib (CUDA 13 wheels), nvidia/nvjpeg/lib (CUDA 12 wheels). */
static int visit(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  wheel_search *w = arg;
  const char *name = info->dlpi_name;
  const char *at = name ? strstr(name, "/site-packages/") : NULL;
  if (!at)
    at = name ? strstr(name, "/dist-packages/") : NULL;
  if (!at || w->handle)
    return w->handle != NULL;
  size_t prefix = (size_t)(strchr(at + 1, '/') - name);
  static const char *const subdirs[] = {"nvidia/cu13/lib", "nvidia/nvjpeg/lib", "nvidia/cu12/lib"};
  for (size_t i = 0; i < sizeof subdirs / sizeof *subdirs && !w->handle; i++) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s/%s", (int)prefix, name, subdirs[i]);
    if (strstr(w->list, dir))
      continue; /* this site-packages folder was tried already */
    w->handle = open_in(dir, w->list, w->cap);
  }
  return w->handle != NULL;
}

static void *find(char *list, size_t cap) {
  const char *env = getenv("RINGFEED_NVJPEG");
  void *h = NULL;
  if (env && *env) {
    h = open_file(env, list, cap);
    if (!h)
      h = open_in(env, list, cap);
    return h; /* an explicit choice is not second-guessed */
  }
  for (size_t i = 0; !h && i < sizeof sonames / sizeof *sonames; i++)
    h = open_file(sonames[i], list, cap);
  const char *roots[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
  for (size_t i = 0; !h && i < sizeof roots / sizeof *roots; i++) {
    if (!roots[i] || !*roots[i])
      continue;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/lib64", roots[i]);
    h = open_in(dir, list, cap);
    snprintf(dir, sizeof dir, "%s/targets/x86_64-linux/lib", roots[i]);
    if (!h)
      h = open_in(dir, list, cap);
  }
  if (!h) {
    wheel_search w = {list, cap, NULL};
    dl_iterate_phdr(visit, &w);
    h = w.handle;
  }
  return h;
}

static void load(void) {
  char list[768] = "";
  void *h = find(list, sizeof list);
  if (!h) {
    snprintf(load_error, sizeof load_error, "nvJPEG not found (tried %s; RINGFEED_NVJPEG names it)", list);
    return;
  }
  struct {
    void **slot;
    const char *name;
  } syms[] = {
      {(void **)&api.CreateEx, "nvjpegCreateEx"},
      {(void **)&api.Destroy, "nvjpegDestroy"},
      {(void **)&api.GetHardwareDecoderInfo, "nvjpegGetHardwareDecoderInfo"},
      {(void **)&api.JpegStateCreate, "nvjpegJpegStateCreate"},
      {(void **)&api.JpegStateDestroy, "nvjpegJpegStateDestroy"},
      {(void **)&api.DecodeBatchedInitialize, "nvjpegDecodeBatchedInitialize"},
      {(void **)&api.DecodeBatched, "nvjpegDecodeBatched"},
      {(void **)&api.DecodeBatchedEx, "nvjpegDecodeBatchedEx"},
      {(void **)&api.DecodeBatchedPreAllocate, "nvjpegDecodeBatchedPreAllocate"},
      {(void **)&api.DecodeParamsCreate, "nvjpegDecodeParamsCreate"},
      {(void **)&api.DecodeParamsDestroy, "nvjpegDecodeParamsDestroy"},
      {(void **)&api.DecodeParamsSetROI, "nvjpegDecodeParamsSetROI"},
  };
  struct link_map *map = NULL;
  dlinfo(h, RTLD_DI_LINKMAP, &map);
  char real[PATH_MAX];
  const char *file = map && map->l_name && *map->l_name ? map->l_name : list;
  snprintf(api.path, sizeof api.path, "%s", realpath(file, real) ? real : file);
  const char *so = strstr(api.path, ".so.");
  snprintf(api.version, sizeof api.version, "%s", so ? so + 4 : "?");
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
    *syms[i].slot = dlsym(h, syms[i].name);
    if (!*syms[i].slot) {
      snprintf(load_error, sizeof load_error, "nvJPEG at %s lacks %s (too old)", api.path, syms[i].name);
      return; /* left open: a library that was loaded once is not unloaded */
    }
  }
  loaded = &api;
}

const dl__nvjpeg *dl__nvjpeg_load(char *why, size_t cap) {
  pthread_once(&once, load);
  if (!loaded && why && cap)
    snprintf(why, cap, "%s", load_error);
  return loaded;
}

const char *dl__nvjpeg_status_name(int status) {
  static const char *const names[] = {
      "NVJPEG_STATUS_SUCCESS",        "NVJPEG_STATUS_NOT_INITIALIZED",      "NVJPEG_STATUS_INVALID_PARAMETER",
      "NVJPEG_STATUS_BAD_JPEG",       "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",   "NVJPEG_STATUS_ALLOCATOR_FAILURE",
      "NVJPEG_STATUS_EXECUTION_FAILED", "NVJPEG_STATUS_ARCH_MISMATCH",      "NVJPEG_STATUS_INTERNAL_ERROR",
      "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED", "NVJPEG_STATUS_INCOMPLETE_BITSTREAM"};
  return status >= 0 && (size_t)status < sizeof names / sizeof *names ? names[status] : "NVJPEG_STATUS_UNKNOWN";
}
