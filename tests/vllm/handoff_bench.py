# SPDX-License-Identifier: Apache-2.0
"""Hand-off time of KvblocksConnector against NixlConnector (and, with ``--old DIR``, an older
KvblocksConnector) in one run: every pair is up at once and the requests are interleaved (one to each
pair in turn), so load changes hit all of them alike. Prints medians and spreads per round.

Usage (vLLM venv; ``DIR`` holds an older ``kvblocks/vllm``, e.g. ``git archive main kvblocks/vllm | tar
-x -C DIR``)::

    python tests/vllm/handoff_bench.py [--old DIR] [--n 20] [--rounds 3]
"""
import argparse
import os
import random
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import Engine, free_port, kvblocks_config, make_model, median, nixl_config  # noqa: E402

OLD_SHIM = '''
from kvblocks_oldvllm.connector import KvblocksConnector as _Old
from timed_connectors import _Timed


class TimedOldKvblocksConnector(_Timed, _Old):
    pass
'''


def install_old(src: str, dst: str) -> None:
    """``src``/kvblocks/vllm as package ``kvblocks_oldvllm`` in ``dst`` (its own imports rewritten)."""
    pkg = os.path.join(dst, "kvblocks_oldvllm")
    shutil.copytree(os.path.join(src, "kvblocks", "vllm"), pkg)
    for name in os.listdir(pkg):
        if name.endswith(".py"):
            path = os.path.join(pkg, name)
            with open(path) as f:
                text = f.read().replace("kvblocks.vllm", "kvblocks_oldvllm")
            with open(path, "w") as f:
                f.write(text)
    with open(os.path.join(dst, "timed_old.py"), "w") as f:
        f.write(OLD_SHIM)


def read_times(path):
    import json
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(x)["seconds"] for x in f if x.strip()]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", help="a directory holding an older kvblocks/vllm")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-nixl", action="store_true")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="handoff-")
    model = make_model(os.path.join(work, "model"))
    extra_path = {}
    if args.old:
        install_old(args.old, work)
        extra_path = {"PYTHONPATH": work + os.pathsep + HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    pairs = {}

    def start(name, cfg_p, cfg_d, env_p=None, env_d=None, cpu=(0, 1)):
        rec = os.path.join(work, f"{name}.jsonl")
        p = Engine(f"{name}-p", model, cfg_p, cpu[0], dict(env_p or {}, **extra_path), work)
        d = Engine(f"{name}-d", model, cfg_d, cpu[1], dict(env_d or {}, KVB_TIMING_FILE=rec, **extra_path), work)
        pairs[name] = (p, d, rec)

    try:
        start("kvblocks", kvblocks_config("kv_producer", free_port(2)), kvblocks_config("kv_consumer"))
        if args.old:
            old_p = kvblocks_config("kv_producer", free_port(2))
            old_d = kvblocks_config("kv_consumer")
            for c in (old_p, old_d):
                c["kv_connector"], c["kv_connector_module_path"] = "TimedOldKvblocksConnector", "timed_old"
            start("old-kvblocks", old_p, old_d)
        if not args.no_nixl:
            ucx = {"UCX_TLS": "self,sm,tcp", "UCX_NET_DEVICES": "lo", "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}
            start("nixl", nixl_config("kv_producer"), nixl_config("kv_consumer"),
                  dict(ucx, VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port())),
                  dict(ucx, VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port())))
        for p, d, _ in pairs.values():
            p.wait_ready()
            d.wait_ready()
        rnd = random.Random(5)
        for r in range(args.rounds):
            counts = {k: len(read_times(v[2])) for k, v in pairs.items()}
            load = os.getloadavg()[0]
            for _ in range(args.n):
                prompt = [rnd.randrange(1, 512) for _ in range(100)]  # fresh: no prefix hit anywhere
                for name, (p, d, _) in pairs.items():
                    pre = p.generate([prompt], 1, [{"do_remote_decode": True}])["kv_transfer_params"]
                    d.generate([prompt], 16, pre)
            line = [f"round {r + 1} (load {load:.1f}->{os.getloadavg()[0]:.1f}):"]
            for name, (_, _, rec) in pairs.items():
                ts = read_times(rec)[counts[name]:]
                line.append(f"{name} median {median(ts) * 1e3:.2f} ms [{min(ts) * 1e3:.2f}..{max(ts) * 1e3:.2f}] "
                            f"n={len(ts)}")
            print("  ".join(line), flush=True)
    finally:
        for p, d, _ in pairs.values():
            d.close()
            p.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
