// SPDX-License-Identifier: Apache-2.0
// Parity harness for tests/test_parity.py: runs spec cases against the raw C++ API
// (llm_datadist/llm_datadist.h only) and prints one status line per case.
//
// Reads one command per line on stdin (the same little language test_parity.py interprets
// with the Python API); prints "<status>[ <rets>] <hash>" per command, where <hash> is FNV-1a
// over P's cache bytes then D's cache bytes, so the two APIs are compared on data too.
// Build: g++ parity_harness.cc $(python -m kvblocks --cflags --libs)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "llm_datadist/llm_datadist.h"

using namespace llm_datadist;

namespace {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a));
  socklen_t n = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr *>(&a), &n);
  close(fd);
  return ntohs(a.sin_port);
}

std::vector<std::string> Split(const std::string &s, char sep) {
  std::vector<std::string> out;
  if (s == "-") return out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

std::vector<uint64_t> Blocks(const std::string &s) {
  std::vector<uint64_t> v;
  for (const auto &x : Split(s, ',')) v.push_back(std::stoull(x));
  return v;
}

std::vector<int64_t> Shape(const std::string &s) {
  std::vector<int64_t> v;
  for (const auto &x : Split(s, ',')) v.push_back(std::stoll(x));
  return v;
}

std::map<AscendString, AscendString> Options(const std::string &s) {
  std::map<AscendString, AscendString> m;
  for (const auto &kv : Split(s, ';')) {
    const auto eq = kv.find('=');
    m[AscendString(kv.substr(0, eq).c_str())] = AscendString(kv.substr(eq + 1).c_str());
  }
  return m;
}

// A registered cache with its memory (tensor t, element i = base + t * n + i).
struct Mem {
  std::vector<std::vector<int32_t>> tensors;
  CacheDesc desc;
  int64_t id = -1;
};

struct Fixture {
  std::unique_ptr<LlmDataDist> p, d;
  int port = 0;
  Mem pm, dm, hm, lm;  // P's cache, D's cache, P's host-placed cache, P's late cache
  int64_t alloc_id = -1;
};

Status Register(LlmDataDist &dd, Mem &m, uint32_t nt, int64_t rows, int64_t cols, int32_t base, int32_t sign,
                CachePlacement placement) {
  m.tensors.assign(nt, std::vector<int32_t>(rows * cols));
  std::vector<uint64_t> addrs;
  for (uint32_t t = 0; t < nt; ++t) {
    for (int64_t i = 0; i < rows * cols; ++i)
      m.tensors[t][i] = sign * (base + static_cast<int32_t>(t * rows * cols + i));
    addrs.push_back(reinterpret_cast<uint64_t>(m.tensors[t].data()));
  }
  m.desc.placement = placement;
  m.desc.num_tensors = nt;
  m.desc.data_type = DT_INT32;
  m.desc.shape = {rows, cols};
  return dd.RegisterKvCache(m.desc, addrs, RegisterCfg{}, m.id);
}

uint64_t Hash(const Fixture &f) {
  uint64_t h = 1469598103934665603ULL;
  for (const Mem *m : {&f.pm, &f.dm})
    for (const auto &t : m->tensors) {
      const auto *b = reinterpret_cast<const uint8_t *>(t.data());
      for (size_t i = 0; i < t.size() * 4; ++i) h = (h ^ b[i]) * 1099511628211ULL;
    }
  return h;
}

// Cache reference: P, D, H, L, A, or #<id> (a bare id with a default CacheDesc).
Cache Ref(const Fixture &f, const std::string &r) {
  Cache c;
  const Mem *m = nullptr;
  if (r == "P") m = &f.pm;
  if (r == "D") m = &f.dm;
  if (r == "H") m = &f.hm;
  if (r == "L") m = &f.lm;
  if (m != nullptr) {
    c.cache_id = m->id;
    c.cache_desc = m->desc;
  } else if (r == "A") {
    c.cache_id = f.alloc_id;
  } else {
    c.cache_id = std::stoll(r.substr(1));
  }
  return c;
}

KvCacheExtParam Ext(std::istream &in) {
  KvCacheExtParam e;
  int sf, sl, df, dl, tnpl;
  in >> sf >> sl >> df >> dl >> tnpl;
  e.src_layer_range = {sf, sl};
  e.dst_layer_range = {df, dl};
  e.tensor_num_per_layer = static_cast<uint8_t>(tnpl);
  return e;
}

std::vector<ClusterInfo> Clusters(const Fixture &f, const std::string &spec) {
  // id:ip:port:nlocal:nremote, ';'-separated; port P = the fixture's, X = nothing listens.
  std::vector<ClusterInfo> out;
  for (const auto &c : Split(spec, ';')) {
    auto parts = Split(c, ':');
    ClusterInfo ci;
    ci.remote_cluster_id = std::stoull(parts[0]);
    const std::string ip = parts[1] == "_" ? "" : parts[1];
    const int port = parts[2] == "P" ? f.port : parts[2] == "X" ? FreePort() : std::stoi(parts[2]);
    for (int i = 0; i < std::stoi(parts[3]); ++i) {
      IpInfo l;
      l.ip = AscendString(ip.c_str());
      ci.local_ip_infos.push_back(l);
    }
    for (int i = 0; i < std::stoi(parts[4]); ++i) {
      IpInfo r;
      r.ip = AscendString(ip.c_str());
      r.port = static_cast<uint16_t>(port);
      ci.remote_ip_infos.push_back(r);
    }
    out.push_back(ci);
  }
  return out;
}

}  // namespace

int main() {
  Fixture f;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string op;
    in >> op;
    Status st = LLM_SUCCESS;
    std::string extra;
    if (op == "fixture") {
      // fixture roleP roleD link dTensors dCols pOpts dOpts
      int rp, rd, link, dnt, dcols;
      std::string popts, dopts;
      in >> rp >> rd >> link >> dnt >> dcols >> popts >> dopts;
      f.d.reset();
      f.p.reset();
      f = Fixture();
      f.port = FreePort();
      f.p.reset(new LlmDataDist(1, static_cast<LlmRole>(rp)));
      f.d.reset(new LlmDataDist(2, static_cast<LlmRole>(rd)));
      auto po = Options(popts), dop = Options(dopts);
      po[OPTION_DEVICE_ID] = "0";
      po[OPTION_LISTEN_IP_INFO] = AscendString(("127.0.0.1:" + std::to_string(f.port)).c_str());
      dop[OPTION_DEVICE_ID] = "0";
      st = f.p->Initialize(po);
      if (st == LLM_SUCCESS) st = f.d->Initialize(dop);
      if (st == LLM_SUCCESS) st = Register(*f.p, f.pm, 10, 4, 16, 1000000, 1, CachePlacement::kDevice);
      if (st == LLM_SUCCESS) st = Register(*f.p, f.hm, 10, 4, 16, 2000000, 1, CachePlacement::kHost);
      if (st == LLM_SUCCESS) st = Register(*f.d, f.dm, dnt, 4, dcols, 1, -1, CachePlacement::kDevice);
      if (st == LLM_SUCCESS && link) {
        std::vector<Status> rets;
        st = f.d->LinkLlmClusters(Clusters(f, "1:127.0.0.1:P:1:1"), rets);
      }
    } else if (op == "late_p") {
      st = Register(*f.p, f.lm, 10, 4, 16, 3000000, 1, CachePlacement::kDevice);
    } else if (op == "fresh_d") {
      f.d.reset(new LlmDataDist(2, LlmRole::kDecoder));
    } else if (op == "finalize_d") {
      f.d->Finalize();
    } else if (op == "finalize_p") {
      f.p->Finalize();
    } else if (op == "pull") {
      uint64_t cluster;
      std::string src, dst, sb, db;
      uint32_t batch;
      in >> cluster >> src >> batch >> dst >> sb >> db;
      CacheIndex idx{cluster, Ref(f, src).cache_id, batch, {}};
      st = f.d->PullKvBlocks(idx, Ref(f, dst), Blocks(sb), Blocks(db), Ext(in));
    } else if (op == "push") {
      uint64_t cluster;
      std::string src, dst, sb, db;
      uint32_t batch;
      in >> src >> cluster >> dst >> batch >> sb >> db;
      CacheIndex idx{cluster, Ref(f, dst).cache_id, batch, {}};
      st = f.p->PushKvBlocks(Ref(f, src), idx, Blocks(sb), Blocks(db), Ext(in));
    } else if (op == "pullcache") {
      uint64_t cluster;
      std::string src, dst;
      uint32_t sbatch, batch;
      int64_t size;
      in >> cluster >> src >> sbatch >> dst >> batch >> size;
      CacheIndex idx{cluster, Ref(f, src).cache_id, sbatch, {}};
      st = f.d->PullKvCache(idx, Ref(f, dst), batch, size, Ext(in));
    } else if (op == "pushcache") {
      uint64_t cluster;
      std::string src, dst;
      uint32_t dbatch, sbatch;
      int64_t size;
      in >> src >> cluster >> dst >> dbatch >> sbatch >> size;
      CacheIndex idx{cluster, Ref(f, dst).cache_id, dbatch, {}};
      st = f.p->PushKvCache(Ref(f, src), idx, sbatch, size, Ext(in));
    } else if (op == "init") {
      // init role opts: a fresh instance (cluster 7), initialized and dropped.
      int role;
      std::string opts;
      in >> role >> opts;
      LlmDataDist x(7, static_cast<LlmRole>(role));
      st = x.Initialize(Options(opts));
      x.Finalize();
    } else if (op == "register") {
      // register nt dtype shape naddrs zero_index  (on D; memory from D's own cache buffers)
      uint32_t nt;
      int dtype, naddrs, zero;
      std::string shape;
      in >> nt >> dtype >> shape >> naddrs >> zero;
      static std::vector<int32_t> scratch(64 * 1024);
      CacheDesc desc;
      desc.num_tensors = nt;
      desc.data_type = static_cast<DataType>(dtype);
      desc.shape = Shape(shape);
      std::vector<uint64_t> addrs;
      for (int i = 0; i < naddrs; ++i) addrs.push_back(i == zero ? 0 : reinterpret_cast<uint64_t>(scratch.data()));
      int64_t id = -1;
      st = f.d->RegisterKvCache(desc, addrs, RegisterCfg{}, id);
    } else if (op == "unregister") {
      std::string r;
      in >> r;
      st = f.d->UnregisterKvCache(Ref(f, r).cache_id);
    } else if (op == "alloc") {
      // alloc nt dtype shape placement (on D; remembered as A on success)
      uint32_t nt;
      int dtype, placement;
      std::string shape;
      in >> nt >> dtype >> shape >> placement;
      CacheDesc desc;
      desc.num_tensors = nt;
      desc.data_type = static_cast<DataType>(dtype);
      desc.shape = Shape(shape);
      desc.placement = static_cast<CachePlacement>(placement);
      Cache c;
      st = f.d->AllocateCache(desc, c);
      if (st == LLM_SUCCESS) f.alloc_id = c.cache_id;
    } else if (op == "dealloc") {
      std::string r;
      in >> r;
      st = f.d->DeallocateCache(Ref(f, r).cache_id);
    } else if (op == "copyblocks") {
      // copyblocks src dst src_blocks dst_lists(';'-separated, '-' = none, '_' = one empty list)
      std::string src, dst, sb, dl;
      in >> src >> dst >> sb >> dl;
      std::vector<std::vector<uint64_t>> lists;
      if (dl == "_") lists.emplace_back();
      else
        for (const auto &l : Split(dl, ';')) lists.push_back(Blocks(l));
      st = f.d->CopyKvBlocks(Ref(f, src), Ref(f, dst), Blocks(sb), lists);
    } else if (op == "copycache") {
      std::string src, dst;
      uint32_t sb, db;
      uint64_t off;
      int64_t size;
      in >> src >> dst >> sb >> db >> off >> size;
      st = f.d->CopyKvCache(Ref(f, src), Ref(f, dst), sb, db, off, size);
    } else if (op == "link" || op == "unlink") {
      std::string spec;
      int timeout, force = 0;
      in >> spec >> timeout;
      if (op == "unlink") in >> force;
      std::vector<Status> rets;
      st = op == "link" ? f.d->LinkLlmClusters(Clusters(f, spec), rets, timeout)
                        : f.d->UnlinkLlmClusters(Clusters(f, spec), rets, timeout, force != 0);
      extra = " [";
      for (size_t i = 0; i < rets.size(); ++i) extra += (i ? "," : "") + std::to_string(rets[i]);
      extra += "]";
    } else if (op == "setrole") {
      int role;
      std::string opts;
      in >> role >> opts;
      st = f.d->SetRole(static_cast<LlmRole>(role), Options(opts));
    } else {
      std::cerr << "unknown op " << op << "\n";
      return 2;
    }
    std::cout << st << extra << " " << Hash(f) << "\n";
  }
  f.d.reset();
  f.p.reset();
  return 0;
}
