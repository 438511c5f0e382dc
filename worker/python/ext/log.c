/* psd.set_log's C half (ext.h): libpsclient's log lines (psc_set_log)
 * handed to a Python callable. The lines come from whatever thread logs: a
 * call's own thread, which released the GIL for the call, or a client's
 * heartbeat thread, which Python does not know; each takes the GIL for the
 * callable (PyGILState_Ensure). The C sink is installed while a callable is
 * set; the callable itself is swapped under the GIL. */
#include "ext.h"

/* The callable lines go to, or NULL (stderr). Guarded by the GIL. */
static PyObject *log_callable;

/* Whether the interpreter is going away (no GIL to take any more). */
static int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

/* psc_set_log's callback: log_callable(level, line), with the GIL. */
static void to_python(void *arg, int level, const char *line) {
  (void)arg;
  if (finalizing())
    return;
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *cb = log_callable;
  if (cb) {
    Py_INCREF(cb);
    PyObject *r = PyObject_CallFunction(cb, "is", level, line);
    if (r)
      Py_DECREF(r);
    else
      PyErr_WriteUnraisable(cb);
    Py_DECREF(cb);
  }
  PyGILState_Release(g);
}

PyObject *pyx_set_log(PyObject *mod, PyObject *args) {
  int level, rc;
  PyObject *cb, *old = log_callable;
  (void)mod;
  if (!PyArg_ParseTuple(args, "iO", &level, &cb))
    return NULL;
  if (cb != Py_None && !PyCallable_Check(cb)) {
    PyErr_Format(PyExc_TypeError,
                 "set_log: the callback is a %s; expected a callable(level, "
                 "line) or None",
                 Py_TYPE(cb)->tp_name);
    return NULL;
  }
  if (level > PSC_LOG_OFF) {
    PyErr_Format(PyExc_ValueError, "set_log: level %d; expected 0..%d", level,
                 PSC_LOG_OFF);
    return NULL;
  }
  Py_XINCREF(cb == Py_None ? NULL : cb);
  log_callable = cb == Py_None ? NULL : cb;
  /* Without the GIL: a line being logged holds the library's log lock
   * while it waits for the GIL in to_python. */
  Py_BEGIN_ALLOW_THREADS rc =
      psc_set_log(level, log_callable ? to_python : NULL, NULL);
  Py_END_ALLOW_THREADS Py_XDECREF(old);
  if (rc)
    return pyx_raise_text(psc_strerror(rc), rc, 0);
  Py_RETURN_NONE;
}
