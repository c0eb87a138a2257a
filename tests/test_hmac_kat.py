# SPDX-License-Identifier: Apache-2.0
"""The runtime's own HMAC-SHA256 (kvblocks/runtime/security/hmac.cc, which every AuthToken proof and
BIND rests on) against the RFC 4231 known answers, and its Proof encoding against docs/protocol.md.
A tiny C++ program compiles hmac.cc itself: the library exports no such symbol."""
import hashlib
import hmac
import os
import shutil
import subprocess

import pytest

from hostile import BIND_LABEL, LISTENER_LABEL, OPENER_LABEL, mac

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RUNTIME = os.path.join(ROOT, "kvblocks", "runtime")

pytestmark = [pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed"),
              pytest.mark.skipif(not os.path.isfile(os.path.join(RUNTIME, "security", "hmac.cc")),
                                 reason="needs the runtime sources (a source checkout)")]

TC6_7_KEY = b"\xaa" * 131
# RFC 4231 section 4: (test case, key, data, HMAC-SHA256). Test case 5's output is truncated to 128 bits.
RFC4231 = [
    (1, b"\x0b" * 20, b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (2, b"Jefe", b"what do ya want for nothing?",
     "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    (3, b"\xaa" * 20, b"\xdd" * 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
    (4, bytes(range(1, 26)), b"\xcd" * 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
    (5, b"\x0c" * 20, b"Test With Truncation", "a3b6167473100ee06e0c796c2955552b"),
    (6, TC6_7_KEY, b"Test Using Larger Than Block-Size Key - Hash Key First",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
    (7, TC6_7_KEY, b"This is a test using a larger than block-size key and a larger than block-size data. "
                   b"The key needs to be hashed before being used by the HMAC algorithm.",
     "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
]


@pytest.fixture(scope="module")
def kat(tmp_path_factory):
    exe = str(tmp_path_factory.mktemp("hmac") / "hmac_kat")
    cmd = ["g++", "-std=c++17", "-O1", "-Wall", f"-I{RUNTIME}", os.path.join(HERE, "cpp", "hmac_kat.cpp"),
           os.path.join(RUNTIME, "security", "hmac.cc"), "-o", exe]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, " ".join(cmd) + "\n" + r.stderr

    def run(lines):
        out = subprocess.run([exe], input="".join(l + "\n" for l in lines), capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()
        assert len(out) == len(lines)
        return out
    return run


def _hex(b):
    return b.hex() or "-"


def test_rfc4231_known_answers(kat):
    """Contract: HmacSha256 is HMAC-SHA256 (RFC 4231 test cases 1 to 7, keys shorter than, equal to
    and longer than a block)."""
    got = kat([f"hmac {_hex(key)} {_hex(data)}" for _, key, data, _ in RFC4231])
    for (case, _, _, want), g in zip(RFC4231, got):
        assert g[:len(want)] == want, f"RFC 4231 test case {case}"


def test_every_padding_boundary_and_key_length(kat):
    """Contract: messages across SHA-256's padding boundaries (55, 56, 63, 64, 119, 120 bytes...) and
    keys of 0, 64 and 65 bytes hash like Python's hmac (the handshake MACs 96-byte messages)."""
    cases = [(os.urandom(k), os.urandom(n)) for k in (0, 16, 64, 65) for n in (0, 1, 55, 56, 63, 64, 65, 96, 119, 120,
                                                                            127, 128, 1000)]
    got = kat([f"hmac {_hex(k)} {_hex(m)}" for k, m in cases])
    assert got == [hmac.new(k, m, hashlib.sha256).hexdigest() for k, m in cases]


def test_proof_encoding_is_the_documented_one(kat):
    """Contract: Proof(key, label, transcript) = HMAC-SHA256(key, len(label) u8 || label || transcript),
    as docs/protocol.md says and hostile.mac computes."""
    cases = [(os.urandom(16), label, os.urandom(75)) for label in (OPENER_LABEL, LISTENER_LABEL, BIND_LABEL)]
    got = kat([f"proof {k.hex()} {label.decode()} {t.hex()}" for k, label, t in cases])
    assert got == [mac(k, label, t).hex() for k, label, t in cases]
