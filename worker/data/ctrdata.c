/* Whose data a CTR data directory holds (ctrdata.h): one scan of the
 * directory against truth.json's mark, then psd's files, the user's, or
 * a refusal that names what it looked for. */
#include "ctrdata.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "criteo.h"
#include "err.h"
#include "log.h"

/* The names psd's generators write (their temporary files are
 * NAME.tmp-PID of these). */
static const char *const gen_names[] = {
    "truth.json", "train.svm",    "test.svm",    "train.tsv",
    "test.tsv",   "train.tsv.gz", "test.tsv.gz", NULL};

/* The user's files a job reads, per format and split, in order. */
static const char *const user_criteo[2][5] = {
    {"train.tsv", "train.tsv.gz", "train.txt", "train.txt.gz", NULL},
    {"test.tsv", "test.tsv.gz", "test.txt", "test.txt.gz", NULL}};
static const char *const user_libsvm[2][2] = {{"train.svm", NULL},
                                              {"test.svm", NULL}};

/* What one look at a directory found. */
struct scan {
  int exists;      /* the directory is there */
  int n;           /* its entries, but . and .. */
  json_t *mark;    /* truth.json, when psd's mark is on it; else NULL */
  char other[600]; /* the first reason it is not psd's alone, or "" */
  char holds[600]; /* its first entries' names, for messages */
};

/* Whether name is NAME.tmp-PID of one of gen_names. */
static int psd_temporary(const char *name) {
  const char *t = strstr(name, ".tmp-");
  if (!t || !t[5])
    return 0;
  for (const char *d = t + 5; *d; d++)
    if (!isdigit((unsigned char)*d))
      return 0;
  for (int i = 0; gen_names[i]; i++)
    if (strlen(gen_names[i]) == (size_t)(t - name) &&
        !strncmp(name, gen_names[i], (size_t)(t - name)))
      return 1;
  return 0;
}

/* A file's size, or -1 when it is not a regular file. */
static long long file_size(const char *dir, const char *name) {
  char p[1100];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  if (stat(p, &st) != 0 || !S_ISREG(st.st_mode))
    return -1;
  return (long long)st.st_size;
}

/* Whether entry name of dir is psd's under the mark's files: why not in
 * s->other when it is the first that is not. */
static void judge(const char *dir, const char *name, json_t *files,
                  struct scan *s) {
  json_t *size = json_object_get(files, name);
  long long have;
  if (s->other[0] || !strcmp(name, "truth.json") || psd_temporary(name))
    return;
  if (!size) {
    snprintf(s->other, sizeof s->other, "psd did not write %s", name);
    return;
  }
  have = file_size(dir, name);
  if (json_is_integer(size) && have != (long long)json_integer_value(size))
    snprintf(s->other, sizeof s->other,
             "%s is not as psd wrote it (%lld bytes, psd wrote %lld)", name,
             have, (long long)json_integer_value(size));
}

/* Looks at dir once. Returns 0 (s filled; free s->mark), or CM_EIO with
 * err saying why. */
static int scan_dir(const char *dir, struct scan *s, char *err, size_t errlen) {
  char p[1100];
  json_t *files = NULL;
  const char *stamp;
  struct dirent *e;
  DIR *d;
  memset(s, 0, sizeof *s);
  if (!(d = opendir(dir))) {
    if (errno == ENOENT)
      return 0;
    snprintf(err, errlen, "cannot read the data directory %s: %s", dir,
             strerror(errno));
    return CM_EIO;
  }
  s->exists = 1;
  snprintf(p, sizeof p, "%s/truth.json", dir);
  s->mark = json_load_file(p, 0, NULL);
  stamp = json_string_value(json_object_get(s->mark, "generator"));
  if (s->mark && (!stamp || strcmp(stamp, DW_CTRDATA_STAMP))) {
    json_decref(s->mark);
    s->mark = NULL;
  }
  if (s->mark)
    files = json_object_get(s->mark, "files");
  else if (access(p, F_OK) == 0)
    snprintf(s->other, sizeof s->other,
             "its truth.json has no mark of psd's (\"generator\": \"%s\")",
             DW_CTRDATA_STAMP);
  else
    snprintf(s->other, sizeof s->other, "it has no truth.json of psd's");
  while ((e = readdir(d))) {
    size_t used = strlen(s->holds);
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    s->n++;
    if (s->n <= 8)
      snprintf(s->holds + used, sizeof s->holds - used, "%s%s",
               s->n > 1 ? ", " : "", e->d_name);
    else if (s->n == 9)
      snprintf(s->holds + used, sizeof s->holds - used, ", ...");
    judge(dir, e->d_name, files, s);
  }
  closedir(d);
  return 0;
}

/* The first of names[] that is a readable file of dir, in path; else 0. */
static int first_of(const char *dir, const char *const *names, char *path,
                    size_t size) {
  for (; *names; names++) {
    snprintf(path, size, "%s/%s", dir, *names);
    if (file_size(dir, *names) >= 0 && access(path, R_OK) == 0)
      return 1;
  }
  return 0;
}

/* names[] joined: "a, b, c or d". */
static void join(const char *const *names, const char *last, char *buf,
                 size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; names[i] && used < size; i++) {
    snprintf(buf + used, size - used, "%s%s",
             i == 0         ? ""
             : names[i + 1] ? ", "
                            : last,
             names[i]);
    used = strlen(buf);
  }
}

/* Criteo: the first line of path parses, labelled. */
static int first_line_parses(const char *path, char *err, size_t errlen) {
  struct dw_criteo *r = NULL;
  float label, dense[DW_CRITEO_INTS];
  uint64_t ids[DW_CRITEO_CATS];
  size_t got;
  int rc = dw_criteo_open(path, 0, 1, &r, err, errlen);
  if (!rc)
    rc =
        dw_criteo_read(r, 1, NULL, &label, dense, NULL, ids, &got, err, errlen);
  dw_criteo_close(r);
  return rc;
}

int dw_ctrdata_find(const char *dir, int criteo, json_t *settings,
                    const char *const gen[2], struct dw_ctrdata *out, char *err,
                    size_t errlen) {
  const char *const *names[2] = {criteo ? user_criteo[0] : user_libsvm[0],
                                 criteo ? user_criteo[1] : user_libsvm[1]};
  struct scan s;
  int rc;
  memset(out, 0, sizeof *out);
  out->truth.auc = out->truth.logloss = out->truth.ctr = NAN;
  out->truth.dense_auc = NAN;
  snprintf(out->train, sizeof out->train, "%s/%s", dir, gen[0]);
  snprintf(out->test, sizeof out->test, "%s/%s", dir, gen[1]);
  if ((rc = scan_dir(dir, &s, err, errlen)) || !s.exists || !s.n)
    goto out;
  if (s.mark) {
    json_t *files = json_object_get(s.mark, "files");
    int ours = json_equal(json_object_get(s.mark, "settings"), settings) &&
               json_is_real(json_object_get(s.mark, "true_auc"));
    for (int k = 0; k < 2 && ours; k++) {
      json_t *size = json_object_get(files, gen[k]);
      ours = json_is_integer(size) &&
             file_size(dir, gen[k]) == (long long)json_integer_value(size);
    }
    if (ours) {
      out->source = DW_CTRDATA_PSD;
      out->truth.auc = json_real_value(json_object_get(s.mark, "true_auc"));
      out->truth.logloss =
          json_real_value(json_object_get(s.mark, "true_logloss"));
      out->truth.ctr = json_real_value(json_object_get(s.mark, "ctr"));
      out->truth.dense_auc =
          json_real_value(json_object_get(s.mark, "dense_true_auc"));
      goto out;
    }
    if (!s.other[0])
      goto out; /* psd's, of other settings: generate again */
  }
  if (first_of(dir, names[0], out->train, sizeof out->train) &&
      first_of(dir, names[1], out->test, sizeof out->test)) {
    out->source = DW_CTRDATA_USER;
    if (criteo && ((rc = first_line_parses(out->train, err, errlen)) ||
                   (rc = first_line_parses(out->test, err, errlen))))
      goto out;
    goto out;
  }
  char train[200], test[200];
  join(names[0], " or ", train, sizeof train);
  join(names[1], " or ", test, sizeof test);
  snprintf(err, errlen,
           "the data directory %s holds no %s data psd can read, and psd did "
           "not write it (%s), so psd generates nothing there: looked for %s "
           "(training) and %s (held-out); it holds %s. Put the data there "
           "under those names, or name a new or empty directory for psd to "
           "generate into",
           dir, criteo ? "Criteo" : "LIBSVM", s.other, train, test, s.holds);
  rc = CM_EEXIST;
out:
  json_decref(s.mark);
  json_decref(settings);
  return rc;
}

int dw_ctrdata_mkdirs(const char *dir, char *err, size_t errlen) {
  char p[1100];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) {
    snprintf(err, errlen, "cannot create %s: %s", dir, strerror(ENAMETOOLONG));
    return CM_EIO;
  }
  for (char *s = p + 1;; s++) {
    if (*s == '/' || !*s) {
      char c = *s;
      *s = '\0';
      if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", p, strerror(errno));
        return CM_EIO;
      }
      *s = c;
    }
    if (!*s)
      break;
  }
  return 0;
}

int dw_ctrdata_lock(const char *dir, char *err, size_t errlen) {
  int rc, fd;
  if ((rc = dw_ctrdata_mkdirs(dir, err, errlen)))
    return rc;
  fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, errlen, "cannot open %s: %s", dir, strerror(errno));
    return CM_EIO;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) == 0)
    return fd;
  if (errno == EWOULDBLOCK) {
    cm_info("waiting for another process finding or generating the data in "
            "%s",
            dir);
    while ((rc = flock(fd, LOCK_EX)) != 0 && errno == EINTR)
      ;
    if (rc == 0)
      return fd;
  }
  snprintf(err, errlen, "cannot lock %s: %s", dir, strerror(errno));
  close(fd);
  return CM_EIO;
}

void dw_ctrdata_unlock(int fd) {
  if (fd >= 0)
    close(fd); /* the flock goes with the descriptor */
}

int dw_ctrdata_claim(const char *dir, const char *const gen[2], char *err,
                     size_t errlen) {
  struct scan s = {0};
  const char *key;
  json_t *v;
  char p[1100];
  int rc;
  if ((rc = dw_ctrdata_mkdirs(dir, err, errlen)) ||
      (rc = scan_dir(dir, &s, err, errlen)))
    goto out;
  if (s.n && (!s.mark || s.other[0])) {
    snprintf(err, errlen,
             "the data directory %s is not psd's to write: %s; it holds %s. "
             "psd generates only into a new or empty directory, or one of "
             "its own generation",
             dir, s.other, s.holds);
    rc = CM_EEXIST;
    goto out;
  }
  /* psd's files of the generation before, not written again: gone, so
   * that the directory holds one generation. */
  json_object_foreach(json_object_get(s.mark, "files"), key, v) {
    if (!strcmp(key, gen[0]) || !strcmp(key, gen[1]))
      continue;
    snprintf(p, sizeof p, "%s/%s", dir, key);
    if (unlink(p) != 0 && errno != ENOENT) {
      snprintf(err, errlen, "cannot remove %s: %s", p, strerror(errno));
      rc = CM_EIO;
      goto out;
    }
  }
  rc = dw_ctrgen_put_truth(dir,
                           json_pack("{s:s, s:{s:n, s:n}}", "generator",
                                     DW_CTRDATA_STAMP, "files", gen[0], gen[1]),
                           err, errlen);
out:
  json_decref(s.mark);
  return rc;
}

int dw_ctrdata_mark(const char *dir, json_t *j, const char *const gen[2],
                    char *err, size_t errlen) {
  json_t *files = j ? json_object() : NULL;
  for (int k = 0; k < 2 && files; k++) {
    long long size = file_size(dir, gen[k]);
    if (size < 0 ||
        json_object_set_new(files, gen[k], json_integer((json_int_t)size))) {
      snprintf(err, errlen, "cannot read %s/%s: %s", dir, gen[k],
               size < 0 ? strerror(errno) : "out of memory");
      json_decref(files);
      json_decref(j);
      return CM_EIO;
    }
  }
  if (j &&
      (!files ||
       json_object_set_new(j, "generator", json_string(DW_CTRDATA_STAMP)) ||
       json_object_set_new(j, "files", files))) {
    json_decref(j);
    j = NULL;
  }
  return dw_ctrgen_put_truth(dir, j, err, errlen);
}

void dw_ctrdata_token(const char *path, char *buf, size_t size) {
  size_t at = 0;
  for (const unsigned char *c = (const unsigned char *)path;
       *c && at + 4 <= size; c++) {
    if (*c <= ' ' || *c == '%' || *c >= 0x7f)
      at += (size_t)snprintf(buf + at, size - at, "%%%02X", *c);
    else
      buf[at++] = (char)*c;
  }
  if (size)
    buf[at < size ? at : size - 1] = '\0';
}

/* Whether name is part-NNNNN.svm, or its NAME.tmp-PID. */
static int stream_part(const char *name) {
  const char *t = strstr(name, ".tmp-");
  size_t len = t ? (size_t)(t - name) : strlen(name);
  if (t && !t[5])
    return 0;
  for (const char *d = t ? t + 5 : ""; *d; d++)
    if (!isdigit((unsigned char)*d))
      return 0;
  if (len != 14 || strncmp(name, "part-", 5) || strncmp(name + 10, ".svm", 4))
    return 0;
  for (int i = 5; i < 10; i++)
    if (!isdigit((unsigned char)name[i]))
      return 0;
  return 1;
}

int dw_ctrdata_claim_stream(const char *dir, const char *end, char *err,
                            size_t errlen) {
  char p[1100], other[300] = "";
  struct dirent *e;
  DIR *d;
  json_t *j = NULL;
  int rc, ours = 0;
  if ((rc = dw_ctrdata_mkdirs(dir, err, errlen)))
    return rc;
  snprintf(p, sizeof p, "%s/truth.json", dir);
  if ((j = json_load_file(p, 0, NULL))) {
    const char *stamp = json_string_value(json_object_get(j, "generator"));
    ours = (stamp && !strcmp(stamp, DW_CTRDATA_STAMP)) ||
           json_integer_value(
               json_object_get(json_object_get(j, "settings"), "drift")) == 1;
    json_decref(j);
  }
  if (!(d = opendir(dir))) {
    snprintf(err, errlen, "cannot read %s: %s", dir, strerror(errno));
    return CM_EIO;
  }
  while (!other[0] && (e = readdir(d))) {
    const char *n = e->d_name;
    if (strcmp(n, ".") && strcmp(n, "..") &&
        !(ours && (stream_part(n) || !strcmp(n, "truth.json") ||
                   (end && !strcmp(n, end)))))
      snprintf(other, sizeof other, "%s", n);
  }
  closedir(d);
  if (other[0]) {
    snprintf(err, errlen,
             "the directory %s holds %s, which psd did not write: a stream is "
             "written into a new or empty directory, or one holding psd's "
             "stream (part-NNNNN.svm beside its truth.json); psd writes "
             "nothing there",
             dir, other);
    return CM_EEXIST;
  }
  if (ours)
    return 0;
  /* A new directory: the mark goes down before the first part, so that a
   * run cut short can be run again there. */
  j = json_pack("{s:s, s:[]}", "generator", DW_CTRDATA_STAMP, "parts");
  return dw_ctrgen_put_truth(dir, j, err, errlen);
}
