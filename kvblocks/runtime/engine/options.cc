// SPDX-License-Identifier: Apache-2.0
#include "engine/options.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "common/util.h"
#include "engine/option_keys.h"  // kKnownOptions, generated from the headers
#include "kvblocks/ext_types.h"

namespace kvblocks {

namespace {
std::string Lower(std::string s) {
  for (char &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

size_t EditDistance(const std::string &a, const std::string &b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

bool OursToCheck(const std::string &key) { return key.rfind("llm.", 0) == 0 || key.rfind("kvblocks.", 0) == 0; }
}  // namespace

bool KnownOption(const std::string &key) {
  for (const char *k : kKnownOptions)
    if (key == k) return true;
  return false;
}

std::string ClosestOption(const std::string &key) {
  const std::string low = Lower(key);
  std::string best;
  size_t best_d = std::max<size_t>(3, key.size() / 4) + 1;  // farther than this is no typo
  for (const char *k : kKnownOptions) {
    const size_t d = EditDistance(low, Lower(k));
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  return best;
}

void WarnUnknownOptions(const std::map<llm_datadist::AscendString, llm_datadist::AscendString> &options) {
  for (const auto &kv : options) {
    const std::string key = kv.first.GetString();
    if (!OursToCheck(key) || KnownOption(key)) continue;
    const std::string near = ClosestOption(key);
    if (near.empty())
      LogWarn("unknown option %s ignored", key.c_str());
    else
      LogWarn("unknown option %s ignored: did you mean %s?", key.c_str(), near.c_str());
  }
}

std::map<std::string, std::string> OptionsCopy(
    const std::map<llm_datadist::AscendString, llm_datadist::AscendString> &options) {
  std::map<std::string, std::string> out;
  for (const auto &kv : options) out[kv.first.GetString()] = kv.second.GetString();
  return out;
}

void WarnIgnoredOptions(const std::map<std::string, std::string> &first,
                        const std::map<llm_datadist::AscendString, llm_datadist::AscendString> &again) {
  const std::map<std::string, std::string> now = OptionsCopy(again);
  std::string ignored;
  for (const auto &kv : now) {
    auto it = first.find(kv.first);
    if (it != first.end() && it->second == kv.second) continue;
    // A secret's value is never logged, only that it changed.
    const bool secret = kv.first == OPTION_AUTH_TOKEN;
    ignored += (ignored.empty() ? "" : ", ") + kv.first + "=" + (secret ? "(changed)" : kv.second);
  }
  for (const auto &kv : first)
    if (now.count(kv.first) == 0) ignored += (ignored.empty() ? "" : ", ") + kv.first + " (now absent)";
  if (!ignored.empty())
    LogWarn("initialize: the engine is initialized already, so these options were ignored: %s (finalize first to "
            "change them)", ignored.c_str());
}

}  // namespace kvblocks
