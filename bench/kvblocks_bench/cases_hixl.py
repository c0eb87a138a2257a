# SPDX-License-Identifier: Apache-2.0
"""hixl vs native (group ``hixl``): ``Hixl.transfer_sync`` READ of the same bytes as a native
``pull_kv_blocks``, interleaved with it in the same run. Both sides read the same remote buffer
(registered once as a kvblocks cache of ``tensors`` tensors and once as one hixl region) into the
same local buffer, one desc per (tensor, block) for hixl. Target: within 10 % (ratio <= 1.10).

* ``hixl/<path>/16x4KiB/...``: 16 random 4 KiB blocks of one tensor (64 KiB, 16 descs);
* ``hixl/<path>/large/...``: 8 tensors x 64 random 64 KiB blocks (32 MiB, 512 descs);

on the paths ``inprocess`` (both engines in this process), ``cma`` (the remote side in a second
process: same-host cross-memory attach) and ``tcp`` (kvblocks.Transport=tcp / KVBLOCKS_TRANSPORT=tcp).
"""
from __future__ import annotations

import contextlib
import os

from .common import KiB, Case
from .common import np as _np

SHAPES = {"16x4KiB": (1, 64, 4 * KiB, 16, "small"), "large": (8, 128, 64 * KiB, 64, "large")}
PATHS = ("inprocess", "cma", "tcp")


@contextlib.contextmanager
def _transport_env(transport):
    old = os.environ.get("KVBLOCKS_TRANSPORT")
    os.environ["KVBLOCKS_TRANSPORT"] = transport
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("KVBLOCKS_TRANSPORT")
        else:
            os.environ["KVBLOCKS_TRANSPORT"] = old


class _RemoteSide:
    """The remote buffer, served both by a native LlmDataDist (listening) and a hixl engine."""

    def __init__(self, nt, nb, bb, transport, fill=0):
        import kvblocks as kb
        import kvblocks.hixl as hx
        from kvblocks_bench.harness import free_port

        np = _np()
        self.buf = np.full(nt * nb * bb, fill, np.uint8)
        base = int(self.buf.ctypes.data)
        self.port, hport = free_port(), free_port()
        self.dd = kb.LlmDataDist(1, kb.LlmRole.MIX)
        self.dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{self.port}",
                            kb.OPTION_TRANSPORT: transport})
        self.cache = self.dd.register_kv_cache(kb.CacheDesc(nt, kb.DataType.DT_UINT8, [nb, bb]),
                                               [base + t * nb * bb for t in range(nt)])
        self.name = f"127.0.0.1:{hport}"
        self.hx = hx.Hixl()
        with _transport_env(transport):
            st = self.hx.initialize(self.name)
        if st != hx.SUCCESS or self.hx.register_mem(hx.MemDesc(base, self.buf.size), hx.MEM_DEVICE)[0] != hx.SUCCESS:
            raise RuntimeError(f"hixl server setup failed ({st})")
        self.info = (base, self.port, self.name, self.cache.cache_id)

    def finalize(self):
        self.hx.finalize()
        self.dd.finalize()


def _serve(conn, nt, nb, bb, transport):
    """The remote side in a second process (cma): serves until told to quit."""
    side = _RemoteSide(nt, nb, bb, transport)
    side.buf[:] = _np().arange(side.buf.size, dtype=_np().uint64).astype(_np().uint8)
    conn.send(side.info)
    while True:
        msg = conn.recv()
        if msg[0] == "bytes":
            conn.send(bytes(side.buf[msg[1]:msg[1] + msg[2]]))
        else:
            break
    side.finalize()
    conn.send("bye")


class _ChildSide:
    def __init__(self, h, nt, nb, bb, transport):
        self.conn, child = h.ctx.Pipe()
        self.proc = h.ctx.Process(target=_serve, args=(child, nt, nb, bb, transport), daemon=True)
        self.proc.start()
        if not self.conn.poll(120):
            raise RuntimeError("hixl bench peer did not start")
        self.info = self.conn.recv()

    def read(self, off, n):
        self.conn.send(("bytes", off, n))
        return self.conn.recv()

    def finalize(self):
        try:
            self.conn.send(("quit",))
            self.conn.poll(30)
        finally:
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()


class _Setup:
    """Both sides of one (path, shape): native and hixl, linked, over the same buffers."""

    def __init__(self, h, path, shape):
        import kvblocks as kb
        import kvblocks.hixl as hx

        np = _np()
        nt, nb, bb, B, _ = SHAPES[shape]
        transport = "tcp" if path == "tcp" else "auto"
        if path == "cma":
            self.remote = _ChildSide(h, nt, nb, bb, transport)
        else:
            self.remote = _RemoteSide(nt, nb, bb, transport)
            self.remote.buf[:] = np.arange(self.remote.buf.size, dtype=np.uint64).astype(np.uint8)
        rbase, port, hname, cache_id = self.remote.info
        self.tensor_bytes = nb * bb
        self.local = np.zeros(nt * nb * bb, np.uint8)
        lbase = int(self.local.ctypes.data)
        self.dd = kb.LlmDataDist(2, kb.LlmRole.MIX)
        self.dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: transport})
        self.cache = self.dd.register_kv_cache(kb.CacheDesc(nt, kb.DataType.DT_UINT8, [nb, bb]),
                                               [lbase + t * nb * bb for t in range(nt)])
        rets = self.dd.link_llm_clusters([kb.ClusterInfo(1, 0, [kb.IpInfo("127.0.0.1", 0)],
                                                         [kb.IpInfo("127.0.0.1", port)])], 10000)
        if rets != [kb.Status.LLM_SUCCESS]:
            raise RuntimeError(f"native link failed: {rets}")
        self.link_path = self.dd.link_path(1)
        self.hx, self.hname = hx.Hixl(), hname
        with _transport_env(transport):
            self.hx.initialize("127.0.0.1")
        if self.hx.register_mem(hx.MemDesc(lbase, self.local.size), hx.MEM_DEVICE)[0] != hx.SUCCESS or \
                self.hx.connect(hname, 10000) != hx.SUCCESS:
            raise RuntimeError("hixl client setup failed")
        rng = np.random.default_rng(10)
        self.src = rng.choice(nb, B, replace=False).astype(np.uint64)
        self.dst = rng.choice(nb, B, replace=False).astype(np.uint64)
        self.index = kb.CacheIndex(1, cache_id)
        self.descs = [hx.TransferOpDesc(lbase + t * nb * bb + int(d) * bb, rbase + t * nb * bb + int(s) * bb, bb)
                      for t in range(nt) for s, d in zip(self.src, self.dst)]
        self.bb, self.nt = bb, nt
        self.bytes = nt * B * bb

    def remote_bytes(self, off, n):
        r = self.remote
        return r.read(off, n) if isinstance(r, _ChildSide) else bytes(r.buf[off:off + n])

    def check(self):
        """Bad blocks in the local buffer after a transfer (compared with the remote bytes)."""
        bad = 0
        for t in range(self.nt):
            for s, d in zip(self.src, self.dst):
                lo = t * self.tensor_bytes + int(d) * self.bb
                ro = t * self.tensor_bytes + int(s) * self.bb
                bad += bytes(self.local[lo:lo + self.bb]) != self.remote_bytes(ro, self.bb)
        return bad

    def finalize(self):
        self.hx.finalize()
        self.dd.finalize()
        self.remote.finalize()


def _setup(h, path, shape):
    key = f"hixl/{path}/{shape}"
    if key not in h.locals:  # the harness finalizes it at the end of the run
        h.locals[key] = _Setup(h, path, shape)
    return h.locals[key]


def _native_make(path, shape):
    def make(h):
        s = _setup(h, path, shape)
        pull, idx, cache, src, dst = s.dd.pull_kv_blocks, s.index, s.cache, s.src, s.dst

        def fn():
            pull(idx, cache, src, dst)

        def verify():
            s.local[:] = 0
            fn()
            return s.check()

        return fn, verify
    return make


def _hixl_make(path, shape):
    def make(h):
        import kvblocks.hixl as hx

        s = _setup(h, path, shape)
        xfer, name, descs, READ = s.hx.transfer_sync, s.hname, s.descs, hx.READ

        def fn():
            st = xfer(name, READ, descs, 10000)
            if st:
                raise RuntimeError(f"transfer_sync failed: {st}")

        def verify():
            s.local[:] = 0
            fn()
            return s.check()

        return fn, verify
    return make


def hixl_cases():
    """The hixl group: for each path and shape, the native pull (baseline) then transfer_sync.
    Raises nothing."""
    out = []
    for shape, (nt, nb, bb, B, reps) in SHAPES.items():
        for path in PATHS:
            base = f"hixl/{path}/{shape}/native"
            what = f"{nt} tensor(s) x {B} random {bb // KiB} KiB blocks"
            out.append(Case(base, "hixl", _native_make(path, shape), blocks=nt * B, bytes=nt * B * bb, reps=reps,
                            pgroup=f"hixl-{path}-{shape}", note=f"native pull_kv_blocks, {what}"))
            out.append(Case(f"hixl/{path}/{shape}/transfer_sync", "hixl", _hixl_make(path, shape), baseline=base,
                            blocks=nt * B, bytes=nt * B * bb, reps=reps, pgroup=f"hixl-{path}-{shape}",
                            note=f"Hixl.transfer_sync READ of the same bytes, {nt * B} descs"))
    return out
