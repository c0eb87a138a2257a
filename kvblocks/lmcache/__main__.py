# SPDX-License-Identifier: Apache-2.0
"""Launcher: registers the ``kvblocks`` transfer channel, then runs an LMCache program in this process.

    python -m kvblocks.lmcache server    [kvblocks options] [lmcache.v1.multiprocess.http_server options]
    python -m kvblocks.lmcache benchmark [kvblocks options] [lmcache.tools.transfer_channel_benchmark options]

kvblocks options (the rest goes to LMCache unchanged):

  --kvblocks-auth-token TOKEN   the secret every link proves (default: $KVBLOCKS_AUTH_TOKEN; required)
  --kvblocks-transport MODE     auto (shm/CMA on one host, TCP across hosts; default), shm, tcp
  --kvblocks-timeout-ms N       deadline of one read; default 80 % of --p2p-load-timeout (server), 5000
                                (benchmark). Must be below --p2p-load-timeout: a read LMCache gave up on
                                must be over, so that no byte of it lands in memory LMCache reuses.
  --kvblocks-link-timeout-ms N  bound of one link attempt (default 2000)
  --kvblocks-option KEY=VALUE   any kvblocks engine option, e.g. kvblocks.Encryption=tls (repeatable)
  --kvblocks-metrics-port N     serve kvblocks' Prometheus metrics (transfers, bytes, links) on
                                127.0.0.1:N/metrics. With prometheus_client installed they are also added
                                to its default registry, which LMCache serves on --prometheus-port.

``server`` selects the channel (``--p2p-transfer-engine kvblocks``) unless another is named.
"""
import argparse
import os
import runpy
import sys
from typing import Dict, List, Optional, Tuple

from kvblocks.lmcache import CHANNEL_NAME, register

PROGRAMS = {"server": "lmcache.v1.multiprocess.http_server",
            "benchmark": "lmcache.tools.transfer_channel_benchmark"}
_LMCACHE_LOAD_TIMEOUT_S = 30.0  # LMCache 0.5.6's default --p2p-load-timeout


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvblocks.lmcache", add_help=False,
                                description="Run an LMCache program with the kvblocks transfer channel registered.")
    p.add_argument("program", choices=sorted(PROGRAMS))
    p.add_argument("--kvblocks-auth-token", default=None)
    p.add_argument("--kvblocks-transport", default="auto", choices=["auto", "shm", "tcp", "ucx"])
    p.add_argument("--kvblocks-timeout-ms", type=int, default=None)
    p.add_argument("--kvblocks-link-timeout-ms", type=int, default=2000)
    p.add_argument("--kvblocks-option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--kvblocks-metrics-port", type=int, default=None)
    return p


def _flag(rest: List[str], name: str) -> Tuple[bool, str]:
    """Whether LMCache's ``name`` flag is in ``rest``, and its value."""
    for i, a in enumerate(rest):
        if a == name and i + 1 < len(rest):
            return True, rest[i + 1]
        if a.startswith(name + "="):
            return True, a.split("=", 1)[1]
    return False, ""


def plan(argv: List[str]) -> Tuple[str, Dict[str, object], List[str]]:
    """(LMCache module to run, channel options, its argv) for the launcher's ``argv``; the metrics port,
    if any, is the options' ``metrics_port``.
    Raises SystemExit (argparse's usage error) for bad options."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    ns, rest = _parser().parse_known_args(argv)
    token = ns.kvblocks_auth_token or os.environ.get("KVBLOCKS_AUTH_TOKEN")
    if not token:
        _parser().error("the kvblocks channel needs --kvblocks-auth-token or KVBLOCKS_AUTH_TOKEN")
    options = {}
    for kv in ns.kvblocks_option:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            _parser().error(f"--kvblocks-option takes KEY=VALUE, got {kv!r}")
        options[k] = v
    timeout_ms = ns.kvblocks_timeout_ms
    if ns.program == "server":
        given, v = _flag(rest, "--p2p-load-timeout")
        load_s = float(v) if given else _LMCACHE_LOAD_TIMEOUT_S
        if timeout_ms is None:
            timeout_ms = max(1, int(load_s * 800))
        if timeout_ms >= load_s * 1000:
            _parser().error(f"--kvblocks-timeout-ms {timeout_ms} must be below --p2p-load-timeout ({load_s} s)")
        if not _flag(rest, "--p2p-transfer-engine")[0]:
            rest = rest + ["--p2p-transfer-engine", CHANNEL_NAME]
    elif timeout_ms is None:
        timeout_ms = 5000
    if timeout_ms < 1:
        _parser().error("--kvblocks-timeout-ms must be >= 1")
    opts = {"auth_token": token, "transport": ns.kvblocks_transport, "timeout_ms": timeout_ms,
            "link_timeout_ms": ns.kvblocks_link_timeout_ms, "options": options,
            "metrics_port": ns.kvblocks_metrics_port}
    return PROGRAMS[ns.program], opts, rest


def _metrics(port: Optional[int]) -> None:
    """kvblocks' metrics on their own port, and in prometheus_client's registry when it is there."""
    from kvblocks import prometheus

    if port is not None:
        prometheus.serve(port)
    try:
        prometheus.register()
    except ImportError:
        pass


def main(argv: List[str]) -> None:
    """Registers the channel, then runs the LMCache program as ``python -m`` would."""
    module, opts, rest = plan(argv)
    _metrics(opts.pop("metrics_port"))
    register(**opts)
    sys.argv = [module] + rest
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
