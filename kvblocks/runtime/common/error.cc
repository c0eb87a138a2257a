// SPDX-License-Identifier: Apache-2.0
#include "common/error.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "kvblocks/error.h"

namespace kvblocks {
namespace {
thread_local char g_last[512];
thread_local LinkFailureReason g_link_reason = LinkFailureReason::kNone;
}  // namespace

void ClearLastError() {
  g_last[0] = '\0';
  g_link_reason = LinkFailureReason::kNone;
}

llm_datadist::Status Restate(llm_datadist::Status st, const char *fmt, ...) {
  char buf[sizeof(g_last)];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  memcpy(g_last, buf, sizeof(g_last));
  return st;
}

void NoteLinkReason(LinkFailureReason why) {
  if (g_link_reason == LinkFailureReason::kNone) g_link_reason = why;
}

LinkFailureReason LastLinkReason() { return g_link_reason; }

const char *LinkReasonName(LinkFailureReason why) {
  switch (why) {
    case LinkFailureReason::kNone: return "none";
    case LinkFailureReason::kRefused: return "refused";
    case LinkFailureReason::kUnreachable: return "unreachable";
    case LinkFailureReason::kTimedOut: return "timed_out";
    case LinkFailureReason::kAuthRefused: return "auth_refused";
    case LinkFailureReason::kWrongClusterId: return "wrong_cluster_id";
    case LinkFailureReason::kVersionMismatch: return "version_mismatch";
    case LinkFailureReason::kLimitExceeded: return "limit_exceeded";
    case LinkFailureReason::kAlreadyLinked: return "already_linked";
    default: return "other";
  }
}

llm_datadist::Status Fail(llm_datadist::Status st, const char *fmt, ...) {
  if (g_last[0] == '\0') {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last, sizeof(g_last), fmt, ap);
    va_end(ap);
  }
  return st;
}

const char *LastErrorMessage() noexcept { return g_last; }

}  // namespace kvblocks
