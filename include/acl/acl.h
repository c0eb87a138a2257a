// SPDX-License-Identifier: Apache-2.0
// kvblocks: a host stand-in for the Ascend runtime's acl/acl.h, for CANN's LLM-DataDist and hixl
// programs on machines without an accelerator. "Device" memory is host memory, as
// CachePlacement::kDevice and hixl's MEM_DEVICE are in kvblocks. Header-only: nothing to link.
// What exists and what each call does: docs/compat.md, "Ascend runtime stand-in (acl/acl.h)".
#ifndef KVBLOCKS_ACL_ACL_H_
#define KVBLOCKS_ACL_ACL_H_

#include "acl/acl_base.h"
#include "acl/acl_rt.h"

#endif  // KVBLOCKS_ACL_ACL_H_
