/*
 * A remote shard's sample table. A tar shard's member index needs every header, which sit between
 * the members: it is built from one download into an unnamed temporary file, then cached by URL,
 * size and ETag, so later opens make one small request. A ringfeed shard's index is its footer:
 * one ranged read, laid into a sparse temporary file at its place so the local reader parses it.
 * A compressed tar is downloaded whole and read from its uncompressed copy, as a local one is.
 */
#include "remote/remote.h"
#include "source/source.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define PROBE (64u << 10)

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
    dl__shard_dir d;
    bool fetched;
    int r = dl__shard_dir_open(o, &d);
    if (r)
      return r;
    int fd = -EBUSY;
    for (int tries = 0; fd == -EBUSY && tries < 60000; tries++) {
      if (tries)
        usleep(10000); /* another process is downloading it: wait for its copy */
      fd = dl__shard_dir_get(&d, ds, file, o, true, NULL, &fetched);
    }
    dl__shard_dir_close(&d);
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
  if (dl__index_file_read(ds, file, url, id) == 0)
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
    dl__index_file_write(ds, first, url, id);
  return 0;
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
struct dl__probe {
  char http[8192]; /* its HTTP URL, which T's requests use */
  dl__target t;
  uint8_t *head; /* its first bytes (PROBE at most, HEAD_LEN of them); the caller frees it */
  size_t head_len;
  uint32_t file;
  uint64_t size, version;
  char etag[128];
  dl__shard_id id; /* its version, for the index cache */
};

/* Probes URL into OB: its size, version and first bytes; OB->t is set up for its requests. */
static int probe_object(dl__dataset *ds, const char *url, const dl__options *o, dl__probe *ob) {
  *ob = (dl__probe){.head = malloc(PROBE)};
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

int dl__probe_open(dl__dataset *ds, const char *url, const dl__options *o, dl__probe **out) {
  dl__probe *p = malloc(sizeof *p);
  *out = p;
  if (!p)
    return dl__fail(-ENOMEM, "out of memory");
  return probe_object(ds, url, o, p);
}

void dl__probe_free(dl__probe *p) {
  if (p)
    free(p->head);
  free(p);
}

const uint8_t *dl__probe_head(const dl__probe *p, size_t *n) {
  *n = p->head_len;
  return p->head;
}

uint64_t dl__probe_size(const dl__probe *p) { return p->size; }
const char *dl__probe_name(const dl__probe *p) { return p->t.name; }
uint64_t dl__probe_version(const dl__probe *p) { return p->version; }
dl__shard_id *dl__probe_id(dl__probe *p) { return &p->id; }

int dl__probe_range(const dl__probe *p, const dl__options *o, uint64_t off, size_t len, void *buf) {
  return dl__http_range(o, &p->t, off, len, buf);
}

int dl__probe_copy(dl__probe *p, const dl__options *o) {
  struct curl_slist *versioned; /* the copy is of the version probed */
  int rc = version_headers(own_headers(&p->t), p->etag, &versioned);
  if (rc)
    return rc;
  dl__target t = p->t;
  t.headers = versioned;
  int fd = temp_copy(&t, o, p->size);
  curl_slist_free_all(versioned);
  return fd;
}

int dl__remote_copy(const char *url, const dl__options *o, bool whole, int *out, uint64_t *size) {
  dl__dataset tmp = {0};
  dl__probe *p;
  int rc = dl__probe_open(&tmp, url, o, &p);
  *size = p ? p->size : 0;
  int fd = -1;
  const dl__format *f = rc ? NULL : dl__format_of(url, NULL, p->head, p->head_len);
  if (!rc && !whole && f && f->index_copy)
    rc = (fd = f->index_copy(p, o)) < 0 ? fd : 0;
  else if (!rc && (fd = dl__probe_copy(p, o)) < 0)
    rc = fd;
  dl__probe_free(p);
  dl__remote_free(&tmp);
  *out = fd;
  return rc;
}

int dl__remote_version(const char *url, const dl__options *o, uint64_t *size, uint64_t *version) {
  dl__dataset tmp = {0};
  dl__probe *p;
  int rc = dl__probe_open(&tmp, url, o, &p);
  *size = p ? p->size : 0;
  if (!rc)
    *version = p->version;
  dl__probe_free(p);
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

int dl__probe_add(dl__dataset *ds, dl__probe *p, uint32_t *file) {
  int rc = dl__dataset_add_file(ds, p->t.name, &p->file);
  if (!rc)
    rc = set_remote(ds, p->file, &p->t, p->size, p->version, p->etag);
  if (!rc)
    p->t.headers = ds->remote[p->file].headers; /* what loading it still reads is of the version probed */
  *file = p->file;
  return rc;
}

int dl__probe_scan(dl__dataset *ds, dl__probe *p, const dl__options *o, dl__scan_fn scan, void *arg, uint64_t salt) {
  uint32_t file;
  int rc = dl__probe_add(ds, p, &file);
  p->id.edges ^= salt;
  return rc ? rc : load_scanned(ds, file, &p->t, o, p->size, &p->id, scan, arg);
}

int dl__remote_load_scanned(dl__dataset *ds, const char *url, const dl__options *o, dl__scan_fn scan, void *arg,
                            uint64_t salt) {
  dl__probe *p;
  int rc = dl__probe_open(ds, url, o, &p);
  if (!rc)
    rc = dl__probe_scan(ds, p, o, scan, arg, salt);
  dl__probe_free(p);
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

int dl__remote_load(dl__dataset *ds, const char *url, const dl__options *o) {
  const dl__format *f = dl__format_of(url, NULL, NULL, 0);
  if (f)
    return f->open_remote(ds, url, o, NULL);
  dl__probe *p;
  int rc = dl__probe_open(ds, url, o, &p);
  if (!rc) {
    f = dl__format_of(url, NULL, p->head, p->head_len);
    rc = f && f->open_remote ? f->open_remote(ds, url, o, p)
                             : dl__fail(DL_EUNSUPPORTED, "source %s: no format reads it remotely", url);
  }
  dl__probe_free(p);
  return rc;
}
