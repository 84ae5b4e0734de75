/*
 * Any source's samples as ringfeed records (dlshard create): the samples as the loader indexes
 * them, each read whole and written field by field, its image kept as it is.
 */
#include "tools.h"
#include "source/source.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <png.h>
#include <zstd.h>

struct dl_tool_source {
  dl__dataset ds;
  bool has_images; /* then a sample without one is bad: the loader skips it */
};

struct dl_tool_scratch {
  dl__buf record, raw, image;
  void *zctx;
  dl__checker *checker; /* each sample read as the loader would, before it is written */
};

int dl_tool_source_add(dl_tool_source **s, const char *source, const char *options) {
  if (!*s && !(*s = calloc(1, sizeof **s)))
    return dl__fail(-ENOMEM, "out of memory");
  dl__options o;
  int r = dl__options_parse(&o, options);
  if (!r)
    r = dl__source_load(&(*s)->ds, source, &o);
  (*s)->has_images = dl__any_image(&(*s)->ds);
  return r;
}

void dl_tool_source_free(dl_tool_source *s) {
  if (!s)
    return;
  dl__dataset_free(&s->ds);
  free(s);
}

size_t dl_tool_source_count(const dl_tool_source *s) { return s ? s->ds.n : 0; }

uint64_t dl_tool_sample_bytes(const dl_tool_source *s, size_t i) { return s->ds.samples[i].size; }

const char *const *dl_tool_source_classes(const dl_tool_source *s, size_t *n) {
  bool named = s && s->ds.classes && !s->ds.classes_differ;
  *n = named ? s->ds.nclasses : 0;
  return named ? (const char *const *)s->ds.classes : NULL;
}

dl_tool_scratch *dl_tool_scratch_new(void) {
  dl_tool_scratch *t = calloc(1, sizeof *t);
  if (t && dl__checker_new(&t->checker, NULL, NULL)) {
    free(t);
    t = NULL;
  }
  return t;
}

void dl_tool_scratch_free(dl_tool_scratch *t) {
  if (!t)
    return;
  dl__buf_free(&t->record);
  dl__buf_free(&t->raw);
  dl__buf_free(&t->image);
  ZSTD_freeDCtx(t->zctx);
  dl__checker_free(t->checker);
  free(t);
}

/* Streaming's raw "pil" pixels as a PNG in OUT (*LEN bytes): lossless, so the ringfeed shard gives
 * the loader the same pixels (alpha kept, and dropped at decode as for the pil value). */
static int pil_to_png(const dl__sample *s, const dl__dataset *ds, const uint8_t *p, size_t len, dl__buf *out,
                      size_t *png_len) {
  dl__pil_image im;
  dl__err e = {0};
  if (dl__pil_header(p, len, INT64_C(1) << 31, &im, &e))
    return dl__fail(e.code, "sample %s: %s", ds->pool + s->key, e.msg);
  static const png_uint_32 formats[] = {0, PNG_FORMAT_GRAY, PNG_FORMAT_GA, PNG_FORMAT_RGB, PNG_FORMAT_RGBA};
  png_image png = {.version = PNG_IMAGE_VERSION, .width = im.width, .height = im.height, .format = formats[im.bpp]};
  png_alloc_size_t need = 0;
  png_image_write_to_memory(&png, NULL, &need, 0, im.pixels, 0, NULL);
  if (!need || dl__buf_reserve(out, need)) {
    png_image_free(&png);
    return dl__fail(need ? -ENOMEM : DL_ELIMIT, "sample %s: its %ux%u pil pixels cannot be a PNG%s", ds->pool + s->key,
                    im.width, im.height, need ? " (out of memory)" : "");
  }
  if (!png_image_write_to_memory(&png, out->p, &need, 0, im.pixels, 0, NULL))
    return dl__fail(DL_ELIMIT, "sample %s: writing its pil pixels as a PNG: %s", ds->pool + s->key, png.message);
  *png_len = need;
  return 0;
}

/* Writes sample S's tensor fields (tar .npy/.npy.zst members, .rfs raw/zstd fields, MDS columns)
 * from BYTES. */
static int write_tensors(dl_writer *w, const dl__dataset *ds, const dl__sample *s, const uint8_t *bytes,
                         dl__buf *raw) {
  for (uint8_t r = 0; r < s->nrefs; r++) {
    const dl__fref *ref = &ds->refs[s->first_ref + r];
    const char *name = ds->field_names[ref->name];
    const uint8_t *p = bytes + ref->at;
    if (ref->kind == DL__REF_MDS) {
      dl__err e = {0};
      size_t len = 0;
      if (dl__npy_of_mds(&ds->mds[ref->name], p, ref->len, raw, &len, &e))
        return dl__fail(e.code, "sample %s field %s: %s", ds->pool + s->key, name, e.msg);
      int rc = dl_writer_field(w, name, "raw", raw->p, len);
      if (rc)
        return rc;
      continue;
    }
    if (ref->kind == DL__REF_NPY || ref->kind == DL__REF_BYTES) {
      /* An MDS str or json column keeps its kind; other bytes keep their names, whose extension
       * says it (caption.txt). */
      uint8_t bk = ds->bytes_kind[ref->name];
      const char *codec = ref->kind == DL__REF_NPY        ? "raw"
                          : bk == DL__BYTES_TEXT ? "text"
                          : bk == DL__BYTES_JSON ? "json"
                                                 : "bytes";
      int rc = dl_writer_field(w, name, codec, p, ref->len);
      if (rc)
        return rc;
      continue;
    }
    /* Compressed: checked by decompressing (frames from a stream carry no size), then stored
     * compressed again; at most 1 GiB. */
    ZSTD_DStream *z = ZSTD_createDStream();
    ZSTD_inBuffer in = {p, ref->len, 0};
    size_t got = 0, zr = 1;
    while (z && zr != 0 && !ZSTD_isError(zr)) {
      if (got + (1u << 20) > raw->cap && (raw->cap >= (1u << 30) || dl__buf_reserve(raw, got + (1u << 20)))) {
        zr = (size_t)-1;
        break;
      }
      ZSTD_outBuffer out = {raw->p + got, raw->cap - got, 0};
      size_t before = in.pos;
      zr = ZSTD_decompressStream(z, &out, &in);
      got += out.pos;
      if (!ZSTD_isError(zr) && zr != 0 && in.pos == before && out.pos == 0 && in.pos == in.size)
        zr = (size_t)-1; /* truncated frame: no progress left to make */
    }
    ZSTD_freeDStream(z);
    if (!z || zr != 0)
      return dl__fail(DL_ECORRUPT, "sample %s field %s: zstd: %s", ds->pool + s->key, name,
                      ZSTD_isError(zr) && zr != (size_t)-1 ? ZSTD_getErrorName(zr) : "frame cut short or too large");
    int rc = dl_writer_field(w, name, "zstd", raw->p, got);
    if (rc)
      return rc;
  }
  return 0;
}

/* Whether sample S, its bytes read into T, is one the loader would skip: why into WHY. A sample that
 * cannot be read is bad too, and *UNREAD says so (there is nothing to keep of it). */
static bool bad_sample(const dl_tool_source *src, const dl__sample *s, dl_tool_scratch *t, bool *unread, char *why,
                       size_t cap) {
  const dl__dataset *ds = &src->ds;
  dl__err e = {0};
  *unread = false;
  if (src->has_images && s->codec == DL__CODEC_NONE)
    dl__err_set(&e, DL_ENOFIELD, DL__NO_IMAGE);
  if ((s->codec != DL__CODEC_NONE || s->nrefs) && dl__sample_read(ds, s, &t->record)) {
    *unread = true;
    snprintf(why, cap, "%s", dl_last_error());
    return true;
  }
  if (!e.code && (s->codec != DL__CODEC_NONE || s->nrefs))
    dl__check_sample(t->checker, ds, s, t->record.p, &e);
  if (e.code)
    snprintf(why, cap, "shard %s member %s: %s", ds->files[s->file], dl__sample_name(ds, s), e.msg);
  return e.code != 0;
}

int dl_tool_write_sample(const dl_tool_source *src, size_t i, dl_writer *w, dl_tool_scratch *t, bool keep_bad,
                         char *why, size_t cap) {
  const dl__dataset *ds = &src->ds;
  const dl__sample *s = &ds->samples[i];
  bool unread, bad = bad_sample(src, s, t, &unread, why, cap);
  if (bad && (unread || !keep_bad))
    return 1;
  int r = dl_writer_begin(w, ds->pool + s->key, s->label);
  if (!r && s->codec != DL__CODEC_NONE) {
    const uint8_t *img = t->record.p + s->image_at;
    size_t len = s->image_len;
    if (s->codec == DL__CODEC_PIL) { /* raw pixels, which ringfeed shards keep as PNG */
      r = pil_to_png(s, ds, img, len, &t->image, &len);
      img = t->image.p;
    } else if (s->flags & DL__SAMPLE_IMAGE_ZST) { /* stored as the plain image it holds */
      dl__err e = {0};
      if (dl__zstd_inflate(&t->zctx, img, len, 1u << 30, &t->image, &len, &e))
        r = dl__fail(e.code, "sample %s image: %s", ds->pool + s->key, e.msg);
      img = t->image.p;
    }
    const dl__codec *c = r ? NULL : dl__codec_of(dl__sniff_codec(img, len)); /* IMG may be NULL after a failure */
    if (!r)
      r = dl_writer_field(w, "image", c && c->rfs >= 0 ? c->name : "jpeg", img, len);
  }
  if (!r && s->nrefs)
    r = write_tensors(w, ds, s, t->record.p, &t->raw);
  if (!r)
    r = dl_writer_end(w);
  return r ? r : bad ? 2 : 0;
}
