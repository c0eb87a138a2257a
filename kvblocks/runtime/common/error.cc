// SPDX-License-Identifier: Apache-2.0
#include "common/error.h"

#include <cstdarg>
#include <cstdio>

#include "kvblocks/error.h"

namespace kvblocks {
namespace {
thread_local char g_last[512];
}  // namespace

void ClearLastError() { g_last[0] = '\0'; }

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
