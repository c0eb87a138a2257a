# SPDX-License-Identifier: Apache-2.0
"""Two "hosts" for tests: two network namespaces joined by a veth pair (needs root and iproute2)."""
import os
import shutil
import subprocess

import pytest


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces")
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b = f"kvbA{tag}", f"kvbB{tag}"
    va, vb = f"kva{tag}", f"kvb{tag}"
    subnet = f"10.213.{os.getpid() % 250}"
    r = _ip("netns", "add", ns_a)
    if r.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {r.stderr.strip()}")
    try:
        _ip("netns", "add", ns_b)
        steps = [
            ("link", "add", va, "type", "veth", "peer", "name", vb),
            ("link", "set", va, "netns", ns_a),
            ("link", "set", vb, "netns", ns_b),
            ("-n", ns_a, "addr", "add", f"{subnet}.1/24", "dev", va),
            ("-n", ns_b, "addr", "add", f"{subnet}.2/24", "dev", vb),
            ("-n", ns_a, "link", "set", va, "up"),
            ("-n", ns_b, "link", "set", vb, "up"),
            ("-n", ns_a, "link", "set", "lo", "up"),
            ("-n", ns_b, "link", "set", "lo", "up"),
        ]
        for s in steps:
            r = _ip(*s)
            if r.returncode != 0:
                pytest.skip(f"cannot wire the namespaces: ip {' '.join(s)}: {r.stderr.strip()}")
        yield ns_a, ns_b, subnet
    finally:
        _ip("netns", "del", ns_a)
        _ip("netns", "del", ns_b)
