/* The public error codes (psd/client.h's PSC_ERRNO_MAP), tied at compile time
 * to the internal ones (common/base/err.h's CM_ERRNO_MAP, which holds their
 * words), so the codes a call can return and the codes the header names
 * cannot drift apart. */
#include "api_internal.h"

#include "err.h"

/* Each public code is the internal code of the same name... */
#define PSC_SAME_(name, value)                                                 \
  _Static_assert((int)PSC_##name == (int)CM_##name,                            \
                 "PSC_" #name " is not CM_" #name);
PSC_ERRNO_MAP(PSC_SAME_)
#undef PSC_SAME_

/* ...and no internal code is missing from the public map. */
#define PSC_ONE_(...) +1
_Static_assert(0 PSC_ERRNO_MAP(PSC_ONE_) == 0 CM_ERRNO_MAP(PSC_ONE_),
               "CM_ERRNO_MAP has a code PSC_ERRNO_MAP does not list");
#undef PSC_ONE_

const char *psc_strerror(int rc) { return cm_strerror(rc); }
