# SPDX-License-Identifier: Apache-2.0
"""kvblocks.Integrity=crc32c: the large TCP pull and push (256 MiB a call, random blocks) with a
CRC32C per (tensor, segment), each timed in the same rounds as the same transfer unchecked (its
baseline, ``tcp/large/{pull,push}/random``), so the row's ratio is the check's cost. Selected with
``--case integrity``."""
from __future__ import annotations

PATH = "tcp-crc32c"  # the pair's link: Transport=tcp, and Integrity=crc32c on this (the calling) side


def integrity_cases(transfer_case):
    """The checked rows, made by cases._transfer_case. Raises nothing."""
    out = []
    for d in ("pull", "push"):
        c = transfer_case(PATH, "large", d, "random")
        c.baseline, c.group, c.pgroup = f"tcp/large/{d}/random", "integrity", "tcp-large"
        c.note = "kvblocks.Integrity=crc32c, interleaved with the unchecked transfer (the baseline)"
        out.append(c)
    return out
