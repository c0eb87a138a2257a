# SPDX-License-Identifier: Apache-2.0
"""The runtime's own CRC32C (kvblocks/runtime/security/crc32c.cc, which kvblocks.Integrity=crc32c
rests on) against the RFC 3720 (iSCSI) known answers, hardware against the portable slice-by-8 code
on random buffers of odd lengths and alignments, and incremental use. A tiny C++ program compiles
crc32c.cc itself: the library exports no such symbol."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RUNTIME = os.path.join(ROOT, "kvblocks", "runtime")

pytestmark = [pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed"),
              pytest.mark.skipif(not os.path.isfile(os.path.join(RUNTIME, "security", "crc32c.cc")),
                                 reason="needs the runtime sources (a source checkout)")]

# RFC 3720 appendix B.4 and the classic check value.
RFC3720 = [
    (b"123456789", 0xE3069283),
    (b"\x00" * 32, 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (bytes.fromhex("01c00000000000000000000000000000" "14000000000004000000001400000018"
                   "28000000000000000200000000000000"), 0xD9963A56),
    (b"", 0x00000000),
]


@pytest.fixture(scope="module")
def kat(tmp_path_factory):
    exe = str(tmp_path_factory.mktemp("crc32c") / "crc32c_kat")
    cmd = ["g++", "-std=c++17", "-O2", "-Wall", f"-I{RUNTIME}", os.path.join(HERE, "cpp", "crc32c_kat.cpp"),
           os.path.join(RUNTIME, "security", "crc32c.cc"), "-o", exe]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, " ".join(cmd) + "\n" + r.stderr

    def run(lines):
        out = subprocess.run([exe], input="".join(l + "\n" for l in lines), capture_output=True, text=True,
                             timeout=120, check=True).stdout.split()
        assert len(out) == len(lines)
        return out
    return run


def test_rfc3720_known_answers(kat):
    """Contract: Crc32c and Crc32cPortable are CRC32C (RFC 3720 B.4 vectors and "123456789")."""
    got = kat([f"crc {data.hex() or '-'}" for data, _ in RFC3720])
    for (data, want), g in zip(RFC3720, got):
        hw, sw = g.split(",")
        assert int(hw, 16) == want and int(sw, 16) == want, (data[:16], g, hex(want))


def test_hardware_matches_portable_on_random_buffers(kat):
    """Contract: on 3000 random buffers (lengths 0..200000, start offsets 0..63, random seed CRCs:
    every path of the three-way loops and their tails) the CPU's instructions and slice-by-8 agree."""
    assert kat(["random 1 1500", "random 2 1500"]) == ["ok", "ok"]


def test_every_kernel_matches_portable(kat):
    """Contract: each kernel this CPU runs (the crc32 loop, 256-bit folding, the hybrid of folding and
    crc32 streams, 512-bit folding; Crc32cWith) agrees with slice-by-8 on 600 random buffers each."""
    best = int(kat(["kernels"])[0].split(",")[0])
    if best == 0:
        pytest.skip("this CPU has no CRC32C instructions")
    kernels = range(1, best + 1)
    assert kat([f"random {10 + k} 600 {k}" for k in kernels]) == ["ok"] * len(kernels)


def test_incremental_equals_whole(kat):
    """Contract: Crc32c(Crc32c(0, a), b) == Crc32c(0, a || b), the way a segment arriving in chunks
    is checked, at every split point of a buffer longer than a three-way block."""
    data = os.urandom(3 * 8192 + 777)
    whole = kat([f"crc {data.hex()}"])[0].split(",")[0]
    splits = [0, 1, 7, 8, 255, 256, 768, 8191, 8192, 3 * 8192, len(data)]
    assert kat([f"split {data.hex()} {k}" for k in splits]) == [whole] * len(splits)


def test_reports_hardware_on_x86_with_sse42(kat):
    """Contract: on an x86-64 CPU with SSE4.2 (or Arm with the CRC extension) the instructions are used."""
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " sse4_2" not in flags and " crc32" not in flags:
        pytest.skip("this CPU has no CRC32C instructions")
    assert kat(["hw"]) == ["1"]
