// SPDX-License-Identifier: Apache-2.0
// The per-thread "last error": what failed, which argument, which index, which limit. Every public
// entry point clears it; the code that decides a failure status records why with Fail().
#ifndef KVBLOCKS_RUNTIME_COMMON_ERROR_H_
#define KVBLOCKS_RUNTIME_COMMON_ERROR_H_

#include "kvblocks/ext_types.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

void ClearLastError();
// Records the reason (printf format) unless one is already recorded, and returns `st`.
// The first reason wins: it is the most specific one.
llm_datadist::Status Fail(llm_datadist::Status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Replaces the recorded reason: for a caller that knows more than the code below it (a transfer's
// deadline and its option, where a socket only saw "no answer in time").
llm_datadist::Status Restate(llm_datadist::Status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Why a link failed, as a code (LinkFailureReason), next to the message; first one wins, as Fail.
// Cleared with the message.
void NoteLinkReason(LinkFailureReason why);
LinkFailureReason LastLinkReason();
const char *LinkReasonName(LinkFailureReason why);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_COMMON_ERROR_H_
