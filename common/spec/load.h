/* Internal to common/spec: reading a spec file and parsing a text as if it
 * were that file (its relative paths made relative to its directory). Both
 * live in spec.c, behind cm_spec_load; slurm.c shares them, since the spec
 * it derives holds the job file's settings. */
#ifndef CM_SPEC_LOAD_H
#define CM_SPEC_LOAD_H

#include <stddef.h>

#include <jansson.h>

#include "spec.h"

/* Reads the file at path whole into *text (caller frees with free(); not
 * NUL-terminated) and *len. A missing or unreadable file is reported in err
 * as "path: why", returning CM_ENOENT or CM_EIO (CM_ESPEC when it is larger
 * than any spec). */
int cm__spec_read(const char *path, char **text, size_t *len, char *err,
                  size_t errlen);

/* cm_spec_parse with `source` in messages, then, when path is not NULL,
 * every relative path the spec names made relative to path's directory as
 * cm_spec_load does. Returns 0 or what those return. */
int cm__spec_parse_at(const char *json, size_t len, const char *source,
                      const char *path, struct cm_spec **out, char *err,
                      size_t errlen);

/* The last step of a spec derived from an engine's environment (slurm.c,
 * k8s.c): dumps the document doc (indented), parses it with
 * cm__spec_parse_at (source in messages, path for relative paths), and on
 * success hands its text to *json when json is not NULL (free with
 * free()). Returns 0, CM_ENOMEM, or what the parse returns. */
int cm__spec_from_doc(json_t *doc, const char *source, const char *path,
                      struct cm_spec **out, char **json, char *err,
                      size_t errlen);

/* A derived spec document: {"cluster": {"ps": ps, "worker": worker},
 * "task": {"type": type, "index": index}, and file's "job" and "auth"}.
 * Takes ps and worker (arrays of "host:port" strings; NULL: out of memory
 * already). Returns a new reference, or NULL when out of memory. */
json_t *cm__spec_doc(json_t *ps, json_t *worker, const char *type, int index,
                     json_t *file);

/* NAME's value in envp (NULL-terminated "NAME=VALUE" strings), or NULL. */
const char *cm__env_get(char *const *envp, const char *name);

#endif
