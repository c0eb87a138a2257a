# SPDX-License-Identifier: Apache-2.0
"""Baselines measured beside the kvblocks cases: numpy memcpy and block gather, raw CMA
syscalls, a raw loopback socket (sink, source, 8-byte ping-pong and a block round trip), the same
sink and source through Python's ``ssl`` (the system's OpenSSL used directly) and a pure-Python
block-list check."""
from __future__ import annotations

import functools
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

from .common import MiB, SIZES, Case, human_bytes
from .common import np as _np
from .markers import id_lists

RAW_BLOCKS_ID = "tcp/raw-blocks-16x4KiB"
RAW_BLOCK_LISTS = 64  # id lists cycled through, as the pull cycles through its own
RAW_BLOCK_SEED = 7  # both ends draw the same id lists
RAW_BLOCK_BYTES = 2 * SIZES["small"][0] * SIZES["small"][3] * SIZES["small"][2]  # 2L tensors x B blocks


# ----------------------------------------------------------------------------- raw socket server (peer side)
def raw_server(lsock):
    """Accepts connections on ``lsock`` until it is closed, one serving thread each. Raises nothing."""
    while True:
        try:
            conn, _ = lsock.accept()
        except OSError:
            return
        threading.Thread(target=_raw_conn, args=(conn,), daemon=True).start()


def _recv_exact(conn, mv):
    got = 0
    while got < len(mv):
        k = conn.recv_into(mv[got:min(len(mv), got + 4 * MiB)])
        if not k:
            raise EOFError
        got += k


def _libc_io(name):
    """libc ``send`` or ``recv`` through ctypes (no GIL held while it runs). Raises nothing."""
    import ctypes

    f = getattr(ctypes.CDLL(None, use_errno=True), name)
    f.restype = ctypes.c_ssize_t
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return f


def c_stream(fd, base, nbytes, step, io):
    """Moves ``nbytes`` at address ``base`` through socket ``fd`` with libc ``io`` (send or recv),
    at most ``step`` bytes a call. Raises OSError when a call fails or the peer closes."""
    import ctypes

    off = 0
    while off < nbytes:
        n = io(fd, base + off, min(step, nbytes - off), 0)
        if n <= 0:
            raise OSError(ctypes.get_errno(), "send/recv failed or the peer closed")
        off += n


def block_views(side):
    """RAW_BLOCK_LISTS lists of ``(block index, memoryview)`` for one end of the raw block round trip,
    B random blocks per tensor as the pull takes them (``side`` 0: the source ids, 1: the destination
    ids of the same id lists), over a bytearray shaped as the small pull's cache (2L tensors of nb
    blocks, every block filled with :func:`block_byte` on the source side, 0 on the destination
    side) that the views keep alive. Raises nothing."""
    L, nb, bb, B = SIZES["small"]
    cache = bytearray(2 * L * nb * bb)
    for i in range(2 * L * nb):  # every page written: nothing reads the shared zero page
        cache[i * bb:(i + 1) * bb] = bytes([block_byte(i) if side == 0 else 0]) * bb
    mv = memoryview(cache)
    lists = id_lists(_np().random.default_rng(RAW_BLOCK_SEED), nb, B, "random", RAW_BLOCK_LISTS)
    return [[(t * nb + int(b), mv[(t * nb + int(b)) * bb:(t * nb + int(b) + 1) * bb])
             for t in range(2 * L) for b in ids[side]] for ids in lists]


def block_byte(i):
    """The byte every byte of source block ``i`` (tensor-major) holds. Raises nothing."""
    return i % 251 + 1


def _move_views(io, views, nbytes):
    """All ``nbytes`` of ``views`` through one ``sendmsg``/``recvmsg_into`` call ``io`` (more on a
    short count). Raises EOFError when the peer closes, OSError on socket errors."""
    n = io(views)
    while n < nbytes:
        if n <= 0:
            raise EOFError
        nbytes -= n
        while n >= len(views[0]):
            n -= len(views[0])
            views = views[1:]
        views = [views[0][n:]] + views[1:]
        n = io(views)


def tls_baseline_available():
    """Whether the raw TLS baselines can run: Python's ssl module and the ``openssl`` command (which
    makes their throwaway certificate). Raises nothing."""
    try:
        import ssl  # noqa: F401
    except ImportError:
        return False
    return shutil.which("openssl") is not None


@functools.lru_cache(maxsize=None)
def _tls_context(server):
    """A TLS 1.3 context of Python's ssl module: the server's with a throwaway self-signed P-256
    certificate made by the ``openssl`` command, the client's verifying nothing (a benchmark over
    loopback). Raises OSError or subprocess.CalledProcessError when the certificate cannot be made."""
    import ssl

    if not server:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    else:
        d = tempfile.mkdtemp(prefix="kvb-bench-tls-")
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=kvblocks-bench"],
                       check=True, capture_output=True, timeout=60)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        shutil.rmtree(d, ignore_errors=True)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    return ctx


def _raw_conn(conn):
    """'S' = sink (8-byte length, payload, 1-byte ack), 'R' = source (8-byte length; the payload
    back, C send() of 1 MiB writes), 'P' = 8-byte echo, 'B' = block source (an 8-byte list index;
    that list's blocks back in one sendmsg); 'T' and 'U': 'S' and 'R' inside TLS 1.3 (Python's ssl,
    the payload in one sendall)."""
    import ctypes

    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    mode = conn.recv(1)
    if mode in (b"T", b"U"):
        conn = _tls_context(True).wrap_socket(conn, server_side=True)
    hdr = bytearray(8)
    buf = bytearray(1)
    send = _libc_io("send")
    src = [[v for _, v in views] for views in block_views(0)] if mode == b"B" else None
    try:
        while True:
            _recv_exact(conn, memoryview(hdr))
            if mode == b"P":
                conn.sendall(hdr)
                continue
            if mode == b"B":
                _move_views(conn.sendmsg, src[int.from_bytes(hdr, "little") % RAW_BLOCK_LISTS], RAW_BLOCK_BYTES)
                continue
            n = int.from_bytes(hdr, "little")
            if len(buf) < n:
                buf = bytearray(n)
            if mode == b"R":
                c_stream(conn.fileno(), ctypes.addressof((ctypes.c_char * n).from_buffer(buf)), n, MiB, send)
                continue
            if mode == b"U":
                conn.sendall(memoryview(buf)[:n])
                continue
            _recv_exact(conn, memoryview(buf)[:n])
            conn.sendall(b"k")
    except (EOFError, OSError):
        conn.close()


def _raw_socket(h, mode):
    s = socket.create_connection(("127.0.0.1", h.raw_port()))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(mode)
    h.sockets.append(s)
    return s


# ----------------------------------------------------------------------------- cases
def memcpy_case(nbytes, id=None, group="base", pgroup=None, reps=None):
    """``np.copyto`` of ``nbytes``. Raises nothing (the case's ``make`` raises MemoryError if it must)."""
    def make(h):
        np = _np()
        src = np.full(nbytes, 7, dtype=np.uint8)
        dst = np.zeros(nbytes, dtype=np.uint8)
        copyto = np.copyto
        return (lambda: copyto(dst, src)), None

    rep = reps or ("large" if nbytes >= 16 * MiB else "small")
    return Case(id or f"base/memcpy/{human_bytes(nbytes)}", group, make, bytes=nbytes, reps=rep,
                fast=nbytes <= 256 * 1024, pgroup=pgroup)


def gather_case(size, pattern):
    """numpy gather (``np.take``) of the same blocks as the ``size``/``pattern`` transfer cases,
    one process. Raises nothing."""
    L, nb, bb, B = SIZES[size]

    def make(h):
        np = _np()
        rng = np.random.default_rng(7)
        src = [np.full((nb, bb), t, dtype=np.uint8) for t in range(2 * L)]
        out = np.zeros((2 * L, B, bb), dtype=np.uint8)
        it = itertools.cycle([(s.astype(np.intp), d) for s, d in id_lists(rng, nb, B, pattern, 64)])
        take = np.take

        def fn():
            s, _ = next(it)
            for t in range(2 * L):
                take(src[t], s, axis=0, out=out[t], mode="clip")  # "raise" would buffer out (2 copies)
        return fn, None

    return Case(f"base/gather/{size}/{pattern}", "base", make, bytes=2 * L * B * bb, blocks=2 * L * B,
                reps=size, note="np.take of the blocks into a staging array, one process",
                pgroup=f"samehost-{size}")


def _cma_call(direction):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    f = libc.process_vm_readv if direction == "pull" else libc.process_vm_writev
    f.restype = ctypes.c_ssize_t
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    return f, ctypes.get_errno


def _cma_iovecs(p, raddrs, direction, pattern, B):
    """(local, remote) iovec arrays, one iovec per block, for 8 id lists."""
    np = _np()
    la = np.array([a.ctypes.data for a in p.arrays], dtype=np.uint64)[:, None]
    ra = np.array(raddrs, dtype=np.uint64)[:, None]
    prepared = []
    for s, d in id_lists(np.random.default_rng(3), p.nb, B, pattern, 8):
        remote, local = (s, d) if direction == "pull" else (d, s)
        liov = np.empty((p.nt * B, 2), dtype=np.uint64)
        riov = np.empty((p.nt * B, 2), dtype=np.uint64)
        liov[:, 0] = (la + local[None, :] * np.uint64(p.bb)).ravel()
        riov[:, 0] = (ra + remote[None, :] * np.uint64(p.bb)).ravel()
        liov[:, 1] = p.bb
        riov[:, 1] = p.bb
        prepared.append((liov, riov))
    return prepared


def raw_cma_fn(p, direction, pattern, B, threads=1, repeat=1):
    """A call of process_vm_readv/writev over the blocks of pair ``p`` (B per tensor, one iovec per
    block, 1024 per syscall, iovecs built before timing), from this thread, or split over
    ``threads`` threads each pinned to its own CPU (kept between calls; ctypes releases the GIL
    around each syscall; unpinned, the VM's scheduler often wakes a helper on its caller's CPU).
    With ``repeat`` > 1 each thread copies its share of that many calls in a row, so that the
    hand-off to the threads (tens of us) is paid once per ``repeat`` calls. Raises nothing; the
    function raises OSError when a syscall moves fewer bytes."""
    pid, raddrs = p.peer.call("addrs", p.rkey)
    f, errno = _cma_call(direction)
    it = itertools.cycle(_cma_iovecs(p, raddrs, direction, pattern, B))
    n, bb = p.nt * B, p.bb
    cuts = [n * i // threads for i in range(threads + 1)]

    def part(lp, rp, lo, hi):
        for k in range(lo, hi, 1024):
            m = min(1024, hi - k)
            if f(pid, lp + k * 16, m, rp + k * 16, m, 0) != m * bb:
                raise OSError(errno(), "process_vm_readv/writev failed")

    if threads == 1:
        def fn():
            liov, riov = next(it)
            part(liov.ctypes.data, riov.ctypes.data, 0, n)
        return fn
    cpus = sorted(os.sched_getaffinity(0))
    pool = [ThreadPoolExecutor(1, initializer=os.sched_setaffinity, initargs=(0, {cpus[t % len(cpus)]}))
            for t in range(threads)]

    def share(calls, t):
        for liov, riov in calls:
            part(liov.ctypes.data, riov.ctypes.data, cuts[t], cuts[t + 1])

    def fn():
        calls = [next(it) for _ in range(repeat)]
        for r in [pool[t].submit(share, calls, t) for t in range(threads)]:
            r.result()
    return fn


def raw_cma_case(size, direction, pattern, threads=1):
    """process_vm_readv/writev through ctypes on the same blocks of the peer's registered arrays:
    one iovec per block, 1024 per syscall, iovecs built before timing (the kernel's CMA cost), from
    one thread or split over ``threads`` (``base/raw-cma-all/...``: the kernel's floor on all
    cores). Raises nothing; the case's ``fn`` raises OSError when a syscall moves fewer bytes."""
    L, nb, bb, B = SIZES[size]

    def make(h):
        return raw_cma_fn(h.pair("cma", 2 * L, nb, bb), direction, pattern, B, threads), None

    kind, how = ("raw-cma", "") if threads == 1 else \
        ("raw-cma-all", f", split over {threads} threads, one pinned to each CPU")
    return Case(f"base/{kind}/{size}/{direction}/{pattern}", "cma", make, baseline=f"base/gather/{size}/{pattern}",
                bytes=2 * L * B * bb, blocks=2 * L * B, reps=size, path="raw",
                note=f"ctypes process_vm_readv/writev, 1 iovec per block, iovecs prebuilt{how}",
                pgroup=f"samehost-{size}")


def raw_send_case(size):
    """Python ``sendall`` of the bytes of one ``size`` call to the peer, which acks with 1 byte.
    Raises nothing; the case's ``fn`` raises RuntimeError on a bad ack, OSError on socket errors."""
    L, nb, bb, B = SIZES[size]
    nbytes = 2 * L * B * bb

    def make(h):
        s = _raw_socket(h, b"S")
        payload = bytearray(nbytes)
        hdr = nbytes.to_bytes(8, "little")

        def fn():
            s.sendall(hdr)
            s.sendall(payload)
            if s.recv(1) != b"k":
                raise RuntimeError("raw sink: bad ack")
        return fn, None

    return Case(f"tcp/raw-send/{size}", "tcp", make, bytes=nbytes, reps=size, path="raw",
                note="Python sendall of the same bytes to the peer process + 1-byte ack", pgroup=f"tcp-{size}")


def raw_tls_case(size, direction):
    """The bytes of one ``size`` call inside TLS 1.3 through Python's ssl module (the system's
    OpenSSL used directly, its default suite): "push" sends them to the peer's TLS sink, which acks;
    "pull" sends an 8-byte request and reads them from the peer's TLS source. Raises nothing; the
    case's ``fn`` raises RuntimeError on a bad ack, EOFError or OSError on socket errors, and its
    ``make`` OSError or subprocess.CalledProcessError when no certificate can be made."""
    L, nb, bb, B = SIZES[size]
    nbytes = 2 * L * B * bb

    def make(h):
        raw = _raw_socket(h, b"T" if direction == "push" else b"U")
        s = _tls_context(False).wrap_socket(raw)
        h.sockets.append(s)
        payload = memoryview(bytearray(nbytes))
        hdr = nbytes.to_bytes(8, "little")

        def fn():
            s.sendall(hdr)
            if direction == "pull":
                _recv_exact(s, payload)
                return
            s.sendall(payload)
            if s.recv(1) != b"k":
                raise RuntimeError("raw TLS sink: bad ack")
        return fn, None

    return Case(f"tls/raw-openssl/{size}/{direction}", "encryption", make, bytes=nbytes, reps=size, path="raw",
                note="Python's ssl (the same libssl, TLS 1.3, its default suite AES-256-GCM) over loopback: "
                     "the same bytes in one sendall, read with recv_into", pgroup=f"encryption-{size}")


# way: (raw server mode, libc call, bytes per call, id, note)
C_STREAMS = {
    "push": (b"S", "send", MiB, "raw-send-c",
             "C send() of the same bytes in 1 MiB writes (libc via ctypes) + 1-byte ack"),
    "pull": (b"R", "recv", 4 * MiB, "raw-recv-c", "the peer's C send() of the same bytes in 1 MiB writes, read with "
             "C recv() of at most 4 MiB: the pull direction"),
}


def c_stream_id(size, way):
    """The case id of :func:`raw_c_stream_case` for ``size`` and ``way``. Raises KeyError for
    another ``way``."""
    return f"tcp/{C_STREAMS[way][3]}/{size}"


def raw_c_stream_case(size, way):
    """The bytes of one ``size`` call streamed through libc via ctypes (one Python step per call, the
    copies in C), ``way`` "push": sent here in 1 MiB writes to the sink of :func:`raw_send_case`,
    which acks; "pull": an 8-byte request, then the peer's 1 MiB writes read here with ``recv()``
    of at most 4 MiB (as the sink reads). Raises KeyError for another ``way``; the case's ``fn``
    raises RuntimeError on a bad ack, OSError on socket errors."""
    mode, call, step, _, note = C_STREAMS[way]
    L, nb, bb, B = SIZES[size]
    nbytes = 2 * L * B * bb

    def make(h):
        io = _libc_io(call)
        s = _raw_socket(h, mode)
        fd = s.fileno()
        payload = _np().zeros(nbytes, dtype=_np().uint8)
        base = payload.ctypes.data
        hdr = nbytes.to_bytes(8, "little")

        def fn():
            assert payload.size == nbytes  # keeps the buffer alive with fn
            s.sendall(hdr)
            c_stream(fd, base, nbytes, step, io)
            if way == "push" and s.recv(1) != b"k":
                raise RuntimeError("raw sink: bad ack")
        return fn, None

    return Case(c_stream_id(size, way), "tcp", make, bytes=nbytes, reps=size, path="raw", note=note,
                pgroup=f"tcp-{size}")


def _variant(case, suffix, note, setting, baseline):
    """``case`` measured with the harness ``setting(h, True)`` in force (undone after its row), as
    ``<id>/<suffix>`` beside ``baseline``. Raises nothing."""
    inner = case.make

    def make(h):
        setting(h, True)
        return inner(h)

    c = Case(f"{case.id}/{suffix}", case.group, make, baseline=baseline, bytes=case.bytes, blocks=case.blocks,
             reps=case.reps, path=case.path, fast=case.fast, note=(case.note + "; " if case.note else "") + note,
             pgroup=case.pgroup)
    undo = case.after  # a variant of a variant undoes both settings

    def after(h):
        setting(h, False)
        if undo is not None:
            undo(h)
    c.after = after
    return c


def loaded(case, baseline=None):
    """``case`` measured while every core runs an unrelated busy loop started for it (and stopped
    after its row), as ``<id>/loaded`` beside ``baseline``. Raises nothing."""
    return _variant(case, "loaded", "every core busy with an unrelated load",
                    lambda h, on: h.cpu_load(on), baseline)


def one_cpu(case, baseline=None):
    """``case`` measured with every thread of this process and of the peers on one CPU (freed again
    after its row), as ``<id>/one-cpu`` beside ``baseline``: the two ends of a round trip then
    share a core, whatever the scheduler would have picked. Raises nothing."""
    return _variant(case, "one-cpu", "both ends pinned to one CPU",
                    lambda h, on: h.one_cpu(on), baseline)


def two_cpus(case, baseline=None):
    """``case`` measured with every thread of this process on one CPU and every thread of the peers
    on another (freed again after its row), as ``<id>/two-cpu`` beside ``baseline``: each end of a
    round trip then wakes on its own core. Raises nothing."""
    return _variant(case, "two-cpu", "each end pinned to its own CPU",
                    lambda h, on: h.two_cpus(on), baseline)


def pingpong_case():
    """An 8-byte request/response round trip with the peer. Raises nothing; the case's ``fn``
    raises OSError on socket errors."""
    def make(h):
        s = _raw_socket(h, b"P")
        msg = b"12345678"

        def fn():
            s.sendall(msg)
            got = s.recv(8)
            while len(got) < 8:
                got += s.recv(8 - len(got))
        return fn, None

    return Case("tcp/raw-pingpong-8B", "tcp", make, bytes=8, reps="small", path="raw",
                note="8-byte request/response round trip, TCP_NODELAY, Python", pgroup="tcp-small")


def raw_blocks_case():
    """The small pull's bytes over a raw socket: an 8-byte request answered with 16 random 4 KiB
    blocks of the peer's cache (B of each of 2L tensors), sent with one ``sendmsg`` and scattered
    into random blocks here with one ``recvmsg_into``, Python at both ends as in the ping-pong.
    What any pull of these blocks costs on top of the ping-pong. Raises nothing; the case's ``fn``
    raises EOFError or OSError on socket errors."""
    def make(h):
        s = _raw_socket(h, b"B")
        lists = block_views(1)
        reqs = [(i.to_bytes(8, "little"), [v for _, v in views]) for i, views in enumerate(lists)]
        it = itertools.cycle(reqs)

        def recv(views):
            return s.recvmsg_into(views, 0, socket.MSG_WAITALL)[0]

        def fn():
            req, views = next(it)
            s.sendall(req)
            _move_views(recv, views, RAW_BLOCK_BYTES)

        def verify():  # list 0 into cleared blocks: each must hold its source block's byte
            src = [i for i, _ in block_views(0)[0]]
            for _, v in lists[0]:
                v[:] = bytes(len(v))
            s.sendall(reqs[0][0])
            _move_views(recv, reqs[0][1], RAW_BLOCK_BYTES)
            return sum(v != bytes([block_byte(i)]) * len(v) for i, (_, v) in zip(src, lists[0]))
        return fn, verify

    return Case(RAW_BLOCKS_ID, "tcp", make, bytes=RAW_BLOCK_BYTES, reps="small", path="raw", pgroup="tcp-small",
                note="8-byte request answered with 16 random 4 KiB blocks, one sendmsg / recvmsg_into, Python")


def gather_rows_case(n, bb, pgroup):
    """numpy gather of n random rows of bb bytes (np.take into a staging array), one process.
    Raises nothing."""
    def make(h):
        np = _np()
        rng = np.random.default_rng(n)
        src = np.full((n, bb), 3, dtype=np.uint8)
        out = np.zeros((n, bb), dtype=np.uint8)
        it = itertools.cycle([rng.permutation(n) for _ in range(3)])
        take = np.take
        return (lambda: take(src, next(it), axis=0, out=out, mode="clip")), None

    return Case(f"base/gather/{n}x{human_bytes(bb)}", "base", make, bytes=n * bb, blocks=n,
                reps="large" if n * bb >= 4 * MiB or n >= 65536 else "small", pgroup=pgroup,
                note="np.take of n random rows into a staging array, one process")


def py_validate(src, dst, limit):
    """The pure-Python block-list check the validation cases compare with.

    Raises:
        ValueError: empty or unequal lists, a non-int or negative id, or a dst id >= ``limit``.
    """
    if not src or len(src) != len(dst):
        raise ValueError("bad lengths")
    for x in src:
        if type(x) is not int or x < 0:
            raise ValueError(x)
    for x in dst:
        if type(x) is not int or x < 0 or x >= limit:
            raise ValueError(x)
