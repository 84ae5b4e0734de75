/*
 * A remote shard's sample table. A tar shard's member index needs every header, which sit between
 * the members: it is built from one download into an unnamed temporary file, then cached by URL,
 * size and ETag, so later opens make one small request. A ringfeed shard's index is its footer:
 * one ranged read, laid into a sparse temporary file at its place so the local reader parses it.
 * A compressed tar is downloaded whole and read from its uncompressed copy, as a local one is.
 */
#include "remote/remote.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define PROBE (64u << 10)
#define RFS_TRAILER 32

bool dl__is_url(const char *s) {
  return !strncmp(s, "http://", 7) || !strncmp(s, "https://", 8) || !strncmp(s, "s3://", 5) ||
         !strncmp(s, "hf://", 5);
}

static int write_at(int fd, const uint8_t *p, size_t n, uint64_t off) {
  for (size_t done = 0; done < n;) {
    ssize_t w = pwrite(fd, p + done, n - done, (off_t)(off + done));
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return w < 0 ? -errno : -EIO;
    done += (size_t)w;
  }
  return 0;
}

/* The object T whole (SIZE bytes) in an unnamed temporary file: its descriptor, or an error. */
static int temp_copy(const dl__target *t, const dl__options *o, uint64_t size) {
  int fd = dl__scratch_file(size, t->name);
  if (fd < 0)
    return fd;
  int rc = dl__http_download(o, t, fd, size, NULL);
  if (rc) {
    close(fd);
    return rc;
  }
  return fd;
}

/* The shard whole for indexing: into the shard cache when there is one (so it is fetched once),
 * else into a temporary file. */
static int download(dl__dataset *ds, uint32_t file, const dl__target *t, const dl__options *o, uint64_t size) {
  if (o->cache_dir[0]) {
    dl__cache_dir d;
    bool fetched;
    int r = dl__cache_dir_open(o, &d);
    if (r)
      return r;
    int fd = -EBUSY;
    for (int tries = 0; fd == -EBUSY && tries < 60000; tries++) {
      if (tries)
        usleep(10000); /* another process is downloading it: wait for its copy */
      fd = dl__cache_dir_get(&d, ds, file, o, true, NULL, &fetched);
    }
    dl__cache_dir_close(&d);
    if (fd >= 0 && fetched) { /* counted with the fetchers' downloads */
      ds->cache_fetches++;
      ds->cache_fetch_bytes += (int64_t)size;
    }
    if (fd != -ENOSPC && fd != -EBUSY)
      return fd; /* the copy, or an error (other than no room: then a temporary file) */
  }
  return temp_copy(t, o, size);
}

/* The sample table of remote FILE (T, SIZE bytes, version ID): from the index cache when it holds
 * this version, else SCAN over one whole copy, cached when SCAN found nothing to say again (0). */
static int load_scanned(dl__dataset *ds, uint32_t file, const dl__target *t, const dl__options *o, uint64_t size,
                        const dl__shard_id *id, dl__scan_fn scan, void *arg) {
  const char *url = t->name;
  if (dl__index_cache_read(ds, file, url, id) == 0)
    return 0;
  int fd = download(ds, file, t, o, size);
  if (fd < 0)
    return fd;
  size_t first = ds->n;
  int rc = scan(ds, file, fd, size, arg);
  close(fd);
  if (rc < 0)
    return rc;
  if (rc == 0)
    dl__index_cache_write(ds, first, url, id);
  return 0;
}

static int scan_tar(dl__dataset *ds, uint32_t file, int fd, uint64_t size, void *on_error) {
  return dl__tar_scan(ds, file, fd, size, *(const int *)on_error);
}

static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* A sparse temporary file holding a ringfeed shard's head and index at their places: what
 * parsing its index reads. */
static int rfs_index_copy(const dl__target *t, const dl__options *o, uint64_t size, const uint8_t *head,
                          size_t head_len) {
  const char *url = t->name;
  if (size < RFS_TRAILER + 64)
    return dl__fail(DL_ECORRUPT, "shard %s: %llu bytes, too short for a ringfeed shard", url, (unsigned long long)size);
  /* One read of the last 256 KiB usually holds the whole index; a larger one takes a second. */
  size_t tail_len = size < (256u << 10) ? (size_t)size : (256u << 10);
  uint64_t tail_at = size - tail_len;
  uint8_t *tail = malloc(tail_len);
  if (!tail)
    return dl__fail(-ENOMEM, "out of memory reading %s", url);
  int rc = dl__http_range(o, t, tail_at, tail_len, tail);
  uint64_t ioff = rc ? 0 : get64(tail + tail_len - RFS_TRAILER);
  uint64_t isize = rc ? 0 : get64(tail + tail_len - RFS_TRAILER + 8);
  if (!rc && (isize > (1ull << 32) || ioff > size || ioff + isize + RFS_TRAILER != size))
    rc = dl__fail(DL_ECORRUPT, "shard %s: trailer magic or index position wrong (truncated?)", url);
  uint8_t *more = NULL;
  if (!rc && ioff < tail_at) {
    more = malloc(tail_at - ioff);
    rc = more ? dl__http_range(o, t, ioff, tail_at - ioff, more) : dl__fail(-ENOMEM, "out of memory reading %s", url);
  }
  int fd = rc ? -1 : dl__scratch_file(size, url);
  if (!rc && fd < 0)
    rc = fd;
  if (!rc && (write_at(fd, head, head_len, 0) || write_at(fd, tail, tail_len, tail_at) ||
              (more && write_at(fd, more, tail_at - ioff, ioff))))
    rc = dl__fail(-EIO, "source %s: cannot write its index to a temporary file", url);
  free(tail);
  free(more);
  if (rc && fd >= 0)
    close(fd);
  return rc ? rc : fd;
}

static int load_rfs(dl__dataset *ds, uint32_t file, const dl__target *t, const dl__options *o, uint64_t size,
                    const uint8_t *head, size_t head_len) {
  int fd = rfs_index_copy(t, o, size, head, head_len);
  if (fd < 0)
    return fd;
  int rc = dl__rfs_load_fd(ds, file, fd, size);
  close(fd);
  return rc;
}

/* DS's S3 addressing and credentials, resolved on its first s3:// source. */
static int s3_of(dl__dataset *ds, const dl__options *o, dl__s3 **out) {
  if (!ds->s3) {
    dl__s3 *s;
    int r = dl__s3_open(o, &s);
    if (r)
      return r;
    ds->s3 = s;
  }
  *out = ds->s3;
  return 0;
}

static int hub_of(dl__dataset *ds, dl__hub **out);

int dl__remote_list(dl__dataset *ds, const char *pattern, const dl__options *o, char ***out, size_t *n) {
  if (dl__http_global_init())
    return -1;
  if (!strncmp(pattern, "hf://", 5)) {
    dl__hub *hub;
    return hub_of(ds, &hub) ? -1 : dl__hub_list(o, hub, pattern, out, n);
  }
  dl__s3 *s3;
  return s3_of(ds, o, &s3) ? -1 : dl__s3_list(o, s3, pattern, out, n);
}

void dl__remote_free(dl__dataset *ds) {
  for (uint32_t i = 0; ds->remote && i < ds->nremote; i++) {
    free(ds->remote[i].url);
    curl_slist_free_all(ds->remote[i].headers);
  }
  free(ds->remote);
  ds->remote = NULL;
  ds->nremote = 0;
  dl__s3_free(ds->s3);
  ds->s3 = NULL;
  dl__hub_free(ds->hub);
  ds->hub = NULL;
}

int64_t dl__remote_read(const dl__dataset *ds, uint32_t file, const dl__options *o, void *buf, size_t len,
                        uint64_t off) {
  dl__target t = {ds->files[file], ds->remote[file].url, ds->s3, ds->remote[file].headers};
  int rc = len ? dl__http_range(o, &t, off, len, buf) : 0;
  return rc ? rc : (int64_t)len;
}

/* The headers every request of T carries, whatever the version: S3's, or the Hub's token. */
static const struct curl_slist *own_headers(const dl__target *t) {
  return t->s3 ? (t->s3->anonymous ? NULL : t->s3->headers) : t->headers;
}

/* The headers of an object's requests after its probe, into *OUT: If-Match with the ETag the probe
 * saw, so that a shard replaced on the server is refused (HTTP 412) rather than read at the
 * offsets of the version indexed, and OWN (S3's, the Hub's token). No If-Match where there is no
 * strong ETag to match (a weak one, W/"...", never matches); NULL when nothing is left. */
static int version_headers(const struct curl_slist *own, const char *etag, struct curl_slist **out) {
  *out = NULL;
  struct curl_slist *list = NULL;
  bool failed = false;
  if (etag[0] && strncmp(etag, "W/", 2)) {
    char line[160];
    snprintf(line, sizeof line, "If-Match: %s", etag);
    failed = !(list = curl_slist_append(NULL, line));
  }
  for (const struct curl_slist *h = own; h && !failed; h = h->next) {
    struct curl_slist *grown = curl_slist_append(list, h->data);
    if (!grown)
      curl_slist_free_all(list);
    failed = !grown;
    list = grown;
  }
  *out = list;
  return failed ? dl__fail(-ENOMEM, "out of memory") : 0;
}

/* Records where FILE is fetched from, its size, version and ETag. */
static int set_remote(dl__dataset *ds, uint32_t file, const dl__target *t, uint64_t size, uint64_t version,
                      const char *etag) {
  dl__remote_file *grown = realloc(ds->remote, (size_t)(file + 1) * sizeof *grown);
  if (!grown)
    return dl__fail(-ENOMEM, "out of memory");
  for (uint32_t i = ds->nremote; i < file; i++)
    grown[i] = (dl__remote_file){0}; /* local files since the last remote one (an error once all are listed) */
  ds->remote = grown;
  ds->nremote = file + 1;
  dl__remote_file *rf = &ds->remote[file];
  *rf = (dl__remote_file){.url = strdup(t->url), .size = size, .version = version};
  struct curl_slist *headers;
  if (!rf->url || version_headers(own_headers(t), etag, &headers))
    return dl__fail(-ENOMEM, "out of memory");
  rf->headers = headers;
  return 0;
}

static int hub_of(dl__dataset *ds, dl__hub **out) {
  if (!ds->hub) {
    dl__hub *h;
    int r = dl__hub_open(&h);
    if (r)
      return r;
    ds->hub = h;
  }
  *out = ds->hub;
  return 0;
}

/* Where URL is requested (HTTP into HTTP, CAP bytes), and how (S3's signing or the Hub's token,
 * kept in DS). */
static int target_of(dl__dataset *ds, const char *url, const dl__options *o, char *http, size_t cap,
                     dl__target *t) {
  int rc = dl__http_global_init();
  dl__s3 *s3 = NULL;
  dl__hub *hub = NULL;
  if (!rc && !strncmp(url, "s3://", 5))
    rc = s3_of(ds, o, &s3) ? -1 : dl__s3_url(s3, url, http, cap);
  else if (!rc && !(rc = hub_of(ds, &hub)) && !strncmp(url, "hf://", 5))
    rc = dl__hub_url(hub, url, http, cap);
  else if (!rc) {
    /* An http(s) URL as written, but what a URL cannot hold (a space, letters beyond ASCII, quotes,
     * braces) percent-encoded after the host, as browsers and Python's requests do; '%' and the
     * reserved characters stay as they are, so an encoded URL is sent unchanged. The host is left to
     * libcurl (an internationalised name becomes punycode there). */
    const char *scheme = strstr(url, "://");
    size_t host = scheme ? (size_t)(scheme + 3 - url) + strcspn(scheme + 3, "/?#") : 0;
    size_t at = (size_t)snprintf(http, cap, "%.*s", (int)host, url);
    if (at >= cap || !dl__url_encode(http, cap, &at, url + host, strlen(url + host), ":/?#[]@!$&'()*+,;=%"))
      rc = dl__fail(DL_ELIMIT, "source %s: URL too long", url);
  }
  *t = (dl__target){url, http, s3, hub && dl__hub_serves(hub, http) ? hub->auth : NULL};
  return rc;
}

/* RC, said with what the Hub needs where URL is the Hub's and it refused access. */
static int explained(const dl__dataset *ds, const dl__target *t, int rc) {
  return rc == -EACCES && ds->hub && dl__hub_serves(ds->hub, t->url) ? dl__hub_explain(rc, ds->hub) : rc;
}

/* The version of the object URL of SIZE bytes, whose probe gave ETAG and HEAD_LEN first bytes: a
 * cached index or copy is the object's while its size and ETag are (or, with no ETag, its first
 * bytes). *EDGES: what stands for the ETag in index cache keys. */
static uint64_t version_of(const char *url, uint64_t size, const char *etag, const uint8_t *head, size_t head_len,
                           uint64_t *edges) {
  *edges = etag[0] ? XXH64(etag, strlen(etag), 1) : XXH64(head, head_len, 2);
  return XXH64(url, strlen(url), *edges ^ size);
}

/* A remote shard as its probe found it. */
typedef struct object {
  char http[8192]; /* its HTTP URL, which T's requests use */
  dl__target t;
  uint8_t *head; /* its first bytes (PROBE at most, HEAD_LEN of them); the caller frees it */
  size_t head_len;
  uint32_t file;
  uint64_t size, version;
  char etag[128];
  dl__shard_id id; /* its version, for the index cache */
} object;

/* Probes URL into OB: its size, version and first bytes; OB->t is set up for its requests. */
static int probe_object(dl__dataset *ds, const char *url, const dl__options *o, object *ob) {
  *ob = (object){.head = malloc(PROBE)};
  if (!ob->head)
    return dl__fail(-ENOMEM, "out of memory");
  int rc = target_of(ds, url, o, ob->http, sizeof ob->http, &ob->t);
  if (rc)
    return rc;
  rc = explained(ds, &ob->t, dl__http_probe(o, &ob->t, &ob->size, ob->etag, sizeof ob->etag, ob->head, PROBE,
                                            &ob->head_len));
  uint64_t edges;
  ob->version = version_of(url, ob->size, ob->etag, ob->head, ob->head_len, &edges);
  ob->id = (dl__shard_id){.size = ob->size, .edges = edges};
  return rc;
}

int dl__remote_copy(const char *url, const dl__options *o, bool whole, int *out, uint64_t *size) {
  dl__dataset tmp = {0};
  object ob;
  int rc = probe_object(&tmp, url, o, &ob);
  *size = ob.size;
  struct curl_slist *versioned = NULL; /* the copy is of the version probed */
  if (!rc && !(rc = version_headers(own_headers(&ob.t), ob.etag, &versioned)))
    ob.t.headers = versioned;
  int fd = -1;
  if (!rc && !whole && ob.head_len >= 8 && !memcmp(ob.head, "RFSHARD1", 8))
    rc = (fd = rfs_index_copy(&ob.t, o, ob.size, ob.head, ob.head_len)) < 0 ? fd : 0;
  else if (!rc && (fd = temp_copy(&ob.t, o, ob.size)) < 0)
    rc = fd;
  free(ob.head);
  curl_slist_free_all(versioned);
  dl__remote_free(&tmp);
  *out = fd;
  return rc;
}

int dl__remote_version(const char *url, const dl__options *o, uint64_t *size, uint64_t *version) {
  dl__dataset tmp = {0};
  object ob;
  int rc = probe_object(&tmp, url, o, &ob);
  *size = ob.size;
  if (!rc)
    *version = ob.version;
  free(ob.head);
  dl__remote_free(&tmp);
  return rc;
}

int dl__remote_put(const char *url, const dl__options *o, int fd, uint64_t size) {
  dl__dataset tmp = {0};
  char http[8192];
  dl__target t;
  int rc = target_of(&tmp, url, o, http, sizeof http, &t);
  if (!rc)
    rc = dl__http_put(o, &t, fd, size);
  dl__remote_free(&tmp);
  return rc;
}

/* Adds the probed object OB to DS as OB->file, read by ranged requests that carry its version
 * and the headers its later requests carry. */
static int add_probed(dl__dataset *ds, const char *url, object *ob) {
  int rc = dl__dataset_add_file(ds, url, &ob->file);
  if (!rc)
    rc = set_remote(ds, ob->file, &ob->t, ob->size, ob->version, ob->etag);
  if (!rc)
    ob->t.headers = ds->remote[ob->file].headers; /* what loading it still reads is of the version probed */
  return rc;
}

/* Probes URL and adds it to DS (add_probed). */
static int add_object(dl__dataset *ds, const char *url, const dl__options *o, object *ob) {
  int rc = probe_object(ds, url, o, ob);
  return rc ? rc : add_probed(ds, url, ob);
}

int dl__remote_load_scanned(dl__dataset *ds, const char *url, const dl__options *o, dl__scan_fn scan, void *arg,
                            uint64_t salt) {
  object ob;
  int rc = add_object(ds, url, o, &ob);
  ob.id.edges ^= salt;
  if (!rc)
    rc = load_scanned(ds, ob.file, &ob.t, o, ob.size, &ob.id, scan, arg);
  free(ob.head);
  return rc;
}

int dl__remote_get_text(dl__dataset *ds, const char *url, const dl__options *o, size_t max, char **out, size_t *len) {
  char http[8192], etag[128];
  dl__target t;
  uint8_t head[1];
  size_t head_len;
  uint64_t size = 0;
  *out = NULL;
  int rc = target_of(ds, url, o, http, sizeof http, &t);
  if (!rc)
    rc = explained(ds, &t, dl__http_probe(o, &t, &size, etag, sizeof etag, head, sizeof head, &head_len));
  if (!rc && size > max)
    rc = dl__fail(DL_ELIMIT, "source %s: %llu bytes, above %zu", url, (unsigned long long)size, max);
  char *text = rc ? NULL : malloc((size_t)size + 2);
  if (!rc && !text)
    rc = dl__fail(-ENOMEM, "out of memory");
  if (!rc)
    rc = explained(ds, &t, dl__http_get_small(o, &t, (uint8_t *)text, (size_t)size + 1, len));
  if (rc) {
    free(text);
    return rc;
  }
  text[*len] = 0;
  *out = text;
  return 0;
}

int dl__remote_join(char *out, size_t cap, const char *root, const char *name) {
  size_t at = (size_t)snprintf(out, cap, "%s/", root);
  bool http = !strncmp(root, "http://", 7) || !strncmp(root, "https://", 8);
  if (at >= cap)
    return dl__fail(DL_ELIMIT, "source %s/%s: URL too long", root, name);
  /* s3:// keys and hf:// paths are encoded where their requests are made. */
  bool fits = http ? dl__url_encode(out, cap, &at, name, strlen(name), "/")
                   : (size_t)snprintf(out + at, cap - at, "%s", name) < cap - at;
  return fits ? 0 : dl__fail(DL_ELIMIT, "source %s/%s: URL too long", root, name);
}

/* An MDS dataset: its index.json, or the folder holding it (a URL ending in '/'). */
static bool names_mds(const char *url) {
  size_t n = strlen(url);
  return (n >= 11 && !strcmp(url + n - 11, "/index.json")) || (n && url[n - 1] == '/');
}

typedef struct whole {
  const dl__target *t;
  const dl__options *o;
  uint64_t size;
} whole;

static int fetch_whole(void *arg) {
  const whole *w = arg;
  return temp_copy(w->t, w->o, w->size);
}

/* A compressed tar (HOW: gzip, zstd or bzip2, as WebDataset writes .tar.gz), probed as OB: read as
 * a local one is, from an uncompressed copy made at open (kept in cache_dir by the object's
 * version, so that later opens fetch nothing), downloaded whole for it, of the version probed. */
static int load_packed(dl__dataset *ds, const char *url, const dl__options *o, object *ob, const char *how) {
  struct curl_slist *versioned;
  int rc = version_headers(own_headers(&ob->t), ob->etag, &versioned);
  if (rc)
    return rc;
  ob->t.headers = versioned;
  whole w = {&ob->t, o, ob->size};
  if (!(rc = dl__dataset_add_file(ds, url, &ob->file)))
    rc = dl__tar_load_fetched(ds, ob->file, how, &ob->id, fetch_whole, &w, o);
  if (!rc) /* the copy has no identity of its own to name the GPU check's verdicts by */
    dl__dataset_file_named(ds, ob->file, &ob->version, sizeof ob->version);
  curl_slist_free_all(versioned);
  return rc;
}

int dl__remote_load(dl__dataset *ds, const char *url, const dl__options *o) {
  size_t n = strlen(url);
  if (names_mds(url)) {
    int rc = dl__mds_load(ds, url, o);
    if (rc == -ENOENT && url[n - 1] == '/') {
      char why[DL__MSG_MAX];
      snprintf(why, sizeof why, "%s", dl_last_error());
      rc = dl__fail(-ENOENT, "%s; a folder is read as an MDS dataset: give tar or ringfeed shards by name, brace "
                    "range or, on s3:// and hf://, a pattern such as %s*.tar", why, url);
    }
    return rc;
  }
  if (n > 4 && !strcmp(url + n - 4, ".mds"))
    return dl__fail(DL_EUNSUPPORTED, "source %s: an MDS shard is read through its dataset's index.json: give the "
                    "URL of that (or of its folder, ending in '/')", url);
  object ob;
  int rc = probe_object(ds, url, o, &ob);
  const char *packed = rc ? NULL : dl__tar_compression(ob.head, ob.head_len);
  if (packed)
    rc = load_packed(ds, url, o, &ob, packed);
  else if (!rc && !(rc = add_probed(ds, url, &ob)) && ob.head_len >= 8 && !memcmp(ob.head, "RFSHARD1", 8))
    rc = load_rfs(ds, ob.file, &ob.t, o, ob.size, ob.head, ob.head_len);
  else if (!rc)
    rc = load_scanned(ds, ob.file, &ob.t, o, ob.size, &ob.id, scan_tar, (void *)&o->on_error);
  free(ob.head);
  return rc;
}
