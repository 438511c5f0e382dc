/* Internal to common/spec: reading a spec file and parsing a text as if it
 * were that file (its relative paths made relative to its directory). Both
 * live in spec.c, behind cm_spec_load; resolve.c shares them, since the spec
 * an engine's environment gives holds the job file's settings. */
#ifndef CM_SPEC_LOAD_H
#define CM_SPEC_LOAD_H

#include <stddef.h>

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

#endif
