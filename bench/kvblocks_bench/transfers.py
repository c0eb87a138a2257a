# SPDX-License-Identifier: Apache-2.0
"""Timed pull/push callables with a byte check, shared by the case modules (cases, cases_limits, ...)."""
from __future__ import annotations

import itertools

from .markers import check_blocks, id_lists, mark_blocks


def transfer_fns(h, p, direction, lists, rng, pattern, B, ext=None):
    """``(fn, verify)`` for pull or push of ``lists`` (cycled) on pair ``p``. Raises nothing; ``fn``
    raises kvblocks.LLMException on a failed transfer, ``verify`` also RuntimeError from the peer."""
    dd, idx, cache = p.dd, p.index, p.cache
    it = itertools.cycle(lists)
    if direction == "pull":
        pull = dd.pull_kv_blocks

        def fn():
            s, d = next(it)
            pull(idx, cache, s, d, ext)
    else:
        push = dd.push_kv_blocks

        def fn():
            s, d = next(it)
            push(cache, idx, s, d, ext)

    def verify():
        s, d = id_lists(rng, p.nb, B, pattern, 1)[0]
        nonce = next(h.nonce)
        if direction == "pull":
            p.peer.call("mark", p.rkey, s, nonce)
            dd.pull_kv_blocks(idx, cache, s, d, ext)
            return check_blocks(p.arrays, d, s, nonce)
        mark_blocks(p.arrays, s, nonce)
        dd.push_kv_blocks(cache, idx, s, d, ext)
        return p.peer.call("check", p.rkey, d, s, nonce)

    return fn, verify
