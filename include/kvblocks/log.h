// SPDX-License-Identifier: Apache-2.0
// Where the runtime's log lines go. By default to stderr as "[kvblocks WARN pid=N] message", the
// level set by KVBLOCKS_LOG_LEVEL (0 silent, 1 warnings (default), 2 also info). A callback takes
// them instead; the Python package installs one that feeds logging.getLogger("kvblocks").
#ifndef KVBLOCKS_LOG_H_
#define KVBLOCKS_LOG_H_

#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

constexpr int kLogWarn = 1;
constexpr int kLogInfo = 2;

// Called on the thread that logs, often a runtime thread holding runtime locks: it must return
// promptly and must not call into kvblocks. `message` is valid during the call only.
using LogCallback = void (*)(void *user, int level, const char *message);

// Sends every log line KVBLOCKS_LOG_LEVEL lets through to `cb` instead of stderr; nullptr restores
// stderr. When this returns, no call to the previous callback is in progress.
KVBLOCKS_API void SetLogCallback(LogCallback cb, void *user) noexcept;

}  // namespace kvblocks

#endif  // KVBLOCKS_LOG_H_
