/* The error table's string side: generated from CM_ERRNO_MAP so the codes and
 * their messages can never drift apart. */
#include "err.h"

const char *cm_strerror(int rc) {
  switch (rc) {
  case 0:
    return "success";
#define CM__ERR_STR(name, val, msg)                                            \
  case val:                                                                    \
    return msg;
    CM_ERRNO_MAP(CM__ERR_STR)
#undef CM__ERR_STR
  }
  return "unknown error";
}

const char *cm_err_name(int rc) {
  switch (rc) {
  case 0:
    return "OK";
#define CM__ERR_NAME(name, val, msg)                                           \
  case val:                                                                    \
    return #name;
    CM_ERRNO_MAP(CM__ERR_NAME)
#undef CM__ERR_NAME
  }
  return "EUNKNOWN";
}
