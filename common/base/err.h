/* One error table for the whole project: every fallible function returns 0 or
 * a negative CM_E* code, and cm_strerror() names it (libuv's errno.h pattern).
 */
#ifndef CM_ERR_H
#define CM_ERR_H

#define CM_ERRNO_MAP(XX)                                                       \
  XX(EINVAL, -1, "invalid argument")                                           \
  XX(ENOMEM, -2, "out of memory")                                              \
  XX(EIO, -3, "input/output error")                                            \
  XX(ENOENT, -4, "no such file, variable or entry")                            \
  XX(ESPEC, -5, "invalid cluster spec")                                        \
  XX(EPROTO, -6, "malformed message")                                          \
  XX(ERPC, -7, "remote call failed")                                           \
  XX(ETIMEDOUT, -8, "deadline exceeded")                                       \
  XX(ESHAPE, -9, "shape mismatch")                                             \
  XX(EEXIST, -10, "already exists with different settings")                    \
  XX(ERANGE, -11, "out of range")                                              \
  XX(EADDRINUSE, -12, "address already in use")                                \
  XX(ENODEV, -13, "no usable device")                                          \
  XX(ECUDA, -14, "CUDA or cuBLAS call failed")                                 \
  XX(EFORMAT, -15, "bad file format")                                          \
  XX(ETRUNC, -16, "file truncated")                                            \
  XX(EUNAVAIL, -17, "service unavailable")                                     \
  XX(ESYS, -18, "system call failed")                                          \
  XX(ECANCELED, -19, "interrupted")

enum cm_errno {
#define CM__ERR_ENUM(name, val, msg) CM_##name = val,
  CM_ERRNO_MAP(CM__ERR_ENUM)
#undef CM__ERR_ENUM
      CM_OK = 0
};

/* Returns a static string describing rc (0 or a CM_E* code); never NULL. */
const char *cm_strerror(int rc);

/* Returns the symbolic name of rc, e.g. "ESHAPE"; never NULL. */
const char *cm_err_name(int rc);

#endif
