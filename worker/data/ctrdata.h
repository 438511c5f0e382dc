/* Whose data a click-through-rate data directory holds, and which files a
 * job reads there (docs/ctr.md, "Whose data"): the one rule dworker, and
 * psd-ctrgen (so the DLRM example, which runs it), follow, so that psd
 * never writes into a directory holding data it did not write.
 *
 * psd's generator marks what it writes: its truth.json carries
 * "generator": DW_CTRDATA_STAMP and "files", an object of the files it
 * wrote there with their sizes (null while they are being written: the
 * mark goes down before the first file). A directory is
 *   - new: missing or empty. Generation may write there.
 *   - psd's: its truth.json is marked, and every entry in it is truth.json,
 *     a file the mark lists (at its listed size), or a temporary file of
 *     psd's (NAME.tmp-PID of one of those). Generation may replace it. It
 *     is read when its truth.json's settings are the job's and both files
 *     are there at their sizes (then whatever else it holds too).
 *   - the user's: anything else. Never written. Read as it is when it holds
 *     a training and a held-out file of the format's names, the first of
 *     each list that is there:
 *       criteo  train.tsv train.tsv.gz train.txt train.txt.gz (Criteo
 *               Kaggle's names), and test.tsv test.tsv.gz test.txt
 *               test.txt.gz; both files' first lines must parse, labelled
 *               (Kaggle's own test.txt has no labels: refused);
 *       libsvm  train.svm and test.svm;
 *     else refused, the error naming the directory, every name looked for
 *     and what the directory holds. */
#ifndef DW_CTRDATA_H
#define DW_CTRDATA_H

#include <jansson.h>
#include <stddef.h>

#include "ctrgen.h"

/* truth.json's "generator": the mark of psd's generation. */
#define DW_CTRDATA_STAMP "psd-ctrgen"

/* Where a job's data comes from. */
enum dw_ctrdata_source {
  DW_CTRDATA_GENERATE = 0, /* new, or psd's of other settings: generate */
  DW_CTRDATA_PSD = 1,      /* psd's generation of the job's settings */
  DW_CTRDATA_USER = 2      /* the user's files, read as they are */
};

/* What a directory gives a job. */
struct dw_ctrdata {
  int source;                   /* enum dw_ctrdata_source */
  char train[1100];             /* the training file's path (GENERATE: the
                                   one generation writes) */
  char test[1100];              /* the held-out file's path */
  struct dw_ctrgen_truth truth; /* PSD: truth.json's scores; else NaN */
};

/* What dir gives a job of the Criteo format (criteo 1) or LIBSVM (0) whose
 * generation writes settings (taken: freed here) and the files named gen[0]
 * (training) and gen[1] (held-out). Returns 0 with *out filled; CM_EEXIST
 * (the user's directory without data psd reads: err names the directory,
 * the names looked for and what it holds); CM_EFORMAT (the user's Criteo
 * file's first line does not parse: err says where and why); CM_EIO (dir
 * cannot be read: err says why). */
int dw_ctrdata_find(const char *dir, int criteo, json_t *settings,
                    const char *const gen[2], struct dw_ctrdata *out, char *err,
                    size_t errlen);

/* Holds dir for this process while it finds its data and, when that says
 * so, generates them: creates dir (and the directories above it) when
 * missing, as the generation would, then takes an exclusive flock on the
 * directory itself, waiting (with an info line saying so) while another
 * process holds it. The workers of one job that start together thus
 * generate once, the others reading psd's set after, and none scans a
 * directory while another writes into it. Writes nothing into dir.
 * Returns the lock's descriptor (>= 0; dw_ctrdata_unlock releases it, as
 * the process's end does), or CM_EIO with err naming the directory. */
int dw_ctrdata_lock(const char *dir, char *err, size_t errlen);

/* Releases dw_ctrdata_lock's lock; fd < 0 is ignored. */
void dw_ctrdata_unlock(int fd);

/* Before generation writes the files named gen[0] and gen[1] into dir:
 * creates dir (and the directories above it) when missing, checks that it
 * is new or psd's (else CM_EEXIST, err naming the directory and what it
 * holds that psd did not write: nothing is written), removes the files its
 * old mark lists that this generation does not write, and marks it (a
 * truth.json listing gen, sizes null). Returns 0, CM_EEXIST or CM_EIO. */
int dw_ctrdata_claim(const char *dir, const char *const gen[2], char *err,
                     size_t errlen);

/* Writes dir/truth.json: j (taken: freed here; NULL reads as out of
 * memory) with the mark added, "generator" and "files": gen[0] and gen[1]
 * with their sizes now. Returns 0, or CM_EIO with err naming the file. */
int dw_ctrdata_mark(const char *dir, json_t *j, const char *const gen[2],
                    char *err, size_t errlen);

/* Before psd-ctrgen --drift writes a stream's parts into dir: creates dir
 * when missing, and checks that it is new (empty), or psd's stream: a
 * truth.json marked as psd's (or holding a stream's settings, "drift": 1,
 * as psd wrote it before the mark) beside nothing but part-NNNNN.svm (or
 * its temporary NAME.tmp-PID) and end (the end marker's name, or NULL).
 * Else CM_EEXIST, err naming dir and the first entry psd did not write:
 * nothing is written. A new directory is marked (a truth.json of psd's
 * without parts) before the first part. Returns 0, CM_EEXIST or CM_EIO. */
int dw_ctrdata_claim_stream(const char *dir, const char *end, char *err,
                            size_t errlen);

/* mkdir -p: dir and the directories above it that are missing (0755).
 * Returns 0, or CM_EIO with err naming the one that could not be made. */
int dw_ctrdata_mkdirs(const char *dir, char *err, size_t errlen);

/* Writes path into buf for a result line's key=value: every byte that is
 * whitespace, '%', or not printable ASCII as %XX (two hex digits), so the
 * value is one token. */
void dw_ctrdata_token(const char *path, char *buf, size_t size);

#endif
