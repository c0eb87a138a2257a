// SPDX-License-Identifier: Apache-2.0
// Building transfer plans: the Plan type lives with the paths that execute it (transport/plan.h);
// its builders (PairTensors, AddBlocks, AddRange) and the layout transforms (plan/layout.h) are
// plan/'s, used by the engine once per call after every check passed.
#ifndef KVBLOCKS_RUNTIME_PLAN_PLAN_H_
#define KVBLOCKS_RUNTIME_PLAN_PLAN_H_

#include "transport/plan.h"

#endif  // KVBLOCKS_RUNTIME_PLAN_PLAN_H_
