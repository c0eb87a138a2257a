# SPDX-License-Identifier: Apache-2.0
"""Head slicing for unequal TP, kvblocks vs NIXL, interleaved in one run (README "Layout transforms").

Decode rank 0 of TP 2 reads heads [0, 4) of every block of a TP 1 prefill (8 heads, HND, 16 tokens
of 128 x fp16 per head): the way vLLM's NixlConnector does it, NIXL gets one descriptor per head
slice per block (HND makes a head slice contiguous); kvblocks gets one pull_kv_blocks_layout call.
Both run in this process (NIXL: two UCX agents; kvblocks: two engines, the inprocess path) on the
same arrays, alternating call by call; beside them, an untransformed pull of the same bytes.

    python -m kvblocks_bench.layout_nixl [--mib 64] [--rounds 15]

Needs nixl (skips it with a message when it is not importable).
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import numpy as np

T, H, HS, E = 16, 8, 128, 2          # prefill block: 16 tokens x 8 heads x 128 x fp16, HND
SLICE = 4                             # decode TP 2: heads [0, 4)
BB = T * H * HS * E                   # 32 KiB source block
DBB = T * SLICE * HS * E              # 16 KiB destination block
NT = 2


def _kvblocks(nb, src, dst):
    import kvblocks as kb

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p, d = kb.LlmDataDist(1, kb.LlmRole.MIX), kb.LlmDataDist(2, kb.LlmRole.MIX)
    p.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}"})
    d.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: "60000"})
    rc = p.register_arrays([src[t] for t in range(NT)])
    lc = d.register_arrays([dst[t] for t in range(NT)])
    plain_src = np.zeros((NT, nb, DBB), np.uint8)  # an untransformed source of the same bytes
    prc = p.register_arrays([plain_src[t] for t in range(NT)])
    d.link_llm_clusters([kb.ClusterInfo(1, 0, [kb.IpInfo("127.0.0.1", 0)], [kb.IpInfo("127.0.0.1", port)])])
    ids = np.arange(nb, dtype=np.uint64)
    sl, dl = kb.BlockLayout(T, H, HS, E, "HND"), kb.BlockLayout(T, SLICE, HS, E, "HND")
    prep = d.prepare_transfer(kb.CacheIndex(1, rc.cache_id), lc, ids, ids, src_layout=sl, dst_layout=dl,
                              src_heads=(0, SLICE), dst_heads=(0, SLICE))
    fns = {
        "kvblocks-plain": lambda: d.pull_kv_blocks(kb.CacheIndex(1, prc.cache_id), lc, ids, ids),
        "kvblocks-layout": lambda: d.pull_kv_blocks_layout(kb.CacheIndex(1, rc.cache_id), lc, ids, ids, sl, dl,
                                                           (0, SLICE), (0, SLICE)),
        "kvblocks-prepared": prep.execute,
    }
    return fns, (p, d)


def _nixl(nb, src, dst):
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError as e:
        print(f"nixl not importable ({e}): NIXL skipped")
        return {}, None
    target = nixl_agent("prefill", nixl_agent_config(enable_prog_thread=True, backends=["UCX"]))
    init = nixl_agent("decode", nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
    target.register_memory([(src[t].ctypes.data, src[t].nbytes, 0, "") for t in range(NT)], "DRAM")
    init.register_memory([(dst[t].ctypes.data, dst[t].nbytes, 0, "") for t in range(NT)], "DRAM")
    remote = init.add_remote_agent(target.get_agent_metadata())
    # One descriptor per head slice per block per tensor (NixlConnector's heterogeneous-TP layout).
    r = np.empty((NT * nb, 3), np.uint64)
    loc = np.empty((NT * nb, 3), np.uint64)
    for t in range(NT):
        r[t * nb:(t + 1) * nb, 0] = src[t].ctypes.data + np.arange(nb, dtype=np.uint64) * np.uint64(BB)
        loc[t * nb:(t + 1) * nb, 0] = dst[t].ctypes.data + np.arange(nb, dtype=np.uint64) * np.uint64(DBB)
    r[:, 1] = loc[:, 1] = DBB  # heads [0, 4) of an HND block: its first SLICE * T * HS * E bytes
    r[:, 2] = loc[:, 2] = 0
    lh = init.prep_xfer_dlist("NIXL_INIT_AGENT", loc, "DRAM")
    rh = init.prep_xfer_dlist(remote, r, "DRAM")
    idx = np.arange(NT * nb, dtype=np.int32)
    try:
        init.make_connection(remote)
    except Exception:
        pass

    def xfer():
        h = init.make_prepped_xfer("READ", lh, idx, rh, idx, b"")
        st = init.transfer(h)
        while st == "PROC":
            st = init.check_xfer_state(h)
        h.release()
        if st != "DONE":
            raise RuntimeError(f"nixl transfer state {st}")
    return {"nixl-desc-per-slice": xfer}, (target, init)


def _check(dst, src, nb):
    want = src.reshape(NT, nb, H, T * HS * E)[:, :, :SLICE].reshape(NT, nb, DBB)
    return bool(np.array_equal(dst, want))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="bytes moved per call, MiB")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args(argv)
    nb = a.mib * (1 << 20) // (NT * DBB)
    src = np.random.default_rng(1).integers(0, 256, (NT, nb, BB), dtype=np.uint8)
    dst = np.zeros((NT, nb, DBB), np.uint8)
    fns, keep = _kvblocks(nb, src, dst)
    nfns, nkeep = _nixl(nb, src, dst)
    fns.update(nfns)
    checks = {}
    for name, fn in fns.items():  # warm-up, and each variant's bytes checked once
        dst[...] = 0
        fn()
        checks[name] = "-" if name == "kvblocks-plain" else ("ok" if _check(dst, src, nb) else "WRONG")
    out = {k: [] for k in fns}
    load0 = os.getloadavg()
    for _ in range(a.rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - t0)
    load1 = os.getloadavg()
    print(f"{a.mib} MiB per call ({NT} tensors x {nb} blocks, heads [0,{SLICE}) of {H}, HND, "
          f"{NT * nb} NIXL descriptors); {a.rounds} interleaved rounds; load average "
          f"{load0[0]:.1f} at start, {load1[0]:.1f} at end ({os.cpu_count()} cores)")
    base = statistics.median(out["kvblocks-plain"])
    print(f"{'variant':22} {'median':>9} {'p10-p90':>19} {'GB/s':>6} {'vs plain':>8} check")
    for name, xs in out.items():
        xs = sorted(xs)
        med = statistics.median(xs)
        p10, p90 = xs[len(xs) // 10], xs[(len(xs) * 9) // 10 - (1 if len(xs) % 10 == 0 else 0)]
        print(f"{name:22} {med * 1e3:7.2f}ms {p10 * 1e3:8.2f}-{p90 * 1e3:7.2f}ms {a.mib * (1 << 20) / med / 1e9:6.2f} "
              f"{med / base:7.2f}x {checks[name]}")
    del keep, nkeep


if __name__ == "__main__":
    main()
