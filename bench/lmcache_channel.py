# SPDX-License-Identifier: Apache-2.0
"""kvblocks vs NIXL as LMCache transfer channels, measured with LMCache's own benchmark.

Runs ``lmcache.tools.transfer_channel_benchmark`` (a server process registering an L1 buffer, a client
reading a random subset of its objects, ``--verify`` checking every byte) once per channel per round,
the channels alternating in a new order each round, on the same objects (same sizes, same seed). The
kvblocks channel is registered by its launcher (``python -m kvblocks.lmcache benchmark``); NIXL's is
LMCache's (UCX backend). ``cma-ceiling`` (bench/lmcache_ceiling.py: one bare process_vm_readv of all
objects inside submit_read, no thread, no check) shows what any cross-memory-attach channel can reach on
LMCache's arenas in this loop. Prints each run's median GB/s, per round each channel's ratio to NIXL (and
kvblocks' to the ceiling), and the median ratios.

    KVBLOCKS_AUTH_TOKEN=... python bench/lmcache_channel.py [--rounds 3] [--object-size 4MB]
        [--num-objects 8] [--page-size 4KB] [--iters 20] [--json out.json]

Needs lmcache==0.5.6 and, for the comparison, nixl (``pip install nixl``) in the same environment.
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from ports import free_port  # noqa: E402

_MEDIAN = re.compile(r"median\s*:\s*([\d.]+)\s*ms\s+([\d.]+)\s*GB/s")


def _cmd(channel: str) -> List[str]:
    if channel == "kvblocks":
        return [sys.executable, "-m", "kvblocks.lmcache", "benchmark"]
    if channel == "cma-ceiling":
        return [sys.executable, os.path.join(HERE, "lmcache_ceiling.py"), "benchmark"]
    return [sys.executable, "-m", "lmcache.tools.transfer_channel_benchmark"]


def one_run(channel: str, a: argparse.Namespace) -> Dict[str, object]:
    """One server + client pair; the client's median read time and GB/s, and whether --verify passed."""
    url, listen, ctl = (f"127.0.0.1:{free_port()}" for _ in range(3))
    common = ["--transfer-channel-type", channel, "--url", url, "--control-url", ctl, "--page-size", a.page_size,
              "--object-size", a.object_size, "--num-objects", str(a.num_objects)]
    env = dict(os.environ, KVBLOCKS_AUTH_TOKEN=os.environ.get("KVBLOCKS_AUTH_TOKEN", "bench-lmcache-token"),
               UCX_MODULES=os.environ.get("UCX_MODULES", "^ib"))
    server = subprocess.Popen(_cmd(channel) + ["--role", "server", "--buffer-size", a.buffer_size,
                                               "--server-timeout", "600"] + common,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        for line in server.stdout:
            if "[server] ready" in line:
                break
        else:
            raise RuntimeError(f"{channel} server exited ({server.wait()})")
        client = subprocess.run(_cmd(channel) + ["--role", "client", "--listen-url", listen, "--iters", str(a.iters),
                                                 "--warmup", str(a.warmup), "--seed", str(a.seed), "--verify"] + common,
                                capture_output=True, text=True, env=env, timeout=600)
    finally:
        server.kill()
        server.wait()
    out = client.stdout + client.stderr
    m = _MEDIAN.search(out)
    if m is None:
        raise RuntimeError(f"{channel} client printed no median (rc {client.returncode}):\n{out[-3000:]}")
    return {"channel": channel, "median_ms": float(m.group(1)), "gbps": float(m.group(2)),
            "verified": "verify OK" in out, "rc": client.returncode}


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--object-size", default="4MB")
    p.add_argument("--num-objects", type=int, default=8)
    p.add_argument("--page-size", default="4KB", help="L1 alignment (LMCache MP's default is 4 KiB)")
    p.add_argument("--buffer-size", default="256MB")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--channels", default="kvblocks,nixl")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    channels = a.channels.split(",")
    runs: List[Dict[str, object]] = []
    print(f"# LMCache transfer_channel_benchmark: {a.num_objects} x {a.object_size} objects, page {a.page_size}, "
          f"{a.iters} iters; load at start {load()}", flush=True)
    for r in range(a.rounds):
        order = channels[:]
        random.Random(r).shuffle(order)
        for ch in order:
            res = one_run(ch, a)
            res["round"] = r + 1
            runs.append(res)
            print(f"round {r + 1} {ch:9s} median {res['median_ms']:8.2f} ms {res['gbps']:7.2f} GB/s "
                  f"verify {'OK' if res['verified'] else 'FAILED'} (client rc {res['rc']}) load {load()}", flush=True)
    summary: Dict[str, object] = {"config": vars(a), "runs": runs, "load_end": load(), "finished": time.time()}
    pairs = [(c, "nixl") for c in channels if c != "nixl" and "nixl" in channels]
    if "kvblocks" in channels and "cma-ceiling" in channels:
        pairs.append(("kvblocks", "cma-ceiling"))
    summary["ratios"] = {}
    for num, den in pairs:
        ratios = []
        for r in range(1, a.rounds + 1):
            by = {x["channel"]: x for x in runs if x["round"] == r}
            ratios.append(by[num]["gbps"] / by[den]["gbps"])
        summary["ratios"][f"{num}/{den}"] = {"rounds": ratios, "median": statistics.median(ratios)}
        print(f"{num} / {den} throughput per round: {', '.join(f'{x:.2f}x' for x in ratios)}; "
              f"median {statistics.median(ratios):.2f}x")
    print(f"load at end {load()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if all(x["verified"] for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
