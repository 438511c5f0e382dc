/* Internal to common/spec: the frame every cluster resolver shares, the
 * steps that turn an engine's environment into a spec (--cluster slurm,
 * k8s, tf_config). The frame reads the job file FILE (its "job" and
 * "auth"), reads the environment, lays out one spec document (cluster,
 * task, FILE's settings) and checks it as cm_spec_parse checks any file,
 * reporting every mistake at once: the environment's by its variable, the
 * file's by its JSON path. An engine (slurm.c, k8s.c) supplies only what is
 * its own, in a struct cm__resolver: which keys its file may hold, which
 * variables it reads, and where each task's address comes from. */
#ifndef CM_SPEC_RESOLVE_H
#define CM_SPEC_RESOLVE_H

#include <stddef.h>

#include <jansson.h>

#include "errs.h"
#include "spec.h"

/* How a derived spec's text is written (indented, keys in order). */
#define CM__SPEC_DUMP_FLAGS                                                    \
  (JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(16))

/* What one engine supplies. ctx, given to each step, is the engine's own
 * state (its layout), owned by the engine's entry point, which frees what
 * the steps left in it once cm__resolve returns. */
struct cm__resolver {
  const char *word; /* the --cluster word ("slurm"), the spec's source
                       in messages when there is no FILE */
  const char *env;  /* the one variable the environment is, naming it in
                       the environment's mistakes and in the spec's source
                       ("TF_CONFIG with FILE"); NULL: each mistake names
                       its own variable */
  /* Checks the job file's JSON value root (whatever it is): reports every
   * mistake, naming `word` where it helps; takes the engine's own settings
   * into ctx and deletes them from root. Returns 0, or -1 when root is not
   * an object (reported; the frame then drops it). */
  int (*check_file)(struct cm__errs *e, json_t *root, const char *word,
                    void *ctx);
  /* Reads the environment envp (never NULL) into ctx, reporting every
   * mistake. Returns 0, or -1 when it has no layout to lay out (reported). */
  int (*read_env)(struct cm__errs *e, char *const *envp, void *ctx);
  /* The spec document from ctx and the file's settings (cm__spec_doc
   * makes one). Returns a new reference, or NULL when out of memory. */
  json_t *(*make_doc)(void *ctx, json_t *settings);
  /* The spec's text for the caller's *json once parsed (free with free());
   * NULL: the document's own text. Returns NULL when out of memory. */
  char *(*text)(const struct cm_spec *spec, json_t *settings);
};

/* The frame: the spec from the job file `file` (NULL: every job setting
 * takes its default) and the environment envp (NULL: this process's), with
 * r's steps. On success stores the spec in *out (free with cm_spec_free)
 * and, when json is not NULL, its text in *json (free with free()). Returns
 * 0, or CM_ESPEC (CM_ENOENT, CM_EIO for an unreadable FILE; CM_ENOMEM) with
 * every mistake in err, one per line. */
int cm__resolve(const struct cm__resolver *r, void *ctx, const char *file,
                char *const *envp, struct cm_spec **out, char **json, char *err,
                size_t errlen);

/* A derived spec document: {"cluster": {"ps": ps, "worker": worker},
 * "task": {"type": type, "index": index} (none when type is NULL), and
 * file's "job" and "auth"}. Takes ps and worker (arrays of "host:port"
 * strings; NULL: out of memory already). Returns a new reference, or NULL
 * when out of memory. */
json_t *cm__spec_doc(json_t *ps, json_t *worker, const char *type, int index,
                     json_t *file);

/* Copies file's "job" and "auth", where it has them, into doc. Returns 0 or
 * -1 when out of memory. */
int cm__spec_settings(json_t *doc, json_t *file);

/* Appends the address printf formats to the array *arr; when out of memory
 * frees it and sets *arr to NULL, where later calls do nothing, as
 * cm__spec_doc expects. */
void cm__spec_add(json_t **arr, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* NAME's value in envp (NULL-terminated "NAME=VALUE" strings), or NULL. */
const char *cm__env_get(char *const *envp, const char *name);

/* Variable name as an integer in [min, max] into *dst, when set. Returns 1
 * when set and valid, 0 when unset, -1 after reporting
 * "NAME=VALUE: expected an integer in MIN..MAX" (VALUE quoted when quote is
 * set, as Slurm's messages have it). */
int cm__env_int(struct cm__errs *e, char *const *envp, const char *name,
                long long min, long long max, int quote, int *dst);

#endif
