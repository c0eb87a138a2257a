# SPDX-License-Identifier: Apache-2.0
"""Block markers and block-id lists.

Every transferred block is checked once per case: the source blocks of one extra call get a
fresh marker (nonce, tensor, block) in their first and last 8 bytes, and the destination blocks
must hold exactly those markers afterwards.
"""
from __future__ import annotations

from .common import np as _np


def _marker(nonce, t, ids):
    np = _np()
    return (np.uint64(nonce) << np.uint64(44)) | (np.uint64(t) << np.uint64(24)) | ids.astype(np.uint64)


def mark_blocks(arrays, ids, nonce):
    """Writes the markers of ``nonce`` into blocks ``ids`` of every (blocks, bytes) uint8 array.

    Raises:
        IndexError: an id is out of range.
        ValueError: a block is not a whole number of 8-byte words.
    """
    np = _np()
    ids = np.asarray(ids, dtype=np.int64)
    for t, a in enumerate(arrays):
        v = a.view(np.uint64)
        m = _marker(nonce, t, ids)
        v[ids, 0] = m
        v[ids, -1] = m


def check_blocks(arrays, dst_ids, src_ids, nonce):
    """Number of (tensor, block) pairs whose markers are wrong.

    Raises:
        IndexError: an id is out of range.
        ValueError: a block is not a whole number of 8-byte words.
    """
    np = _np()
    dst_ids = np.asarray(dst_ids, dtype=np.int64)
    src_ids = np.asarray(src_ids, dtype=np.int64)
    bad = 0
    for t, a in enumerate(arrays):
        v = a.view(np.uint64)
        m = _marker(nonce, t, src_ids)
        bad += int(((v[dst_ids, 0] != m) | (v[dst_ids, -1] != m)).sum())
    return bad


def id_lists(rng, num_blocks, count, pattern, how_many):
    """``how_many`` (src, dst) uint64 block-id arrays of ``count`` distinct ids each;
    ``pattern`` is ``contig`` (one run) or anything else (random ids).

    Raises:
        ValueError: ``count`` exceeds ``num_blocks``.
    """
    np = _np()
    out = []
    for _ in range(how_many):
        if pattern == "contig":
            s = int(rng.integers(0, num_blocks - count + 1))
            d = int(rng.integers(0, num_blocks - count + 1))
            out.append((np.arange(s, s + count, dtype=np.uint64), np.arange(d, d + count, dtype=np.uint64)))
        elif count == num_blocks:
            out.append((rng.permutation(num_blocks).astype(np.uint64), rng.permutation(num_blocks).astype(np.uint64)))
        else:
            out.append((rng.choice(num_blocks, count, replace=False).astype(np.uint64),
                        rng.choice(num_blocks, count, replace=False).astype(np.uint64)))
    return out
