/* Safetensors writer and reader (safetensors.h). The header is built and
 * parsed with jansson; the data is written and read with plain write/pread
 * so tensors of any size go straight between memory and the file. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "err.h"

/* Bytes per write() and per crc32() call: under zlib's uInt limit. */
#define IO_CHUNK (64u << 20)

struct cm_st_writer {
  int fd;            /* caller's */
  char path[1024];   /* for messages */
  int n;             /* tensors */
  uint64_t *ends;    /* owned: each tensor's end offset in the data */
  uint32_t *crcs;    /* owned: each tensor's CRC so far */
  uint64_t data_len; /* bytes of data announced */
  uint64_t written;  /* bytes of data written so far */
  int cur;           /* tensor the next byte belongs to */
  uint64_t header;   /* bytes before the data: 8 + header length */
};

struct cm_st_file {
  int fd;                        /* owned */
  char path[1024];               /* for messages */
  uint64_t size;                 /* file size */
  uint64_t data_start;           /* 8 + header length */
  int n;                         /* tensors */
  struct cm_st_tensor *tensors;  /* owned, by data offset */
  struct cm_st_tensor **by_name; /* owned, sorted by name for cm_st_find */
  int nmeta;                     /* metadata entries */
  char **meta;                   /* owned: key, value, key, value, ... */
};

uint32_t cm_st_crc32(uint32_t crc, const void *p, size_t n) {
  const unsigned char *b = p;
  while (n > 0) {
    uInt k = n > IO_CHUNK ? IO_CHUNK : (uInt)n;
    crc = (uint32_t)crc32(crc, b, k);
    b += k;
    n -= k;
  }
  return crc;
}

/* Bytes per element of a safetensors dtype, 0 when unknown. */
static int dtype_size(const char *d) {
  static const struct {
    const char *name;
    int size;
  } types[] = {{"F64", 8},  {"F32", 4},     {"F16", 2},    {"BF16", 2},
               {"I64", 8},  {"I32", 4},     {"I16", 2},    {"I8", 1},
               {"U64", 8},  {"U32", 4},     {"U16", 2},    {"U8", 1},
               {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (strcmp(d, types[i].name) == 0)
      return types[i].size;
  return 0;
}

/* numel * elem as a byte count; 0 with *ok = 0 on overflow. */
static uint64_t tensor_bytes(int ndim, const int64_t *shape, int elem,
                             int *ok) {
  uint64_t n = (uint64_t)elem;
  *ok = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 ||
        (shape[i] > 0 && n > UINT64_MAX / (uint64_t)shape[i] / 2)) {
      *ok = 0;
      return 0;
    }
    n *= (uint64_t)shape[i];
  }
  return n;
}

/* Writes all of p[0..n) to fd, retrying short writes. */
static int write_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n > 0) {
    ssize_t k = write(fd, b, n > IO_CHUNK ? IO_CHUNK : n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      if (k == 0)
        errno = EIO;
      return CM_EIO;
    }
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

/* ---- writer ---- */

int cm_st_writer_new(struct cm_st_writer **out, int fd, const char *path,
                     const struct cm_st_desc *tensors, int n,
                     const struct cm_st_meta *meta, int nmeta, char *err,
                     size_t errlen) {
  struct cm_st_writer *w = calloc(1, sizeof *w);
  json_t *root = json_object(), *md = NULL;
  char *text = NULL, *buf = NULL;
  uint64_t off = 0;
  int rc = 0;

  *out = NULL;
  if (!w || !root || !(w->ends = calloc(n + 1, sizeof *w->ends)) ||
      !(w->crcs = calloc(n + 1, sizeof *w->crcs))) {
    rc = CM_ENOMEM;
    goto out;
  }
  w->fd = fd;
  w->n = n;
  snprintf(w->path, sizeof w->path, "%s", path);
  if (nmeta > 0) {
    if (!(md = json_object()) ||
        json_object_set_new(root, "__metadata__", md)) {
      rc = CM_ENOMEM;
      goto out;
    }
    for (int i = 0; i < nmeta; i++) {
      json_t *v = json_string(meta[i].value);
      if (!v || json_object_set_new(md, meta[i].key, v)) {
        snprintf(err, errlen,
                 "%s: metadata entry '%s' is not a UTF-8 string pair", path,
                 meta[i].key);
        rc = CM_EINVAL;
        goto out;
      }
    }
  }
  for (int i = 0; i < n; i++) {
    const struct cm_st_desc *t = &tensors[i];
    json_t *shape = json_array(), *info;
    int ok, u64 = t->dtype && !strcmp(t->dtype, "U64"); /* else F32 */
    int known = !t->dtype || u64 || !strcmp(t->dtype, "F32");
    uint64_t bytes;
    if (t->ndim < 0 || t->ndim > CM_ST_MAX_DIMS) {
      json_decref(shape);
      snprintf(err, errlen, "%s: tensor '%s' has %d dimensions; at most %d",
               path, t->name, t->ndim, CM_ST_MAX_DIMS);
      rc = CM_EINVAL;
      goto out;
    }
    bytes = tensor_bytes(t->ndim, t->shape, u64 ? 8 : 4, &ok);
    for (int d = 0; ok && d < t->ndim; d++)
      json_array_append_new(shape, json_integer(t->shape[d]));
    if (!ok || !known || !strcmp(t->name, "__metadata__") ||
        json_object_get(root, t->name)) {
      json_decref(shape);
      snprintf(err, errlen, "%s: tensor '%s': %s", path, t->name,
               !ok      ? "bad shape (negative or too large)"
               : !known ? "the writer takes dtype F32 or U64 only"
                        : "the name is taken (duplicate or __metadata__)");
      rc = CM_EINVAL;
      goto out;
    }
    info = json_pack("{s:s, s:o, s:[I, I]}", "dtype", u64 ? "U64" : "F32",
                     "shape", shape, "data_offsets", (json_int_t)off,
                     (json_int_t)(off + bytes));
    if (!info || json_object_set_new(root, t->name, info)) {
      snprintf(err, errlen, "%s: tensor name '%s' is not valid UTF-8", path,
               t->name);
      rc = CM_EINVAL;
      goto out;
    }
    off += bytes;
    w->ends[i] = off;
  }
  w->data_len = off;
  if (!(text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER))) {
    rc = CM_ENOMEM;
    goto out;
  }
  {
    /* Padded with spaces so the data starts 8-byte aligned. */
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    if (!(buf = malloc(8 + padded))) {
      rc = CM_ENOMEM;
      goto out;
    }
    for (int i = 0; i < 8; i++)
      buf[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
    memcpy(buf + 8, text, len);
    memset(buf + 8 + len, ' ', padded - len);
    w->header = 8 + padded;
    if (write_all(fd, buf, 8 + padded)) {
      snprintf(err, errlen, "%s: write: %s", path, strerror(errno));
      rc = CM_EIO;
      goto out;
    }
  }
  while (w->cur < n && w->ends[w->cur] == 0)
    w->cur++; /* leading empty tensors */
  *out = w;
  w = NULL;
out:
  free(buf);
  free(text);
  json_decref(root);
  cm_st_writer_free(w);
  return rc;
}

int cm_st_writer_write(struct cm_st_writer *w, const void *data, size_t len,
                       char *err, size_t errlen) {
  const unsigned char *p = data;
  size_t left = len;
  if (len > w->data_len - w->written) {
    snprintf(err, errlen,
             "%s: %zu more bytes of data than the header announced", w->path,
             (size_t)(len - (w->data_len - w->written)));
    return CM_EINVAL;
  }
  if (write_all(w->fd, data, len)) {
    snprintf(err, errlen, "%s: write: %s", w->path, strerror(errno));
    return CM_EIO;
  }
  /* Checksum each tensor's share of these bytes. */
  while (left > 0) {
    uint64_t room = w->ends[w->cur] - w->written;
    size_t k = left < room ? left : (size_t)room;
    w->crcs[w->cur] = cm_st_crc32(w->crcs[w->cur], p, k);
    p += k;
    left -= k;
    w->written += k;
    while (w->cur < w->n && w->written == w->ends[w->cur] && w->cur + 1 < w->n)
      w->cur++;
  }
  return 0;
}

int cm_st_writer_finish(struct cm_st_writer *w, char *err, size_t errlen) {
  if (w->written != w->data_len) {
    snprintf(err, errlen,
             "%s: %llu bytes of tensor data written; the header announced "
             "%llu",
             w->path, (unsigned long long)w->written,
             (unsigned long long)w->data_len);
    return CM_EINVAL;
  }
  return 0;
}

uint32_t cm_st_writer_crc(const struct cm_st_writer *w, int i) {
  return i >= 0 && i < w->n ? w->crcs[i] : 0;
}

uint64_t cm_st_writer_size(const struct cm_st_writer *w) {
  return w->header + w->data_len;
}

void cm_st_writer_free(struct cm_st_writer *w) {
  if (!w)
    return;
  free(w->ends);
  free(w->crcs);
  free(w);
}

/* ---- reader ---- */

static int cmp_begin(const void *a, const void *b) {
  const struct cm_st_tensor *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int cmp_name(const void *a, const void *b) {
  const struct cm_st_tensor *const *x = a, *const *y = b;
  return strcmp((*x)->name, (*y)->name);
}

/* Reads exactly len bytes at off; CM_ETRUNC when the file ends first. */
static int pread_all(int fd, void *buf, size_t len, uint64_t off) {
  char *b = buf;
  while (len > 0) {
    ssize_t k = pread(fd, b, len > IO_CHUNK ? IO_CHUNK : len, (off_t)off);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0)
      return CM_EIO;
    if (k == 0)
      return CM_ETRUNC;
    b += k;
    len -= (size_t)k;
    off += (uint64_t)k;
  }
  return 0;
}

/* Checks one tensor entry of the header into *t. Returns 0 or CM_EFORMAT
 * with err set. */
static int parse_tensor(const char *path, const char *name, json_t *v,
                        struct cm_st_tensor *t, char *err, size_t errlen) {
  json_t *dtype = json_object_get(v, "dtype");
  json_t *shape = json_object_get(v, "shape");
  json_t *offs = json_object_get(v, "data_offsets");
  json_t *x;
  size_t i;
  int size, ok;
  uint64_t bytes;

  if (!json_is_object(v) || !json_is_string(dtype) || !json_is_array(shape) ||
      !json_is_array(offs) || json_array_size(offs) != 2) {
    snprintf(err, errlen,
             "%s: header entry '%s' is not {\"dtype\", \"shape\", "
             "\"data_offsets\": [begin, end]}",
             path, name);
    return CM_EFORMAT;
  }
  snprintf(t->dtype, sizeof t->dtype, "%s", json_string_value(dtype));
  if (!(size = dtype_size(t->dtype))) {
    snprintf(err, errlen, "%s: tensor '%s': unknown dtype \"%.16s\"", path,
             name, json_string_value(dtype));
    return CM_EFORMAT;
  }
  if (json_array_size(shape) > CM_ST_MAX_DIMS) {
    snprintf(err, errlen, "%s: tensor '%s' has %zu dimensions; at most %d",
             path, name, json_array_size(shape), CM_ST_MAX_DIMS);
    return CM_EFORMAT;
  }
  t->ndim = (int)json_array_size(shape);
  json_array_foreach(shape, i, x) {
    if (!json_is_integer(x) || json_integer_value(x) < 0) {
      snprintf(err, errlen,
               "%s: tensor '%s': shape entry %zu is not a non-negative "
               "integer",
               path, name, i);
      return CM_EFORMAT;
    }
    t->shape[i] = json_integer_value(x);
  }
  for (i = 0; i < 2; i++) {
    x = json_array_get(offs, i);
    if (!json_is_integer(x) || json_integer_value(x) < 0) {
      snprintf(err, errlen,
               "%s: tensor '%s': data_offsets are not non-negative integers",
               path, name);
      return CM_EFORMAT;
    }
  }
  t->begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
  t->end = (uint64_t)json_integer_value(json_array_get(offs, 1));
  bytes = tensor_bytes(t->ndim, t->shape, size, &ok);
  if (!ok || t->end < t->begin || t->end - t->begin != bytes) {
    snprintf(err, errlen,
             "%s: tensor '%s': data_offsets [%llu, %llu] do not hold its "
             "shape's %llu bytes",
             path, name, (unsigned long long)t->begin,
             (unsigned long long)t->end, (unsigned long long)bytes);
    return CM_EFORMAT;
  }
  return 0;
}

/* Copies the "__metadata__" object's entries into f. */
static int parse_meta(struct cm_st_file *f, json_t *md, char *err,
                      size_t errlen) {
  const char *key;
  json_t *v;
  size_t n = json_object_size(md), i = 0;

  if (!json_is_object(md)) {
    snprintf(err, errlen, "%s: __metadata__ is not an object", f->path);
    return CM_EFORMAT;
  }
  if (!(f->meta = calloc(2 * n + 1, sizeof *f->meta)))
    return CM_ENOMEM;
  json_object_foreach(md, key, v) {
    if (!json_is_string(v)) {
      snprintf(err, errlen, "%s: __metadata__ entry '%s' is not a string",
               f->path, key);
      return CM_EFORMAT;
    }
    if (!(f->meta[2 * i] = strdup(key)) ||
        !(f->meta[2 * i + 1] = strdup(json_string_value(v))))
      return CM_ENOMEM;
    i++;
    f->nmeta = (int)i;
  }
  return 0;
}

/* Parses and checks the header text against the file's size. */
static int parse_header(struct cm_st_file *f, const char *text, size_t len,
                        char *err, size_t errlen) {
  json_error_t jerr;
  json_t *root = NULL, *v;
  const char *key;
  uint64_t data = f->size - f->data_start, at = 0;
  int rc = 0, i = 0;

  if (len == 0 || text[0] != '{') {
    snprintf(err, errlen,
             "%s: the header does not start with '{': not a safetensors file",
             f->path);
    return CM_EFORMAT;
  }
  root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!json_is_object(root)) {
    snprintf(err, errlen, "%s: the header is not a JSON object: %s", f->path,
             root ? "another JSON value" : jerr.text);
    rc = CM_EFORMAT;
    goto out;
  }
  f->n = (int)json_object_size(root);
  if (json_object_get(root, "__metadata__"))
    f->n--;
  if (!(f->tensors = calloc(f->n + 1, sizeof *f->tensors)) ||
      !(f->by_name = calloc(f->n + 1, sizeof *f->by_name))) {
    rc = CM_ENOMEM;
    goto out;
  }
  json_object_foreach(root, key, v) {
    if (!strcmp(key, "__metadata__")) {
      if ((rc = parse_meta(f, v, err, errlen)))
        goto out;
      continue;
    }
    if (!(f->tensors[i].name = strdup(key))) {
      rc = CM_ENOMEM;
      goto out;
    }
    if ((rc = parse_tensor(f->path, key, v, &f->tensors[i], err, errlen))) {
      i++;
      goto out;
    }
    i++;
  }
  qsort(f->tensors, f->n, sizeof *f->tensors, cmp_begin);
  for (i = 0; i < f->n; i++) {
    const struct cm_st_tensor *t = &f->tensors[i];
    if (t->begin != at) {
      snprintf(err, errlen,
               "%s: tensor '%s' starts at data byte %llu; expected %llu (the "
               "tensors must be back to back)",
               f->path, t->name, (unsigned long long)t->begin,
               (unsigned long long)at);
      rc = CM_EFORMAT;
      goto out;
    }
    at = t->end;
    f->by_name[i] = &f->tensors[i];
  }
  if (at > data) {
    snprintf(err, errlen,
             "%s: truncated: the header describes %llu bytes of tensor data "
             "but the file holds %llu",
             f->path, (unsigned long long)at, (unsigned long long)data);
    rc = CM_ETRUNC;
    goto out;
  }
  if (at < data) {
    snprintf(err, errlen,
             "%s: %llu bytes follow the last tensor (the header describes "
             "%llu bytes of data, the file holds %llu)",
             f->path, (unsigned long long)(data - at), (unsigned long long)at,
             (unsigned long long)data);
    rc = CM_EFORMAT;
    goto out;
  }
  qsort(f->by_name, f->n, sizeof *f->by_name, cmp_name);
out:
  json_decref(root);
  return rc;
}

int cm_st_open(struct cm_st_file **out, const char *path, char *err,
               size_t errlen) {
  struct cm_st_file *f = calloc(1, sizeof *f);
  unsigned char len8[8];
  char *text = NULL;
  uint64_t hlen = 0;
  struct stat st;
  int rc = 0;

  *out = NULL;
  if (!f)
    return CM_ENOMEM;
  snprintf(f->path, sizeof f->path, "%s", path);
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0 || fstat(f->fd, &st) != 0) {
    rc = errno == ENOENT ? CM_ENOENT : CM_EIO;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    goto out;
  }
  f->size = (uint64_t)st.st_size;
  if (f->size < 8) {
    snprintf(err, errlen,
             "%s: truncated: %llu bytes; a safetensors file starts with an "
             "8-byte header length",
             path, (unsigned long long)f->size);
    rc = CM_ETRUNC;
    goto out;
  }
  if ((rc = pread_all(f->fd, len8, 8, 0))) {
    snprintf(err, errlen, "%s: read: %s", path,
             rc == CM_EIO ? strerror(errno) : "file shrank");
    goto out;
  }
  for (int i = 7; i >= 0; i--)
    hlen = hlen << 8 | len8[i];
  if (hlen > CM_ST_MAX_HEADER) {
    snprintf(err, errlen,
             "%s: header length %llu is over %u MiB: not a safetensors file",
             path, (unsigned long long)hlen, CM_ST_MAX_HEADER >> 20);
    rc = CM_EFORMAT;
    goto out;
  }
  if (8 + hlen > f->size) {
    snprintf(err, errlen,
             "%s: truncated: the header is %llu bytes but the file has only "
             "%llu after the length",
             path, (unsigned long long)hlen, (unsigned long long)(f->size - 8));
    rc = CM_ETRUNC;
    goto out;
  }
  f->data_start = 8 + hlen;
  if (!(text = malloc(hlen + 1))) {
    rc = CM_ENOMEM;
    goto out;
  }
  if ((rc = pread_all(f->fd, text, hlen, 8))) {
    snprintf(err, errlen, "%s: read: %s", path,
             rc == CM_EIO ? strerror(errno) : "file shrank");
    goto out;
  }
  text[hlen] = 0;
  rc = parse_header(f, text, hlen, err, errlen);
out:
  free(text);
  if (rc)
    cm_st_close(f);
  else
    *out = f;
  return rc;
}

void cm_st_close(struct cm_st_file *f) {
  if (!f)
    return;
  if (f->fd >= 0)
    close(f->fd);
  for (int i = 0; f->tensors && i < f->n; i++)
    free(f->tensors[i].name);
  for (int i = 0; f->meta && i < 2 * f->nmeta; i++)
    free(f->meta[i]);
  free(f->meta);
  free(f->tensors);
  free(f->by_name);
  free(f);
}

int cm_st_count(const struct cm_st_file *f) { return f->n; }

const struct cm_st_tensor *cm_st_at(const struct cm_st_file *f, int i) {
  return i >= 0 && i < f->n ? &f->tensors[i] : NULL;
}

const struct cm_st_tensor *cm_st_find(const struct cm_st_file *f,
                                      const char *name) {
  struct cm_st_tensor key = {.name = (char *)name}, *kp = &key, **hit;
  hit = bsearch(&kp, f->by_name, f->n, sizeof *f->by_name, cmp_name);
  return hit ? *hit : NULL;
}

const char *cm_st_meta_get(const struct cm_st_file *f, const char *key) {
  for (int i = 0; i < f->nmeta; i++)
    if (!strcmp(f->meta[2 * i], key))
      return f->meta[2 * i + 1];
  return NULL;
}

int cm_st_read(struct cm_st_file *f, const struct cm_st_tensor *t, uint64_t off,
               void *buf, size_t len, char *err, size_t errlen) {
  int rc;
  if (off > t->end - t->begin || len > t->end - t->begin - off) {
    snprintf(err, errlen,
             "%s: tensor '%s': bytes [%llu, %llu) are outside its %llu bytes",
             f->path, t->name, (unsigned long long)off,
             (unsigned long long)(off + len),
             (unsigned long long)(t->end - t->begin));
    return CM_ERANGE;
  }
  rc = pread_all(f->fd, buf, len, f->data_start + t->begin + off);
  if (rc)
    snprintf(err, errlen, "%s: read of tensor '%s': %s", f->path, t->name,
             rc == CM_EIO ? strerror(errno) : "the file shrank");
  return rc;
}

uint64_t cm_st_size(const struct cm_st_file *f) { return f->size; }
