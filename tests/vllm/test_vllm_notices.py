# SPDX-License-Identifier: Apache-2.0
"""The connector's worker side (``_WorkerSide``: its kvblocks engine, registration, pulls and notices)
without a vLLM engine: a prefill worker and a decode worker over a real link, with real torch KV tensors,
and attackers in their own processes (tests/notice_peer.py: a kvblocks engine holding the token).

These replace the side channel's attack tests: the same attacks now go through the runtime's
notifications, and must still fail (a done from a decode the request was not handed to, a flood of
done ids, oversize and deeply nested messages, a prefill without the token, a prefill lying about its
layout). Only the connector object around the worker is a stand-in (its parsed options and ids); the
engines, links, tensors and notices are real.
"""
import os
import sys
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.base")

import kvblocks as kb  # noqa: E402
from kvblocks.integrations import layouts, notices  # noqa: E402
from kvblocks.vllm.connector import (PARAMS_KEY, KvblocksConnectorMetadata, _Options, _PushJob,  # noqa: E402
                                     _RecvJob, _WorkerSide)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from ports import free_port  # noqa: E402
from procs import Peer as Proc  # noqa: E402

pytestmark = pytest.mark.vllm

TOKEN = "s3cret"
LAYERS, BLOCKS, SHAPE = 4, 16, (2, 32, 2, 32)  # as engine_proc's model: K/V x 32 tokens x 2 heads x 32


def kv_layout(layers=LAYERS):
    page = 2 * 32 * 2 * 32 * 2
    return layouts.Layout(layers, BLOCKS, page, "bfloat16", SHAPE, 32, (("spec", "FullAttentionSpec"),))


def worker(role, engine_id, port=0, token=TOKEN, layers=LAYERS, **extra):
    cfg = dict(extra, auth_token=token, pull_timeout_ms=1000, link_timeout_ms=1000)
    if role == "kv_producer":
        cfg["listen"] = f"127.0.0.1:{port}"
    c = SimpleNamespace(_opts=_Options.parse(cfg), _engine_id=engine_id, _kv_role=role,
                        _is_producer=role == "kv_producer", _is_consumer=role == "kv_consumer",
                        _layout=kv_layout(layers))
    w = _WorkerSide(c)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(hash(engine_id) & 0xFFFF)
    kv = {f"model.layers.{i}.self_attn.attn": torch.randn((BLOCKS, *SHAPE), generator=gen).to(torch.bfloat16)
          for i in range(layers)}
    w.register(kv)
    w.kv = kv
    return w


def handed_off(prefill, rid, blocks, port, lease=60.0):
    """What the prefill's scheduler does at request_finished (a ticket) and its worker at the next step
    (hold); returns the params the client carries to the decode."""
    ticket = notices.new_ticket()
    prefill.start(KvblocksConnectorMetadata(reqs_to_send={rid: (lease, ticket)}))
    return {"do_remote_prefill": True, PARAMS_KEY: {
        "engine_id": prefill.c._engine_id, "request_id": rid, "host": "127.0.0.1", "port": port,
        "block_ids": blocks, "num_tokens": 32 * len(blocks), "layout": prefill.layout.to_dict(), "ticket": ticket}}


def steps(w, until, timeout=10.0):
    """Step a worker (get_finished) until ``until(sending, recving)`` or the timeout; all it returned."""
    sent, recv = set(), set()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s, r = w.finished()
        sent |= s
        recv |= r
        if until(sent, recv):
            break
        time.sleep(0.005)
    return sent, recv


@pytest.fixture
def pair():
    port = free_port()
    p = worker("kv_producer", "prefill-0", port)
    d = worker("kv_consumer", "decode-0")
    yield p, d, port
    d.shutdown()
    p.shutdown()


def third(port):
    x = Proc(303, argv=[os.path.join(os.path.dirname(HERE), "notice_peer.py"), "--cluster", "303", "--holder",
                        str(p_cluster()), "--port", str(port), "--auth", TOKEN])
    assert x.info["ready"], x.info
    return x


def p_cluster():
    from kvblocks.integrations.peers import cluster_id_of
    return cluster_id_of("prefill-0")


def pull(p, d, rid, src, dst, port, extra=None):
    params = handed_off(p, rid, src, port)
    if extra:
        params.update(extra)
    d.start(KvblocksConnectorMetadata(reqs_to_recv={rid: _RecvJob(rid, dst, src, params)}))
    return params


def test_pull_lands_the_bytes_and_done_frees_the_prefill_blocks(pair):
    p, d, port = pair
    pull(p, d, "req-1", [3, 5, 7], [0, 1, 2], port)
    _, recv = steps(d, lambda s, r: "req-1" in r)
    assert recv == {"req-1"} and d.take_load_errors() == set()
    for name in p.kv:
        assert torch.equal(d.kv[name][[0, 1, 2]], p.kv[name][[3, 5, 7]])
    sent, _ = steps(p, lambda s, r: "req-1" in s)
    assert sent == {"req-1"}  # freed by the decode's done, long before the 60 s lease


def test_negative_control_reversed_blocks_land_elsewhere(pair):
    p, d, port = pair
    pull(p, d, "req-1", [3, 5, 7], [0, 1, 2], port, extra={"_test_reverse_blocks": True})
    d.c._opts.test_reverse_blocks = "per_request"
    steps(d, lambda s, r: "req-1" in r)
    name = next(iter(p.kv))
    assert not torch.equal(d.kv[name][[0, 1, 2]], p.kv[name][[3, 5, 7]])


def test_done_from_a_decode_the_request_was_not_handed_to_is_refused(pair):
    p, d, port = pair
    params = handed_off(p, "req-2", [1, 2], port)
    x = third(port)
    try:
        for kind in ("done", "abort"):
            x.call(op="send", kind=kind, rid="req-2", ticket=notices.new_ticket())
        sent, _ = steps(p, lambda s, r: p.holder.stats.refused.get("wrong ticket") == 2, timeout=3)
        assert sent == set() and p.holder.stats.refused == {"wrong ticket": 2}
        d.start(KvblocksConnectorMetadata(reqs_to_recv={"req-2": _RecvJob("req-2", [4, 5], [1, 2], params)}))
        steps(d, lambda s, r: "req-2" in r)
        sent, _ = steps(p, lambda s, r: "req-2" in s)
        assert sent == {"req-2"} and p.holder.owner("req-2") is None
    finally:
        x.close(kill=True)


def test_done_ids_bounded_in_length_count_and_memory(pair):
    p, d, port = pair
    params = handed_off(p, "req-3", [1], port)
    x = third(port)
    try:
        res = x.call(op="flood", n=5000, timeout=120)
        assert res["stopped"], res
        p.finished()
        assert len(p.holder) <= 1 + p.holder.max_early
        x.call(op="raw", name=notices.NAME, message='{"k":"done","r":"' + "r" * 900 + '","t":"x"}')
        p.finished()
        assert p.holder.owner("req-3") is None and len(p.holder) <= 1 + p.holder.max_early
        d.start(KvblocksConnectorMetadata(reqs_to_recv={"req-3": _RecvJob("req-3", [2], [1], params)}))
        steps(d, lambda s, r: "req-3" in r)
        sent, _ = steps(p, lambda s, r: "req-3" in s)
        assert sent == {"req-3"}
    finally:
        x.close(kill=True)


def test_deeply_nested_json_is_dropped_and_serving_goes_on(pair):
    p, d, port = pair
    x = third(port)
    try:
        for msg in ("[" * 1024, "{" * 1000, '"' + "\\" * 1000):
            x.call(op="raw", name=notices.NAME, message=msg)
        p.finished()
        assert sum(p._inbox.dropped.values()) == 3
        pull(p, d, "req-4", [2], [3], port)
        steps(d, lambda s, r: "req-4" in r)
        assert steps(p, lambda s, r: "req-4" in s)[0] == {"req-4"}
    finally:
        x.close(kill=True)


def test_decode_tells_nothing_to_a_prefill_without_the_token():
    """A prefill that lacks the token (an impostor at the address in the params): the decode never links,
    pulls or notifies; the request's blocks are reported for recompute."""
    port = free_port()
    fake = worker("kv_producer", "prefill-0", port, token="not-the-token")
    d = worker("kv_consumer", "decode-0")
    try:
        params = handed_off(fake, "req-5", [1], port)
        d.start(KvblocksConnectorMetadata(reqs_to_recv={"req-5": _RecvJob("req-5", [2], [1], params)}))
        _, recv = steps(d, lambda s, r: "req-5" in r)
        assert recv == {"req-5"} and d.take_load_errors() == {2}
        time.sleep(0.2)
        assert fake.dd.get_notifies() == [] and fake.dd.metrics()["peers"] == [] or \
            all(pp["links"] == 0 for pp in fake.dd.metrics()["peers"])
    finally:
        d.shutdown()
        fake.shutdown()


def test_a_prefill_whose_cache_does_not_match_its_params_is_refused(caplog):
    """Params claim our layout; the prefill's registered cache (what its link announced) has 2 layers:
    refused before any pull, saying so; the honest params are refused before linking, naming the field."""
    port = free_port()
    p = worker("kv_producer", "prefill-0", port, layers=2)
    d = worker("kv_consumer", "decode-0")
    try:
        params = handed_off(p, "req-6", [1], port)
        params[PARAMS_KEY]["layout"] = kv_layout().to_dict()  # the lie
        d.start(KvblocksConnectorMetadata(reqs_to_recv={"req-6": _RecvJob("req-6", [2], [1], params)}))
        _, recv = steps(d, lambda s, r: "req-6" in r)
        assert recv == {"req-6"} and d.take_load_errors() == {2}
        assert "registered KV cache does not match its params: num_layers: ours 4, theirs 2" in caplog.text
        params = handed_off(p, "req-7", [1], port)  # the honest params: refused before linking, precisely
        d.start(KvblocksConnectorMetadata(reqs_to_recv={"req-7": _RecvJob("req-7", [2], [1], params)}))
        steps(d, lambda s, r: "req-7" in r)
        assert d.take_load_errors() == {2}
        assert "cannot be moved into ours: num_layers: ours 4, theirs 2 (kvblocks maps layer l to layer l)" \
            in caplog.text
    finally:
        d.shutdown()
        p.shutdown()


def push_pair(port, **extra):
    return worker("kv_producer", "prefill-0", port, **extra), worker("kv_consumer", "decode-0", **extra)


def layer_wise(p, d, port, xfer, src, dst, rid="req-p", extra=None, offset=0):
    """The decode reserves ``dst`` (its scheduler's job), the prefill computes every layer (its forward
    calls save_kv_layer per layer, then wait_for_save) and pushes ``src[offset:]`` as it goes."""
    params = {"do_remote_prefill": True, PARAMS_KEY: {"mode": "push", "xfer": xfer, "engine_id": "prefill-0",
                                                      "host": "127.0.0.1", "port": port}}
    params.update(extra or {})
    d.start(KvblocksConnectorMetadata(reqs_to_recv={rid: _RecvJob(rid, dst, [], params, push_offset=offset)}))
    pushes = {"p-" + rid: _PushJob(xfer, "decode-0", src)}  # the prefill step's metadata (bound before forward)
    for name in p.kv:  # layer order
        p.layer_computed(name, pushes)
    p.finish_pushes()
    return steps(d, lambda s, r: rid in r)[1]


def test_layer_wise_push_lands_every_layer_in_the_reserved_blocks():
    port = free_port()
    p, d = push_pair(port)
    try:
        assert layer_wise(p, d, port, "x1", [3, 5, 7, 9], [0, 1, 2], offset=1) == {"req-p"}
        assert d.take_load_errors() == set()
        for name in p.kv:
            assert torch.equal(d.kv[name][[0, 1, 2]], p.kv[name][[5, 7, 9]])
        assert p.reservations is not None and len(p.reservations) == 0
    finally:
        d.shutdown()
        p.shutdown()


def test_negative_control_push_into_reversed_blocks_lands_elsewhere():
    port = free_port()
    p, d = push_pair(port, _test_reverse_blocks="per_request")
    try:
        layer_wise(p, d, port, "x2", [3, 5, 7], [0, 1, 2], extra={"_test_reverse_blocks": True})
        name = next(iter(p.kv))
        assert not torch.equal(d.kv[name][[0, 1, 2]], p.kv[name][[3, 5, 7]])
        assert torch.equal(d.kv[name][[2, 1, 0]], p.kv[name][[3, 5, 7]])
    finally:
        d.shutdown()
        p.shutdown()


def test_a_third_engines_reservation_is_never_pushed_to():
    """X (token holder) reserves the transfer id first, with its own blocks: the prefill pushes only to
    the decode its params name; X gets nothing, the decode gets the KV."""
    port = free_port()
    p, d = push_pair(port)
    x = third(port)
    try:
        x.call(op="raw", name=notices.NAME, message=notices.encode_reserve("x3", notices.new_ticket(), [1], 0))
        p.finished()  # X's reservation is in the table now
        assert layer_wise(p, d, port, "x3", [3], [4]) == {"req-p"}
        name = next(iter(p.kv))
        assert torch.equal(d.kv[name][4], p.kv[name][3])
        assert len(p.reservations) == 1  # X's, unused
    finally:
        x.close(kill=True)
        d.shutdown()
        p.shutdown()


def test_an_aborted_push_is_recomputed():
    """The prefill cannot push (it has fewer blocks than the decode reserved): it says abort, and the
    decode reports its blocks for recompute instead of as loaded."""
    port = free_port()
    p, d = push_pair(port)
    try:
        assert layer_wise(p, d, port, "x4", [3], [0, 1]) == {"req-p"}
        assert d.take_load_errors() == {0, 1}
    finally:
        d.shutdown()
        p.shutdown()
