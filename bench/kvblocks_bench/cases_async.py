# SPDX-License-Identifier: Apache-2.0
"""Asynchronous transfers (group ``async``), each beside a baseline from the same run:

* ``async/submit-16x16B``: one ``pull_kv_blocks_async`` submission of 16 in-process blocks (checks,
  plan, handle, hand-off to a worker), vs ``async/validate-16``, ``kb.validate_blocks`` of the same
  ndarray lists (the validation baseline). Target: at most 2 us more.
* ``async/tcp-64-inflight``: 64 small pulls over TCP submitted at once, then waited, vs
  ``async/tcp-64-sequential``, the same 64 as synchronous ``pull_kv_blocks`` calls one after
  another. Target: at least 4x faster.
"""
from __future__ import annotations

import itertools

from .common import Case
from .common import np as _np
from .markers import check_blocks, id_lists, mark_blocks

IN_FLIGHT = 64


def _submit_lists():
    np = _np()
    s = np.arange(0, 64, 4, dtype=np.uint64)
    d = np.arange(1, 65, 4, dtype=np.uint64)[::-1].copy()
    return s, d


def _validate_make(h):
    import kvblocks as kb

    s, d = _submit_lists()
    v = kb.validate_blocks
    return (lambda: v(s, d, 64)), None


def _submit_make(h):
    import kvblocks as kb

    rc, lc = h.inprocess()[2][(16, 1)]
    s, d = _submit_lists()
    idx = kb.CacheIndex(1, rc.cache_id)
    submit = h.inprocess()[1].pull_kv_blocks_async

    def fn():
        submit(idx, lc, s, d)  # the handle is dropped: the transfer still completes on a worker

    def verify():
        ra, la = [rc.numpy(0).reshape(64, 16)], [lc.numpy(0).reshape(64, 16)]
        nonce = next(h.nonce)
        mark_blocks(ra, s, nonce)
        submit(idx, lc, s, d).wait(10)
        return check_blocks(la, d, s, nonce)

    return fn, verify


# a small pull: latency-bound (one request round trip), 2 tensors x 4 random blocks of 128 B
TCP_TENSORS, TCP_NB, TCP_BB, TCP_B = 2, 64, 128, 4


def _tcp_lists(h):
    p = h.pair("tcp", TCP_TENSORS, TCP_NB, TCP_BB)
    rng = _np().random.default_rng(64)
    return p, id_lists(rng, TCP_NB, TCP_B, "random", IN_FLIGHT), rng, TCP_B


def _sequential_make(h):
    p, lists, _, _ = _tcp_lists(h)
    pull, idx, cache = p.dd.pull_kv_blocks, p.index, p.cache

    def fn():
        for s, d in lists:
            pull(idx, cache, s, d)

    return fn, None


def _inflight_make(h):
    import kvblocks as kb

    p, lists, rng, B = _tcp_lists(h)
    submit, idx, cache, wait_all = p.dd.pull_kv_blocks_async, p.index, p.cache, kb.wait_all

    def fn():
        wait_all([submit(idx, cache, s, d) for s, d in lists])

    def verify():
        bad = 0
        for s, d in itertools.islice(id_lists(rng, p.nb, B, "random", 8), 8):
            nonce = next(h.nonce)
            p.peer.call("mark", p.rkey, s, nonce)
            submit(idx, cache, s, d).wait(10)
            bad += check_blocks(p.arrays, d, s, nonce)
        return bad

    return fn, verify


def async_cases():
    """The async group, baselines first. Raises nothing."""
    call_bytes = TCP_TENSORS * TCP_B * TCP_BB
    what = f"{TCP_TENSORS} tensors x {TCP_B} random {TCP_BB} B blocks"
    return [
        Case("async/validate-16", "async", _validate_make, blocks=16, fast=True, pgroup="async-submit",
             note="kb.validate_blocks of the submitted ndarray lists (validation baseline)"),
        Case("async/submit-16x16B", "async", _submit_make, baseline="async/validate-16", blocks=16, bytes=256,
             fast=True, path="inprocess", pgroup="async-submit",
             note="pull_kv_blocks_async submission only, in-process, 16 blocks, ndarray ids"),
        Case("async/tcp-64-sequential", "async", _sequential_make, blocks=IN_FLIGHT * TCP_TENSORS * TCP_B,
             bytes=IN_FLIGHT * call_bytes, path="tcp", pgroup="async-tcp",
             note=f"{IN_FLIGHT} synchronous small pulls ({what}) in a row"),
        Case("async/tcp-64-inflight", "async", _inflight_make, baseline="async/tcp-64-sequential",
             blocks=IN_FLIGHT * TCP_TENSORS * TCP_B, bytes=IN_FLIGHT * call_bytes, path="tcp", pgroup="async-tcp",
             note=f"the same {IN_FLIGHT} pulls submitted at once, then wait_all"),
    ]
