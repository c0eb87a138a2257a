# SPDX-License-Identifier: Apache-2.0
"""The cost of kvblocks.Encryption=tls (README "Encryption"): TCP transfers with TLS 1.3, each timed
in alternating turns with the same transfer in clear (its baseline), on a second peer and link of
their own (path ``tls``: Transport=tcp, Encryption=tls, a token as the pre-shared key)."""
from __future__ import annotations

# (size, direction, pattern): the 256 MiB pull and push, and the 16 x 4 KiB pull (common.SIZES)
TLS_CASES = (("large", "pull", "contig"), ("large", "push", "contig"), ("small", "pull", "random"))


def tls_available():
    """Whether libssl.so.3 loads here. Raises nothing."""
    import ctypes

    try:
        ctypes.CDLL("libssl.so.3")
        return True
    except OSError:
        return False


def tls_cases(transfer_case):
    """The encryption group: ``transfer_case(path, size, direction, pattern)`` makes each row, its
    baseline the same row over the clear tcp path; the large rows are also timed beside the same
    bytes through Python's ssl (the system's OpenSSL used directly: baselines.raw_tls_case) where
    the ``openssl`` command can make its certificate. Empty when OpenSSL 3 is absent. Raises nothing."""
    from . import baselines as bl

    if not tls_available():
        return []
    out = []
    for size, d, p in TLS_CASES:
        c = transfer_case("tls", size, d, p)
        c.group, c.baseline, c.pgroup = "encryption", f"tcp/{size}/{d}/{p}", f"encryption-{size}"
        c.note = "TLS 1.3 (AES-128-GCM, PSK + ECDHE), user space: time ratio to the same transfer in clear"
        if size == "large" and bl.tls_baseline_available():
            raw = bl.raw_tls_case(size, d)
            c.beside = (raw.id,)
            out.append(raw)
        out.append(c)
    return out
