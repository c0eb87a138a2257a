# SPDX-License-Identifier: Apache-2.0
"""KvblocksConnector between a prefill and a decode with different block sizes (real vLLM CPU engines,
each in its own process): the decode's pull is kvblocks' layout transform (a 32-token block fills half of
a 64-token one, and the reverse; partial blocks after a local prefix hit and at the end of a prompt move
as head ranges of a block). Same greedy tokens as one engine, no recompute; a deliberately wrong head
mapping (heads rotated by one) or block mapping (reversed) changes them.

Two kv_both engines (block size 32 and 64) serve both directions, so each is prefill for the other.
The tests of this module share the engines and run in file order.
"""
import os
import random
import sys

import pytest

try:  # see test_vllm_e2e.py
    import transformers  # noqa: F401
    import vllm.distributed.kv_transfer.kv_connector.v1.base  # noqa: F401
except Exception as e:  # noqa: BLE001
    pytest.skip(f"vLLM is not importable ({type(e).__name__}: {e}); pip install 'kvblocks[vllm]' and "
                "pip uninstall -y torchvision torchaudio torchcodec", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Engine, free_port, make_model  # noqa: E402

pytestmark = pytest.mark.vllm

MAX_TOKENS = 12
RESULTS = {}


def prompts(seed, lengths):
    rnd = random.Random(seed)
    return [[rnd.randrange(1, 512) for _ in range(n)] for n in lengths]


# Prompt lengths around both block grids: < 1 block, exactly 1 and 2 small blocks, ends inside blocks.
LENGTHS = [5, 31, 32, 33, 64, 70, 100, 150]
TO64 = prompts(101, LENGTHS)          # prefill bs 32 -> decode bs 64
TO32 = prompts(102, LENGTHS)          # prefill bs 64 -> decode bs 32
HELD = prompts(103, [150])            # decoded on the bs-64 engine first: 2 full blocks it then holds
LONGER = [HELD[0] + prompts(104, [45])[0]]  # its prefix hit ends at token 128, mid-way in the bs-32 grid
NEG = {k: prompts(105 + i, [100, 150]) for i, k in enumerate(
    ["rot64", "rev64", "rot32", "rev32"])}
INCOMPAT = prompts(120, [70])
ALL = TO64 + TO32 + HELD + LONGER + INCOMPAT + [p for v in NEG.values() for p in v]


def test_vllm_cpu_interior_is_what_the_connector_describes():
    """vLLM's own cache writer (the op its CPU attention calls) puts K of token t, head h, dim d and V
    where the "vllm-cpu" interior says: per KV head, K as [head_size, tokens], then V as [tokens,
    head_size]. The transforms rest on this; run for both block sizes used below."""
    import torch
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    heads, dim, nb = 2, 32, 3
    for bs in (32, 64):
        cache = torch.zeros(nb, heads, bs, 2 * dim, dtype=torch.bfloat16)
        k_cache, v_cache = cache.view(nb, heads, 2 * bs, dim).chunk(2, dim=2)  # as CPUAttentionBackendImpl
        n = 2 * bs
        key = torch.arange(n * heads * dim, dtype=torch.float32).remainder(251).view(n, heads, dim).to(torch.bfloat16)
        val = -key - 1
        ops.cpu_attn_reshape_and_cache(key, val, k_cache, v_cache, torch.arange(n) + bs,
                                       _get_attn_isa(torch.bfloat16, bs, dim))
        blk = cache.view(nb, heads, 2, -1)
        for t in range(n):
            b, o = divmod(t + bs, bs)
            assert torch.equal(blk[b, :, 0].view(heads, dim, bs)[:, :, o], key[t]), (bs, t)
            assert torch.equal(blk[b, :, 1].view(heads, bs, dim)[:, o], val[t]), (bs, t)


def kv_both(port, **extra):
    return {"kv_connector": "KvblocksConnector", "kv_connector_module_path": "kvblocks.vllm",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": dict(listen=f"127.0.0.1:{port}", _test_reverse_blocks="per_request",
                                              _test_rotate_heads="per_request", **extra)}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(reference tokens by prompt, engine of block size 32, engine of block size 64)."""
    d = tmp_path_factory.mktemp("vllm-layouts")
    model = make_model(str(d / "model"))
    ports = free_port(2), free_port(2)
    e32 = Engine("bs32", model, kv_both(ports[0]), 0, log_dir=str(d), block_size=32)
    e64 = Engine("bs64", model, kv_both(ports[1]), 1, log_dir=str(d), block_size=64)
    plain = Engine("plain", model, None, 0, log_dir=str(d))
    try:
        ref = {tuple(p): t for p, t in zip(ALL, plain.wait_ready().generate(ALL, MAX_TOKENS)["tokens"])}
        plain.close()
        e32.wait_ready()
        e64.wait_ready()
        yield ref, e32, e64
    finally:
        for e in (plain, e64, e32):
            e.close()
    print("\nvLLM unequal block sizes:", RESULTS)


def handoff(p, d, batch, extra=None):
    params = p.generate(batch, 1, [{"do_remote_decode": True}] * len(batch))["kv_transfer_params"]
    assert all(x and x.get("do_remote_prefill") for x in params), params
    return d.generate(batch, MAX_TOKENS, [dict(x, **(extra or {})) for x in params])["tokens"]


def recomputes(e):
    return open(e.log_path).read().count("will recompute")


@pytest.mark.parametrize("direction", ["32->64", "64->32"])
def test_same_tokens_as_one_engine(engines, direction):
    ref, e32, e64 = engines
    p, d, batch = (e32, e64, TO64) if direction == "32->64" else (e64, e32, TO32)
    before = recomputes(d)
    out = handoff(p, d, batch)
    RESULTS[direction] = [(len(pr), out[i] == ref[tuple(pr)]) for i, pr in enumerate(batch)]
    assert recomputes(d) == before, "a pull failed and vLLM recomputed: the tokens prove nothing"
    assert out == [ref[tuple(pr)] for pr in batch]


def test_prefix_hit_ending_inside_a_source_block(engines):
    """The bs-64 decode holds 2 full blocks of HELD; LONGER extends it: only tokens 128.. come from the
    bs-32 prefill, starting inside its grid-aligned group, and the tokens match one engine's."""
    ref, e32, e64 = engines
    assert handoff(e32, e64, HELD) == [ref[tuple(HELD[0])]]
    before = recomputes(e64)
    out = handoff(e32, e64, LONGER)
    assert recomputes(e64) == before
    assert out == [ref[tuple(LONGER[0])]]


@pytest.mark.parametrize("case", ["rot64", "rev64", "rot32", "rev32"])
def test_negative_control_wrong_mapping_changes_tokens(engines, case):
    ref, e32, e64 = engines
    p, d = (e32, e64) if case.endswith("64") else (e64, e32)
    key = "_test_rotate_heads" if case.startswith("rot") else "_test_reverse_blocks"
    before = recomputes(d)
    out = handoff(p, d, NEG[case], {key: True})
    differ = [out[i] != ref[tuple(pr)] for i, pr in enumerate(NEG[case])]
    RESULTS[case] = differ
    assert recomputes(d) == before, "the wrong pull failed instead of landing: the control proves nothing"
    assert all(differ), f"{case}: the wrong mapping did not change the tokens: the test could not fail"


def test_incompatible_layout_is_refused_with_the_reason(engines):
    """A prefill whose params claim another head size: the decode refuses the pull naming the field,
    and vLLM recomputes (same tokens)."""
    ref, e32, e64 = engines
    batch = INCOMPAT
    params = e32.generate(batch, 1, [{"do_remote_decode": True}])["kv_transfer_params"]
    lay = params[0]["kvblocks"]["layout"]
    lay["block_shape"][3] *= 2
    lay["block_bytes"] *= 2
    before = recomputes(e64)
    out = e64.generate(batch, MAX_TOKENS, params)["tokens"]
    assert recomputes(e64) == before + 1
    assert "head_size: ours 32, theirs 64 (a head moves whole)" in open(e64.log_path).read()
    assert out == [ref[tuple(batch[0])]]
