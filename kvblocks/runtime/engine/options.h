// SPDX-License-Identifier: Apache-2.0
// The option keys Initialize knows, and the warnings about the ones it does not (CANN ignores
// unknown keys, so kvblocks does too, but says so: a typo would otherwise go unnoticed).
#ifndef KVBLOCKS_RUNTIME_ENGINE_OPTIONS_H_
#define KVBLOCKS_RUNTIME_ENGINE_OPTIONS_H_

#include <map>
#include <string>

#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

// True for a key of the table in options.cc.
bool KnownOption(const std::string &key);
// The known key nearest to `key` (case first, then edit distance), or "" when none is close.
std::string ClosestOption(const std::string &key);
// Logs a warning for every llm.* / kvblocks.* key that is not known, naming the closest known one.
void WarnUnknownOptions(const std::map<llm_datadist::AscendString, llm_datadist::AscendString> &options);
// Logs a warning naming the options of a second Initialize that differ from the first's (they are
// ignored, as CANN ignores them: spec 3.2 step 1).
void WarnIgnoredOptions(const std::map<std::string, std::string> &first,
                        const std::map<llm_datadist::AscendString, llm_datadist::AscendString> &again);
std::map<std::string, std::string> OptionsCopy(
    const std::map<llm_datadist::AscendString, llm_datadist::AscendString> &options);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_ENGINE_OPTIONS_H_
