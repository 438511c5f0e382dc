/* A table's rows as the shards first make them, for psd.export
 * (psd/export.py): the rows an export lacks are those never stored, and
 * their value is the table's initial row. Both halves are common/'s, the
 * code the shard and the serving task run, never a copy:
 *
 *   table_init(table, path=None, text=None) -> (seed, init, init_scale)
 *       the spec's job.seed and the table's initializer as the shards
 *       resolve it (cm_table_conf_for: its job.tables entry, completed from
 *       job.table_defaults, else job.table_defaults); the spec is a file
 *       (path: str, bytes or os.PathLike) or its JSON text
 *   init_rows(table, seed, init, init_scale, ids, out)
 *       fills out (float32, C-contiguous, len(ids) x dim floats) with each
 *       id's initial row (cm_table_init_row); ids are 8-byte integers
 *
 * A spec with mistakes raises ValueError with every mistake (each naming
 * the file and the JSON path), a missing file FileNotFoundError; a bad
 * buffer ValueError naming the table. No numpy C API: buffers are taken
 * with the buffer protocol. */
#include "ext.h"

#include <string.h>

#include "err.h"
#include "init.h"
#include "spec.h"
#include "tabconf.h"

PyObject *pyx_table_init(PyObject *mod, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"table", "path", "text", NULL};
  const char *table, *text = NULL;
  Py_ssize_t len = 0;
  PyObject *path = NULL, *ret = NULL;
  struct cm_spec *spec = NULL;
  struct cm_table_conf conf;
  char err[8192] = "";
  int rc;

  (void)mod;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O&z#", kwlist, &table,
                                   PyUnicode_FSConverter, &path, &text, &len))
    return NULL;
  if (!path == !text) {
    PyErr_SetString(PyExc_TypeError,
                    "table_init: give the spec's path or its text, one");
    goto out;
  }
  Py_BEGIN_ALLOW_THREADS;
  rc = path ? cm_spec_load(PyBytes_AS_STRING(path), &spec, err, sizeof err)
            : cm_spec_parse(text, (size_t)len, "spec", &spec, err, sizeof err);
  Py_END_ALLOW_THREADS;
  if (rc < 0) {
    PyErr_SetString(rc == CM_ENOENT ? PyExc_FileNotFoundError
                    : rc == CM_EIO  ? PyExc_OSError
                                    : PyExc_ValueError,
                    err[0] ? err : cm_strerror(rc));
    goto out;
  }
  cm_table_conf_for(spec->job.tables, spec->job.ntables,
                    &spec->job.table_defaults, table, 1, &conf);
  ret = Py_BuildValue("(Ksd)", (unsigned long long)spec->job.seed,
                      conf.init == CM_TABLE_INIT_UNIFORM ? "uniform" : "zeros",
                      (double)conf.init_scale);
out:
  if (spec)
    cm_spec_free(spec);
  Py_XDECREF(path);
  return ret;
}

PyObject *pyx_init_rows(PyObject *mod, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"table", "seed", "init", "init_scale",
                           "ids",   "out",  NULL};
  const char *table, *init;
  unsigned long long seed;
  double scale;
  Py_buffer ids = {0}, out = {0};
  PyObject *ret = NULL;
  struct cm_table_conf conf;

  (void)mod;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sKsdy*w*", kwlist, &table, &seed,
                                   &init, &scale, &ids, &out))
    return NULL;
  cm_table_conf_defaults(&conf);
  if (strlen(table) > CM_TABLE_MAX_NAME) {
    PyErr_Format(PyExc_ValueError,
                 "table '%.40s...': a name of %zu bytes; "
                 "at most %d",
                 table, strlen(table), CM_TABLE_MAX_NAME);
    goto out;
  }
  if (strcmp(init, "uniform") && strcmp(init, "zeros")) {
    PyErr_Format(PyExc_ValueError,
                 "table '%s': init '%s'; expected 'uniform' or 'zeros'", table,
                 init);
    goto out;
  }
  Py_ssize_t n = ids.len / 8;
  if (ids.itemsize != 8 || !PyBuffer_IsContiguous(&ids, 'C')) {
    PyErr_Format(PyExc_ValueError,
                 "table '%s': ids must be a C-contiguous array of 8-byte "
                 "integers (np.uint64)",
                 table);
    goto out;
  }
  if (!PyBuffer_IsContiguous(&out, 'C') || out.itemsize != 4 ||
      (out.format && strcmp(out.format, "f")) || n == 0 || out.len % (n * 4) ||
      out.len / (n * 4) < 1 || out.len / (n * 4) > CM_TABLE_MAX_DIM) {
    if (n == 0 && out.len == 0) { /* nothing asked, nothing to fill */
      ret = Py_NewRef(Py_None);
      goto out;
    }
    PyErr_Format(PyExc_ValueError,
                 "table '%s': out must be a writable C-contiguous float32 "
                 "array of %zd x dim floats (dim 1..%d), not %zd bytes",
                 table, n, CM_TABLE_MAX_DIM, out.len);
    goto out;
  }
  snprintf(conf.name, sizeof conf.name, "%s", table);
  conf.dim = (uint32_t)(out.len / (n * 4));
  conf.init =
      strcmp(init, "uniform") ? CM_TABLE_INIT_ZEROS : CM_TABLE_INIT_UNIFORM;
  conf.init_scale = (float)scale;
  const uint64_t *id = ids.buf;
  float *row = out.buf;
  Py_BEGIN_ALLOW_THREADS;
  for (Py_ssize_t i = 0; i < n; i++)
    cm_table_init_row(&conf, (uint64_t)seed, id[i], row + (size_t)i * conf.dim);
  Py_END_ALLOW_THREADS;
  ret = Py_NewRef(Py_None);
out:
  PyBuffer_Release(&ids);
  PyBuffer_Release(&out);
  return ret;
}
