/* TensorBoard event files (tfevents.h): the protobuf encoding of the few
 * Event fields a scalar needs, the TFRecord framing around each message,
 * and the file they go to. */
#include "tfevents.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "err.h"

/* Protobuf wire types. */
enum { PB_VARINT = 0, PB_FIXED64 = 1, PB_LEN = 2, PB_FIXED32 = 5 };

/* Largest encoded event: the writer's stack buffer. */
#define EVENT_MAX 8192

struct cm_tfevents {
  FILE *f;             /* the event file, opened for writing */
  char path[PATH_MAX]; /* its path, for messages */
};

/* Where an encoding stands: bytes used in buf[0..cap); failed once a write
 * did not fit (later writes do nothing). */
struct pb {
  unsigned char *buf; /* the output */
  size_t cap;         /* its size */
  size_t len;         /* bytes used */
  int failed;         /* something did not fit */
};

static void put_bytes(struct pb *b, const void *p, size_t n) {
  if (b->failed || n > b->cap - b->len) {
    b->failed = 1;
    return;
  }
  memcpy(b->buf + b->len, p, n);
  b->len += n;
}

static void put_varint(struct pb *b, uint64_t v) {
  unsigned char tmp[10];
  size_t n = 0;
  do {
    tmp[n++] = (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  put_bytes(b, tmp, n);
}

/* The little-endian bytes of the low `width` bytes of v. */
static void put_le(struct pb *b, uint64_t v, int width) {
  unsigned char tmp[8];
  for (int i = 0; i < width; i++)
    tmp[i] = (unsigned char)(v >> (8 * i));
  put_bytes(b, tmp, (size_t)width);
}

static void put_key(struct pb *b, int field, int wire) {
  put_varint(b, (uint64_t)field << 3 | (uint64_t)wire);
}

static void put_string(struct pb *b, int field, const char *s) {
  size_t n = strlen(s);
  put_key(b, field, PB_LEN);
  put_varint(b, n);
  put_bytes(b, s, n);
}

/* Bytes of the varint encoding of v. */
static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v > 0x7f) {
    v >>= 7;
    n++;
  }
  return n;
}

/* One Summary.Value: tag = 1, simple_value = 2. */
static size_t value_len(const struct cm_tf_scalar *s) {
  size_t t = strlen(s->tag);
  return 1 + varint_len(t) + t + 1 + 4;
}

static void put_value(struct pb *b, const struct cm_tf_scalar *s) {
  uint32_t bits;
  memcpy(&bits, &s->value, sizeof bits);
  put_string(b, 1, s->tag);
  put_key(b, 2, PB_FIXED32);
  put_le(b, bits, 4);
}

int cm_tfevents_encode(unsigned char *buf, size_t cap, double wall_time,
                       int64_t step, const char *version,
                       const struct cm_tf_scalar *v, int n) {
  struct pb b = {buf, cap, 0, 0};
  uint64_t bits;
  size_t summary = 0;

  for (int i = 0; i < n; i++) {
    if (strlen(v[i].tag) > CM_TFEVENTS_MAX_TAG)
      return CM_ERANGE;
    summary += 1 + varint_len(value_len(&v[i])) + value_len(&v[i]);
  }
  memcpy(&bits, &wall_time, sizeof bits);
  put_key(&b, 1, PB_FIXED64);
  put_le(&b, bits, 8);
  if (step != 0) {
    put_key(&b, 2, PB_VARINT);
    put_varint(&b, (uint64_t)step); /* int64: negative as 10 bytes */
  }
  if (version)
    put_string(&b, 3, version);
  if (n > 0) {
    put_key(&b, 5, PB_LEN);
    put_varint(&b, summary);
    for (int i = 0; i < n; i++) {
      put_key(&b, 1, PB_LEN); /* Summary.value */
      put_varint(&b, value_len(&v[i]));
      put_value(&b, &v[i]);
    }
  }
  if (b.failed || b.len > INT_MAX)
    return CM_ERANGE;
  return (int)b.len;
}

void cm_tfrecord_head(unsigned char head[CM_TFRECORD_HEAD], uint64_t len) {
  uint32_t crc;
  for (int i = 0; i < 8; i++)
    head[i] = (unsigned char)(len >> (8 * i));
  crc = cm_crc32c_mask(cm_crc32c(0, head, 8));
  for (int i = 0; i < 4; i++)
    head[8 + i] = (unsigned char)(crc >> (8 * i));
}

void cm_tfrecord_foot(unsigned char foot[CM_TFRECORD_FOOT], const void *data,
                      size_t len) {
  uint32_t crc = cm_crc32c_mask(cm_crc32c(0, data, len));
  for (int i = 0; i < 4; i++)
    foot[i] = (unsigned char)(crc >> (8 * i));
}

/* Seconds since the epoch, with the fraction. */
static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Frames data[0..len) as one record, writes it and flushes. */
static int write_record(struct cm_tfevents *w, const unsigned char *data,
                        size_t len) {
  unsigned char head[CM_TFRECORD_HEAD], foot[CM_TFRECORD_FOOT];

  cm_tfrecord_head(head, len);
  cm_tfrecord_foot(foot, data, len);
  if (fwrite(head, 1, sizeof head, w->f) != sizeof head ||
      fwrite(data, 1, len, w->f) != len ||
      fwrite(foot, 1, sizeof foot, w->f) != sizeof foot || fflush(w->f) != 0)
    return CM_EIO;
  return 0;
}

/* mkdir -p: creates each missing directory of path. */
static int make_dirs(const char *path) {
  char tmp[PATH_MAX];
  size_t n = strlen(path);

  if (n == 0 || n >= sizeof tmp)
    return CM_ERANGE;
  memcpy(tmp, path, n + 1);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(tmp, 0777) != 0 && errno != EEXIST)
      return CM_EIO;
    *p = '/';
  }
  if (mkdir(tmp, 0777) != 0 && errno != EEXIST)
    return CM_EIO;
  return 0;
}

int cm_tfevents_open(struct cm_tfevents **out, const char *dir, int index) {
  struct cm_tfevents *w = NULL;
  unsigned char buf[256];
  char host[256];
  double now = wall_now();
  int rc, n;

  *out = NULL;
  if ((rc = make_dirs(dir)) < 0)
    goto out;
  if (gethostname(host, sizeof host) != 0)
    snprintf(host, sizeof host, "localhost");
  host[sizeof host - 1] = '\0';
  for (char *p = host; *p; p++)
    if (*p == '/')
      *p = '_'; /* one path component, whatever the name holds */
  if (!(w = calloc(1, sizeof *w))) {
    rc = CM_ENOMEM;
    goto out;
  }
  n = snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%ld.%d",
               dir, (long long)now, host, (long)getpid(), index);
  if (n < 0 || (size_t)n >= sizeof w->path) {
    rc = CM_ERANGE;
    goto out;
  }
  /* "x": never append to another writer's file. */
  if (!(w->f = fopen(w->path, "wbx"))) {
    rc = CM_EIO;
    goto out;
  }
  rc =
      cm_tfevents_encode(buf, sizeof buf, now, 0, CM_TFEVENTS_VERSION, NULL, 0);
  if (rc >= 0)
    rc = write_record(w, buf, (size_t)rc);
out:
  if (rc < 0) {
    int saved = errno;
    cm_tfevents_close(w);
    errno = saved;
    w = NULL;
  }
  *out = w;
  return rc < 0 ? rc : 0;
}

const char *cm_tfevents_path(const struct cm_tfevents *w) { return w->path; }

int cm_tfevents_write(struct cm_tfevents *w, int64_t step,
                      const struct cm_tf_scalar *v, int n) {
  unsigned char buf[EVENT_MAX];
  int len = cm_tfevents_encode(buf, sizeof buf, wall_now(), step, NULL, v, n);

  if (len < 0)
    return len;
  return write_record(w, buf, (size_t)len);
}

int cm_tfevents_close(struct cm_tfevents *w) {
  int rc = 0;

  if (!w)
    return 0;
  if (w->f && fclose(w->f) != 0)
    rc = CM_EIO;
  free(w);
  return rc;
}
