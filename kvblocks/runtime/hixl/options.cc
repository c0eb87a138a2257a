// SPDX-License-Identifier: Apache-2.0
#include "hixl/options.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "common/error.h"
#include "common/util.h"

namespace kvblocks {
namespace hixlrt {

namespace {

using hixl::PARAM_INVALID;
using hixl::SUCCESS;

// ---------------------------------------------------------------- a small JSON reader
// Values the config needs: objects (flattened to dotted keys), arrays of strings, strings,
// numbers, booleans and null. Depth and size are bounded by the option string itself.
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray } kind = kNull;
  bool b = false;
  double num = 0;
  std::string str;  // kString; kNumber keeps its text too
  std::vector<std::string> items;  // kArray of strings
};

class JsonReader {
 public:
  explicit JsonReader(const std::string &s) : s_(s) {}
  // Flattens the top-level object into `out` ("a.b" for nested objects).
  bool ReadObject(const std::string &prefix, std::map<std::string, Json> *out, int depth = 0) {
    if (depth > 8 || !Eat('{')) return false;
    if (Eat('}')) return true;
    for (;;) {
      std::string key;
      if (!ReadString(&key) || !Eat(':')) return false;
      const std::string full = prefix.empty() ? key : prefix + "." + key;
      Skip();
      if (Peek() == '{') {
        if (!ReadObject(full, out, depth + 1)) return false;
      } else {
        Json v;
        if (!ReadValue(&v)) return false;
        (*out)[full] = v;
      }
      if (Eat('}')) return true;
      if (!Eat(',')) return false;
    }
  }
  bool AtEnd() {
    Skip();
    return i_ == s_.size();
  }

 private:
  void Skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  char Peek() { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool Eat(char c) {
    Skip();
    if (Peek() != c) return false;
    ++i_;
    return true;
  }
  bool Word(const char *w) {
    const std::string ws(w);
    if (s_.compare(i_, ws.size(), ws) != 0) return false;
    i_ += ws.size();
    return true;
  }
  bool ReadString(std::string *out) {
    if (!Eat('"')) return false;
    out->clear();
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') {
        if (++i_ >= s_.size()) return false;
        const char e = s_[i_];
        if (e == 'u') {
          if (i_ + 4 >= s_.size()) return false;
          out->push_back('?');  // config values are ASCII; the code point itself does not matter
          i_ += 4;
        } else {
          out->push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e);
        }
      } else {
        out->push_back(s_[i_]);
      }
      ++i_;
    }
    if (i_ >= s_.size()) return false;
    ++i_;
    return true;
  }
  bool ReadValue(Json *v) {
    Skip();
    const char c = Peek();
    if (c == '"') {
      v->kind = Json::kString;
      return ReadString(&v->str);
    }
    if (c == '[') {
      ++i_;
      v->kind = Json::kArray;
      if (Eat(']')) return true;
      for (;;) {
        std::string item;
        if (!ReadString(&item)) return false;
        v->items.push_back(item);
        if (Eat(']')) return true;
        if (!Eat(',')) return false;
      }
    }
    if (Word("true") || Word("false")) {
      v->kind = Json::kBool;
      v->b = s_[i_ - 1] == 'e' && s_[i_ - 2] == 'u';
      return true;
    }
    if (Word("null")) return true;
    const char *begin = s_.c_str() + i_;
    char *end = nullptr;
    v->num = strtod(begin, &end);
    if (end == begin) return false;
    v->kind = Json::kNumber;
    v->str.assign(begin, static_cast<size_t>(end - begin));
    i_ += static_cast<size_t>(end - begin);
    return true;
  }

  const std::string &s_;
  size_t i_ = 0;
};

// ---------------------------------------------------------------- GlobalResourceConfig
hixl::Status Bad(const char *key, const char *why) {
  return Fail(PARAM_INVALID, "GlobalResourceConfig: %s %s", key, why);
}

// An integer field given as a JSON number or a digit string, within [lo, hi].
bool IntIn(const Json &v, int64_t lo, int64_t hi, int64_t *out) {
  uint64_t u;
  if (v.kind == Json::kString || v.kind == Json::kNumber) {
    if (!ParseUint(v.str, 1ULL << 62, &u)) return false;
    if (static_cast<int64_t>(u) < lo || static_cast<int64_t>(u) > hi) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  return false;
}

bool Waterline(const Json &v, double *out) {
  double d;
  if (v.kind == Json::kNumber) {
    d = v.num;
  } else if (v.kind == Json::kString && !v.str.empty()) {
    char *end = nullptr;
    d = strtod(v.str.c_str(), &end);
    if (*end != '\0') return false;
  } else {
    return false;
  }
  if (!(d > 0 && d < 1)) return false;
  *out = d;
  return true;
}

bool ProtocolItem(const std::string &s) {
  const size_t c = s.find(':');
  return c != std::string::npos && c > 0 && c + 1 < s.size();
}

hixl::Status CheckRangeFields(const std::map<std::string, Json> &cfg, HixlOptions *out) {
  struct Field {
    const char *key;
    int64_t lo, hi;
  };
  static const Field kFields[] = {
      {"connect_pool.thread_num", 1, 64},
      {"connect_pool.task_queue_capacity", 1, 65535},
      {"channel_pool.max_channel", 1, 512},
      {"comm_resource_config.listen_port", 1, 65535},
      {"comm_resource_config.max_active_channels", 1, INT32_MAX},
      {"comm_resource_config.qos", 0, 7},
      {"fabric_memory.max_capacity", 1, 1024},
      {"fabric_memory.start_address", 0, 1024},
      {"fabric_memory.task_stream_num", 1, 8},
  };
  for (const Field &f : kFields) {
    auto it = cfg.find(f.key);
    if (it == cfg.end()) continue;
    int64_t v;
    if (!IntIn(it->second, f.lo, f.hi, &v)) return Bad(f.key, "is not an integer in its range");
    if (f.key == kFields[0].key) out->connect_threads = static_cast<uint32_t>(v);
    if (f.key == kFields[1].key) out->connect_queue_capacity = static_cast<uint32_t>(v);
  }
  return SUCCESS;
}

hixl::Status CheckOtherFields(const std::map<std::string, Json> &cfg, bool have_local_comm_res) {
  auto hi = cfg.find("channel_pool.high_waterline"), lo = cfg.find("channel_pool.low_waterline");
  if ((hi == cfg.end()) != (lo == cfg.end())) return Bad("channel_pool.high_waterline/low_waterline", "need each other");
  if (hi != cfg.end()) {
    double h, l;
    if (!Waterline(hi->second, &h) || !Waterline(lo->second, &l) || !(l < h))
      return Bad("channel_pool.high_waterline/low_waterline", "must lie in (0, 1) with low < high");
  }
  auto pd = cfg.find("comm_resource_config.protocol_desc");
  if (pd != cfg.end()) {
    const Json &v = pd->second;
    bool ok = v.kind == Json::kString ? ProtocolItem(v.str) : v.kind == Json::kArray;
    for (const std::string &s : v.items) ok = ok && ProtocolItem(s);
    if (!ok) return Bad("comm_resource_config.protocol_desc", "is not \"<proto>:<placement>\" or a list of them");
  }
  auto unfold = cfg.find("fabric_memory.enable_aicpu_unfold"), streams = cfg.find("fabric_memory.task_stream_num");
  if (unfold != cfg.end() && unfold->second.kind != Json::kBool) return Bad("fabric_memory.enable_aicpu_unfold", "is not a boolean");
  const bool unfolding = unfold == cfg.end() || unfold->second.b;
  int64_t n;
  if (unfolding && streams != cfg.end() && IntIn(streams->second, 1, 8, &n) && n != 1)
    return Bad("fabric_memory.task_stream_num", "must be 1 while enable_aicpu_unfold is true");
  auto path = cfg.find("local_comm_res_path");
  if (path != cfg.end()) {
    if (path->second.kind != Json::kString || path->second.str.empty()) return Bad("local_comm_res_path", "is not a path");
    struct stat sb;
    if (!have_local_comm_res && (stat(path->second.str.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode) ||
                                 sb.st_size < 1 || sb.st_size > (1 << 20)))
      return Bad("local_comm_res_path", "is not a regular file of 1 B to 1 MiB");
  }
  return SUCCESS;
}

hixl::Status ParseGlobalConfig(const std::string &text, bool have_local_comm_res, HixlOptions *out) {
  std::map<std::string, Json> cfg;
  JsonReader r(text);
  if (!r.ReadObject("", &cfg) || !r.AtEnd()) return Fail(PARAM_INVALID, "GlobalResourceConfig is not a JSON object");
  const hixl::Status st = CheckRangeFields(cfg, out);
  return st != SUCCESS ? st : CheckOtherFields(cfg, have_local_comm_res);
}

bool ValidJson(const std::string &text) {
  std::map<std::string, Json> cfg;
  JsonReader r(text);
  return r.ReadObject("", &cfg) && r.AtEnd();
}

// ---------------------------------------------------------------- the options
bool IsKey(const std::string &k, const char *name) { return k == name || k == std::string("adxl.") + name; }

hixl::Status CheckSimple(const std::string &k, const std::string &v, HixlOptions *out) {
  uint64_t n;
  if (k == hixl::OPTION_ENABLE_USE_FABRIC_MEM) {
    if (!v.empty() && v != "0" && v != "1") return Fail(PARAM_INVALID, "%s=\"%s\": use 0 or 1", k.c_str(), v.c_str());
  } else if (IsKey(k, hixl::OPTION_RDMA_TRAFFIC_CLASS)) {
    if (!ParseUint(v, 255, &n) || n % 4 != 0)
      return Fail(PARAM_INVALID, "%s=\"%s\": an integer in [0, 255], a multiple of 4", k.c_str(), v.c_str());
  } else if (IsKey(k, hixl::OPTION_RDMA_SERVICE_LEVEL)) {
    if (!ParseUint(v, 7, &n)) return Fail(PARAM_INVALID, "%s=\"%s\": an integer in [0, 7]", k.c_str(), v.c_str());
  } else if (IsKey(k, hixl::OPTION_BUFFER_POOL)) {
    const size_t c = v.find(':');
    uint64_t a, b;
    if (c == std::string::npos || !ParseUint(v.substr(0, c), UINT32_MAX, &a) || !ParseUint(v.substr(c + 1), UINT32_MAX, &b))
      return Fail(PARAM_INVALID, "%s=\"%s\": use <count>:<size_MB>", k.c_str(), v.c_str());
  } else if (k == hixl::OPTION_AUTO_CONNECT) {
    if (v != "0" && v != "1") return Fail(PARAM_INVALID, "%s=\"%s\": use 0 or 1", k.c_str(), v.c_str());
    out->auto_connect = v == "1";
  } else if (IsKey(k, hixl::OPTION_LOCAL_COMM_RES)) {
    if (!v.empty() && !ValidJson(v)) return Fail(PARAM_INVALID, "%s is not valid JSON", k.c_str());
  } else {
    return Fail(PARAM_INVALID, "unknown option \"%s\"", k.c_str());
  }
  return SUCCESS;
}

}  // namespace

hixl::Status ParseOptions(const std::map<hixl::AscendString, hixl::AscendString> &options, HixlOptions *out) {
  *out = HixlOptions();
  bool have_local_comm_res = false;
  for (const auto &kv : options) {
    const std::string k(kv.first.GetString(), kv.first.GetLength()), v(kv.second.GetString(), kv.second.GetLength());
    if (IsKey(k, hixl::OPTION_LOCAL_COMM_RES) && !v.empty()) have_local_comm_res = true;
    if (k == hixl::OPTION_GLOBAL_RESOURCE_CONFIG) continue;
    const hixl::Status st = CheckSimple(k, v, out);
    if (st != SUCCESS) return st;
  }
  auto fabric = options.find(hixl::OPTION_ENABLE_USE_FABRIC_MEM), pool = options.find(hixl::OPTION_BUFFER_POOL);
  if (fabric != options.end() && std::string(fabric->second.GetString()) == "1" && pool != options.end())
    return Fail(PARAM_INVALID, "%s=1 cannot be combined with %s", hixl::OPTION_ENABLE_USE_FABRIC_MEM,
                hixl::OPTION_BUFFER_POOL);
  auto g = options.find(hixl::OPTION_GLOBAL_RESOURCE_CONFIG);
  if (g == options.end()) return SUCCESS;
  return ParseGlobalConfig(std::string(g->second.GetString(), g->second.GetLength()), have_local_comm_res, out);
}

bool ParseEngineName(const std::string &name, std::string *ip, uint16_t *port) {
  std::string host, rest;
  if (!name.empty() && name[0] == '[') {
    const size_t close = name.find(']');
    if (close == std::string::npos) return false;
    host = name.substr(1, close - 1);
    rest = name.substr(close + 1);
    in6_addr a6;
    if (inet_pton(AF_INET6, host.c_str(), &a6) != 1) return false;
  } else {
    const size_t colon = name.find(':');
    host = name.substr(0, colon);
    rest = colon == std::string::npos ? "" : name.substr(colon);
    in_addr a4;
    if (inet_pton(AF_INET, host.c_str(), &a4) != 1) return false;
  }
  *ip = host;
  *port = 0;
  if (rest.empty()) return true;
  if (rest[0] != ':' || rest.size() == 1) return false;
  std::string p = rest.substr(1);
  const bool negative = p[0] == '-';
  if (negative) p = p.substr(1);
  uint64_t v;
  if (!ParseUint(p, 1ULL << 31, &v)) return false;
  if (!negative && v > 65535) return false;
  *port = negative ? 0 : static_cast<uint16_t>(v);
  return true;
}

}  // namespace hixlrt
}  // namespace kvblocks
