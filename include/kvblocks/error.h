// SPDX-License-Identifier: Apache-2.0
// Why the last kvblocks call on this thread failed, in words: which argument, which index, which
// limit (for example "src_blocks[3]=70 is out of range for remote cache 5 (64 blocks)").
#ifndef KVBLOCKS_ERROR_H_
#define KVBLOCKS_ERROR_H_

#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

// The reason recorded by the last failed LlmDataDist call on the calling thread; "" when the last
// call succeeded or gave no reason. Valid until the next call on this thread.
KVBLOCKS_API const char *LastErrorMessage() noexcept;

}  // namespace kvblocks

#endif  // KVBLOCKS_ERROR_H_
