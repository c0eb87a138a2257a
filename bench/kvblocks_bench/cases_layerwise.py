# SPDX-License-Identifier: Apache-2.0
"""Layer-wise pipeline (group ``layerwise``): 80 layers pushed over TCP to the peer process while a
simulated compute produces them. Three rows from the same interleaved rounds:

* ``layerwise/compute-80``: the compute alone (80 layer steps);
* ``layerwise/serial-80``: compute every layer, then one ``push_kv_blocks`` of all of them;
* ``layerwise/pipeline-80``: ``open_layer_push``, then per layer compute + ``layer_ready``, then
  ``finish``.

The compute of one layer is ``time.sleep`` for one layer's transfer time, measured first (the
longer of the median push of one layer alone and the median push of all layers divided by their
number): a sleep stands for an accelerator kernel the host waits on, so the host's cores stay
free for the transfer, as in serving. Target: the pipeline hides >= 80 % of the transfer time,
``(serial - pipeline) / (serial - compute)``.
"""
from __future__ import annotations

import statistics
import time

from .common import KiB, Case
from .common import np as _np
from .markers import check_blocks, mark_blocks

LAYERS, TNPL, NB, BB = 80, 2, 32, 16 * KiB  # 2 tensors x 32 blocks x 16 KiB = 1 MiB a layer
ROUNDS, CALIBRATE = 11, 15


def _setup(h):
    import kvblocks as kb

    st = getattr(h, "_layerwise", None)
    if st is not None:
        return st
    p = h.pair("tcp", LAYERS * TNPL, NB, BB)
    blocks = list(range(NB))
    one, bulk = [], []
    for _ in range(CALIBRATE):  # push of layer 5 alone, and of all layers (per layer)
        t = time.perf_counter()
        p.dd.push_kv_blocks(p.cache, p.index, blocks, blocks, kb.KvCacheExtParam((5, 5), (5, 5), TNPL))
        one.append(time.perf_counter() - t)
    for _ in range(5):
        t = time.perf_counter()
        p.dd.push_kv_blocks(p.cache, p.index, blocks, blocks)
        bulk.append((time.perf_counter() - t) / LAYERS)
    # the layer's transfer time: alone or as part of the whole push, whichever is longer
    layer_s = max(statistics.median(one), statistics.median(bulk))
    st = {"pair": p, "blocks": blocks, "layer_s": layer_s, "samples": None}
    h._layerwise = st
    return st


def _variants(st):
    p, blocks, step = st["pair"], st["blocks"], st["layer_s"]
    sleep, push, open_push = time.sleep, p.dd.push_kv_blocks, p.dd.open_layer_push
    cache, idx = p.cache, p.index

    def compute():
        for _ in range(LAYERS):
            sleep(step)

    def serial():
        compute()
        push(cache, idx, blocks, blocks)

    def pipeline():
        lp = open_push(cache, idx, blocks, blocks, TNPL)
        for layer in range(LAYERS):
            sleep(step)
            lp.layer_ready(layer)
        lp.finish()

    return {"compute": compute, "serial": serial, "pipeline": pipeline}


def _measure(h, scale):
    st = _setup(h)
    if st["samples"] is None:
        fns = _variants(st)
        out = {k: [] for k in fns}
        for k, fn in fns.items():  # warm-up
            fn()
        for _ in range(max(3, int(ROUNDS * scale))):
            for k, fn in fns.items():  # interleaved: every round sees the same load
                t = time.perf_counter()
                fn()
                out[k].append(time.perf_counter() - t)
        st["samples"] = out
    return st


def _case(name, baseline, note):
    def make(h):
        st = _setup(h)
        fn = _variants(st)[name]

        def verify():  # one checked pipeline round: every block of every layer carries its marker
            if name != "pipeline":
                return None
            p, blocks = st["pair"], st["blocks"]
            nonce = next(h.nonce)
            mark_blocks(p.arrays, _np().asarray(blocks), nonce)
            _variants(st)["pipeline"]()
            return p.peer.call("check", p.rkey, blocks, blocks, nonce)

        return fn, (verify if name == "pipeline" else None)

    def custom(h):
        return _measure(h, 1.0)["samples"][name]

    c = Case(f"layerwise/{name}-{LAYERS}", "layerwise", make, baseline=baseline, reps="large", path="tcp",
             bytes=LAYERS * TNPL * NB * BB if name != "compute" else 0, blocks=LAYERS * TNPL * NB,
             pgroup="layerwise", note=note)
    c.custom = custom
    return c


def layerwise_cases():
    """The layerwise group: compute alone, serial, pipeline (in this order). Raises nothing."""
    what = f"{LAYERS} layers x {TNPL} tensors x {NB} blocks of {BB // KiB} KiB over TCP"
    return [
        _case("compute", None, f"simulated compute alone: {LAYERS} x time.sleep(one layer's push time)"),
        _case("serial", f"layerwise/compute-{LAYERS}", f"compute all layers, then push_kv_blocks ({what})"),
        _case("pipeline", f"layerwise/serial-{LAYERS}", f"open_layer_push; per layer compute + layer_ready; "
              f"finish ({what})"),
    ]


def hidden_fraction(compute_s, serial_s, pipeline_s):
    """Share of the transfer time hidden behind the compute. Raises nothing (0 when undefined)."""
    transfer = serial_s - compute_s
    return (serial_s - pipeline_s) / transfer if transfer > 0 else 0.0
