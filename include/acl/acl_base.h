// SPDX-License-Identifier: Apache-2.0
// kvblocks: a host stand-in for the Ascend runtime's acl/acl_base.h — the aclError type and the
// error codes (same names and values as CANN). Header-only; see acl/acl_rt.h and docs/compat.md.
#ifndef KVBLOCKS_ACL_ACL_BASE_H_
#define KVBLOCKS_ACL_ACL_BASE_H_

#include <stddef.h>
#include <stdint.h>

#ifndef ACL_FUNC_VISIBILITY
#define ACL_FUNC_VISIBILITY
#endif

typedef int aclError;
typedef void *aclrtStream;
typedef void *aclrtContext;

// General (acl_base.h) codes.
static const int ACL_SUCCESS = 0;
static const int ACL_ERROR_NONE = 0;
static const int ACL_ERROR_INVALID_PARAM = 100000;
static const int ACL_ERROR_UNINITIALIZE = 100001;
static const int ACL_ERROR_REPEAT_INITIALIZE = 100002;
static const int ACL_ERROR_REPEAT_FINALIZE = 100037;
static const int ACL_ERROR_BAD_ALLOC = 200000;
static const int ACL_ERROR_API_NOT_SUPPORT = 200001;
static const int ACL_ERROR_INVALID_DEVICE = 200002;
static const int ACL_ERROR_FEATURE_UNSUPPORTED = 200006;
static const int ACL_ERROR_INTERNAL_ERROR = 500000;
static const int ACL_ERROR_FAILURE = 500001;

// Runtime (error_codes/rt_error_codes.h) codes the stand-in returns.
static const int ACL_ERROR_RT_PARAM_INVALID = 107000;
static const int ACL_ERROR_RT_INVALID_DEVICEID = 107001;
static const int ACL_ERROR_RT_CONTEXT_NULL = 107002;
static const int ACL_ERROR_RT_MEMORY_ALLOCATION = 207001;

#endif  // KVBLOCKS_ACL_ACL_BASE_H_
