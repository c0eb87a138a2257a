# SPDX-License-Identifier: Apache-2.0
"""The connector's tiny TCP side channel: a hand-shake, claims and "done" notices (no vLLM, no torch).

kvblocks has no notification API yet, so a producer (prefill) worker runs this small server next to its
kvblocks listener. A consumer (decode) worker opens one connection per producer and keeps it:

* ``hello``: the producer answers with what a pull needs (kvblocks cluster id and cache id) and what
  the consumer checks before linking (layout hash, number of tensors, block bytes, data type).
* ``claim``: the consumer is about to pull the blocks of request ``req``: the producer binds the request
  to this consumer (first claimer wins) and refuses it to any other.
* ``done``: the consumer has pulled the blocks of request ``req`` (or given up on them): the producer
  frees them now instead of waiting for its lease to expire, when ``req`` is bound to this consumer.

Wire format (``kvblocks-vllm/2``): one line per message. The server speaks first with a JSON line
``{"proto", "nonce", "engine_id"}``; the client answers ``{"op": "auth", "nonce", "engine_id", "peer",
"addr", "mac"}`` (its own nonce and engine id, the engine id it expects the server to be, the address it
dialed) and the server answers ``{"ok": true, "mac"}``. Both macs are HMAC-SHA256 with the auth token over
the direction, both nonces, both engine ids and the dialed address; the server checks that ``peer`` and
``addr`` are its own, the client checks the server's mac. So a proof made for one side channel (or
relayed through one) is refused by any other. Every later line is ``MAC BODY``: BODY one JSON object,
MAC an HMAC-SHA256 over the direction, a per-direction sequence number and BODY, keyed by a session key
derived from the hand-shake, so that nothing can be injected into or replayed on an authenticated
connection. Without a token the key is empty: nothing is authenticated (bind the port to a private
interface), but the checks and bounds are the same.

Bounds (the server runs one selector thread, whatever connects): a line is at most ``MAX_LINE`` bytes and
JSON at most ``MAX_DEPTH`` deep; a connection has ``AUTH_TIMEOUT_S`` to authenticate; at most
``MAX_PENDING`` connections are authenticating and ``max_conns`` open in all: a new one pushes out the
oldest unauthenticated one (or is closed when all are authenticated). Any error on a connection is logged
and closes that connection only.
"""
import collections
import hashlib
import hmac
import json
import logging
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

logger = logging.getLogger("vllm.kvblocks")

PROTOCOL = "kvblocks-vllm/2"
MAX_LINE = 4096  # every message is a few hundred bytes
MAX_DEPTH = 4  # the deepest message (hello's answer) is 2 deep
MAX_ID = 256  # request and engine ids (vLLM's are ~50 characters)
AUTH_TIMEOUT_S = 2.0
MAX_PENDING = 64  # connections still authenticating
MAX_CONNS = 256  # in all (a decode worker keeps one per prefill)
MAX_OUT = 1 << 16  # answers a client has not read yet; beyond it the client is dropped


# ---------------------------------------------------------------------- messages


def _depth_ok(raw: bytes, limit: int) -> bool:
    """True when no array or object in ``raw`` nests deeper than ``limit`` (json.loads recurses per level:
    a deep one raises RecursionError, and it would spend a stack frame per level first)."""
    depth, in_str, esc = 0, False, False
    for ch in raw:
        if in_str:
            if esc:
                esc = False
            elif ch == 0x5C:  # backslash
                esc = True
            elif ch == 0x22:  # quote
                in_str = False
        elif ch == 0x22:
            in_str = True
        elif ch in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return False
        elif ch in (0x5D, 0x7D):
            depth -= 1
    return True


def parse(raw: bytes) -> Dict[str, Any]:
    """One JSON object from an untrusted line. Raises ValueError for anything else (too long, too deep,
    not JSON, not an object); never RecursionError."""
    if len(raw) > MAX_LINE:
        raise ValueError("side channel: line too long")
    if not _depth_ok(raw, MAX_DEPTH):
        raise ValueError("side channel: JSON nested too deep")
    obj = json.loads(raw)
    if not isinstance(obj, dict):
        raise ValueError("side channel: expected a JSON object")
    return obj


def _dump(obj: Dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _short_str(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= MAX_ID


def _hmac(key: bytes, *parts: str) -> str:
    return hmac.new(key, json.dumps([PROTOCOL, *parts]).encode(), hashlib.sha256).hexdigest()


@dataclass
class _Session:
    """The keys and counters of one authenticated connection (either end)."""

    key: bytes
    out_dir: str  # "s2c" on the server, "c2s" on the client
    in_dir: str
    seq_out: int = 0
    seq_in: int = 0

    def seal(self, obj: Dict[str, Any]) -> bytes:
        body = _dump(obj)
        mac = hmac.new(self.key, b"%s:%d:" % (self.out_dir.encode(), self.seq_out) + body, hashlib.sha256)
        self.seq_out += 1
        return mac.hexdigest().encode() + b" " + body + b"\n"

    def open(self, line: bytes) -> Dict[str, Any]:
        """The message of one received line; ValueError when its mac is wrong (forged, replayed, reordered)."""
        mac, _, body = line.rstrip(b"\n").partition(b" ")
        want = hmac.new(self.key, b"%s:%d:" % (self.in_dir.encode(), self.seq_in) + body, hashlib.sha256)
        if not hmac.compare_digest(mac, want.hexdigest().encode()):
            raise ValueError("side channel: bad message mac")
        self.seq_in += 1
        return parse(body)


def _proofs(token: Optional[str], ns: str, nc: str, prefill: str, decode: str, addr: str
            ) -> Tuple[str, str, bytes]:
    """(client's proof, server's proof, session key) of one hand-shake: all bound to both nonces, both
    engine ids, the dialed address and (proofs) the direction."""
    key = (token or "").encode()
    facts = (ns, nc, prefill, decode, addr)
    session = hmac.new(key, json.dumps([PROTOCOL, "session", *facts]).encode(), hashlib.sha256).digest()
    return _hmac(key, "c2s", *facts), _hmac(key, "s2c", *facts), session


# ---------------------------------------------------------------------- prefill bookkeeping


@dataclass
class _Record:
    owner: Optional[str]  # the decode engine the request is bound to (None: freed unclaimed)
    t: float
    done: bool = False
    freed: bool = False


class Handoffs:
    """Prefill side: which requests' blocks are held, which decode each was handed to, which are done.

    A request is bound to the first decode engine that claims it or says it is done; claims and "done"
    from any other engine are refused. Records are bounded in number (``max_records``, of which at most
    ``max_open`` open claims; when full the oldest closed record goes) and kept ``retention_s`` at most
    unless their blocks are still held. Thread-safe.
    """

    def __init__(self, retention_s: float, max_records: int = 16384, max_open: int = 4096):
        self._retention = retention_s
        self._max_records, self._max_open = max_records, max_open
        self._lock = threading.Lock()
        self._held: Dict[str, float] = {}  # request id -> lease deadline
        self._rec: "collections.OrderedDict[str, _Record]" = collections.OrderedDict()
        self._open = 0  # records owned, not done, not freed

    def __len__(self) -> int:
        return len(self._rec)

    def hold(self, rid: str, lease_s: float, now: Optional[float] = None) -> None:
        """The prefill keeps ``rid``'s blocks for a decode, at most ``lease_s``."""
        with self._lock:
            self._held[rid] = (time.monotonic() if now is None else now) + lease_s

    def claim(self, rid: str, peer: str) -> Optional[str]:
        """Bind ``rid`` to ``peer`` before it pulls. Returns None, or why it is refused."""
        with self._lock:
            r = self._rec.get(rid)
            if r is None:
                return self._add(rid, _Record(peer, time.monotonic()))
            if r.owner != peer:
                return "request handed to another decode" if r.owner else "request already released"
            return "request already released" if (r.done or r.freed) else None

    def done(self, rid: str, peer: str) -> Optional[str]:
        """``peer`` has pulled ``rid`` (or gave up): its blocks may be freed. Returns None, or why not."""
        with self._lock:
            r = self._rec.get(rid)
            if r is None:
                return self._add(rid, _Record(peer, time.monotonic(), done=True))
            if r.owner != peer:
                return "request handed to another decode" if r.owner else "request already released"
            if not (r.done or r.freed):
                r.done = True
                self._open -= 1
            return None

    def _add(self, rid: str, rec: _Record) -> Optional[str]:
        is_open = not rec.done
        if is_open and self._open >= self._max_open:
            return "too many open claims"
        if len(self._rec) >= self._max_records and not self._evict_one():
            return "too many requests"
        self._rec[rid] = rec
        self._open += is_open
        return None

    def _evict_one(self) -> bool:
        """Drop the oldest record that no decode is pulling now (skips at most max_open open claims)."""
        for rid, r in self._rec.items():
            if r.done or r.freed or r.owner is None:
                del self._rec[rid]
                return True
        return False

    def finished(self, now: Optional[float] = None) -> Tuple[Set[str], Set[str]]:
        """(released, expired): held requests a decode said done for, and those whose lease ran out
        (both are freed now and stay refused to later claims); drops records past their retention."""
        now = time.monotonic() if now is None else now
        released, expired = set(), set()
        with self._lock:
            for rid, deadline in list(self._held.items()):
                r = self._rec.get(rid)
                if r is not None and r.done:
                    released.add(rid)
                elif now >= deadline:
                    expired.add(rid)
                else:
                    continue
                del self._held[rid]
                self._free(rid, now)
            self._prune(now)
        return released, expired

    def _free(self, rid: str, now: float) -> None:
        r = self._rec.pop(rid, None)
        if r is not None and not (r.done or r.freed):
            self._open -= 1
        r = r or _Record(None, now)
        r.freed, r.t = True, now
        self._rec[rid] = r  # moved to the end: the newest closed record
        if len(self._rec) > self._max_records:
            self._evict_one()

    def _prune(self, now: float) -> None:
        while self._rec:
            rid, r = next(iter(self._rec.items()))
            if now - r.t <= self._retention:
                return
            if rid in self._held:  # still held (claimed long ago, lease not over): keep, move to the end
                self._rec.move_to_end(rid)
                r.t = now
                continue
            del self._rec[rid]
            self._open -= not (r.done or r.freed or r.owner is None)


# ---------------------------------------------------------------------- server


@dataclass
class _Conn:
    sock: socket.socket
    opened: float
    nonce: str
    inbuf: bytearray
    outbuf: bytearray
    peer: Optional[str] = None  # the authenticated decode engine id
    session: Optional[_Session] = None


class SideChannelServer:
    """Serves the side channel on ``host:port`` from one selector thread.

    Args:
        host, port: where to listen (port 0 picks a free one; see ``port``).
        engine_id: this prefill's engine id (clients prove they expect it).
        address: ``host:port`` decodes dial to reach this server (the advertised address; a proof for
            another address is refused). Default: ``host:port`` as bound.
        hello: returns the hand-shake answer (called per ``hello``).
        handoffs: the prefill's :class:`Handoffs` (``claim`` and ``done`` go there).
        token: auth token, or None.
        max_conns, auth_timeout_s: bounds on connections (see the module docstring).
    """

    def __init__(self, host: str, port: int, engine_id: str, hello: Callable[[], Dict[str, Any]],
                 handoffs: Handoffs, token: Optional[str] = None, address: Optional[str] = None,
                 max_conns: int = MAX_CONNS, auth_timeout_s: float = AUTH_TIMEOUT_S):
        self.engine_id = engine_id
        self._hello, self._handoffs = hello, handoffs
        self._token = token or None
        self._max_conns, self._auth_timeout = max_conns, auth_timeout_s
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self.address = address or f"{host}:{self.port}"
        self._conns: Dict[int, _Conn] = {}  # fd -> connection, oldest first
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="kvblocks-vllm-notify", daemon=True)
        self._thread.start()

    # -------------------------------------------------------------- loop

    def _loop(self) -> None:
        while not self._closed:
            try:
                events = self._sel.select(self._next_deadline())
            except (OSError, ValueError):
                return  # closed
            try:
                for key, mask in events:
                    self._event(key, mask)
                self._expire()
            except Exception:  # noqa: BLE001 - never let the serving thread die
                logger.exception("kvblocks side channel: unexpected error (serving on)")
        for c in list(self._conns.values()):
            self._drop(c, None)
        self._sel.close()

    def _event(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.fileobj is self._wake_r:
            return
        if key.fileobj is self._sock:
            self._accept()
            return
        c = self._conns.get(key.fd)
        if c is None:
            return
        try:
            if mask & selectors.EVENT_WRITE:
                self._flush(c)
            if mask & selectors.EVENT_READ:
                self._read(c)
        except Exception as e:  # noqa: BLE001 - whatever a peer did: drop it, keep serving
            self._drop(c, f"{type(e).__name__}: {e}")

    def _next_deadline(self) -> float:
        pending = [c.opened for c in self._conns.values() if c.session is None]
        if not pending:
            return 1.0
        return max(0.0, min(pending) + self._auth_timeout - time.monotonic())

    def _expire(self) -> None:
        now = time.monotonic()
        for c in list(self._conns.values()):
            if c.session is None and now - c.opened > self._auth_timeout:
                self._drop(c, "no authentication within %.1f s" % self._auth_timeout)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                logger.debug("kvblocks side channel: accept failed: %s", e)
                return
            pending = sum(c.session is None for c in self._conns.values())
            full = len(self._conns) >= self._max_conns or pending >= MAX_PENDING
            if full and not self._push_out_oldest():
                sock.close()  # all authenticated: serve them, not a newcomer
                continue
            self._open_conn(sock)

    def _push_out_oldest(self) -> bool:
        for c in self._conns.values():  # oldest first (dicts keep insertion order)
            if c.session is None:
                self._drop(c, "connection limit reached")
                return True
        return False

    def _open_conn(self, sock: socket.socket) -> None:
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = _Conn(sock, time.monotonic(), os.urandom(16).hex(), bytearray(), bytearray())
            self._conns[sock.fileno()] = c
            self._sel.register(sock, selectors.EVENT_READ)
            self._send(c, _dump({"proto": PROTOCOL, "nonce": c.nonce, "engine_id": self.engine_id}) + b"\n")
        except Exception as e:  # noqa: BLE001
            logger.debug("kvblocks side channel: could not open a connection: %s", e)
            self._forget(sock)

    def _drop(self, c: _Conn, why: Optional[str]) -> None:
        if why:
            logger.warning("kvblocks side channel: dropped %s: %s", c.peer or "an unauthenticated peer", why)
        self._forget(c.sock)

    def _forget(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        self._conns.pop(fd, None)
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    # -------------------------------------------------------------- I/O

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(MAX_LINE + 256)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self._forget(c.sock)
            return
        c.inbuf += data
        while c.sock.fileno() in self._conns:
            nl = c.inbuf.find(b"\n")
            if nl < 0:
                if len(c.inbuf) > MAX_LINE + 65:
                    raise ValueError("line too long")
                return
            line = bytes(c.inbuf[:nl])
            del c.inbuf[:nl + 1]
            if len(line) > MAX_LINE + 65:
                raise ValueError("line too long")
            self._on_line(c, line)

    def _send(self, c: _Conn, data: bytes) -> None:
        c.outbuf += data
        if len(c.outbuf) > MAX_OUT:
            raise ValueError("peer does not read its answers")
        self._flush(c)

    def _flush(self, c: _Conn) -> None:
        try:
            n = c.sock.send(c.outbuf)
        except (BlockingIOError, InterruptedError):
            n = 0
        del c.outbuf[:n]
        self._sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if c.outbuf else 0))

    # -------------------------------------------------------------- messages

    def _on_line(self, c: _Conn, line: bytes) -> None:
        if c.session is None:
            self._authenticate(c, parse(line))
            return
        msg = c.session.open(line)
        self._send(c, c.session.seal(self._answer(c, msg)))

    def _authenticate(self, c: _Conn, msg: Dict[str, Any]) -> None:
        fields = [msg.get(k) for k in ("nonce", "engine_id", "peer", "addr", "mac")]
        if msg.get("op") != "auth" or not all(_short_str(v) for v in fields):
            raise ValueError("malformed auth message")
        nc, decode, peer, addr, mac = (str(v) for v in fields)
        if peer != self.engine_id:
            self._send(c, _dump({"ok": False, "error": f"this is engine {self.engine_id!r}, not {peer!r}"}) + b"\n")
            raise ValueError(f"auth for engine {peer!r}")
        c2s, s2c, key = _proofs(self._token, c.nonce, nc, self.engine_id, decode, addr)
        if addr != self.address or not hmac.compare_digest(mac, c2s):
            self._send(c, _dump({"ok": False, "error": "authentication failed"}) + b"\n")
            raise ValueError(f"wrong auth proof (dialed {addr!r}; this side channel is {self.address!r})")
        c.peer, c.session = decode, _Session(key, "s2c", "c2s")
        self._send(c, _dump({"ok": True, "mac": s2c}) + b"\n")

    def _answer(self, c: _Conn, msg: Dict[str, Any]) -> Dict[str, Any]:
        op = msg.get("op")
        if op == "hello":
            return {"ok": True, **self._hello()}
        if op in ("claim", "done"):
            rid = msg.get("req")
            if not _short_str(rid):
                return {"ok": False, "error": f"req must be a string of 1 to {MAX_ID} characters"}
            assert c.peer is not None
            err = (self._handoffs.claim if op == "claim" else self._handoffs.done)(str(rid), c.peer)
            if err:
                logger.warning("kvblocks side channel: refused %s of request %s by %s: %s", op, rid, c.peer, err)
                return {"ok": False, "error": err}
            return {"ok": True}
        return {"ok": False, "error": f"unknown op {str(op)[:32]!r}"}

    def close(self) -> None:
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(5)
        for s in (self._sock, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass


# ---------------------------------------------------------------------- client


class Refused(ValueError):
    """The producer answered and refused the message (``ok`` false): the connection itself is fine."""


class SideChannelClient:
    """One connection to a producer's side channel; thread-safe, reconnects on the next call after an error.

    Args:
        host, port: the producer's side channel, as dialed (``host:port`` is bound into the proofs).
        token: auth token, or None.
        engine_id: this (decode) engine's id.
        peer_engine: the producer's engine id this client expects; a server that cannot prove it (with
            the token) is refused before anything is sent to it.
        timeout_s: connect and per-answer timeout.
    """

    def __init__(self, host: str, port: int, token: Optional[str] = None, timeout_s: float = 2.0, *,
                 engine_id: str, peer_engine: str):
        self.host, self.port = host, port
        self._token = token or None
        self._timeout = timeout_s
        self._engine_id, self._peer_engine = engine_id, peer_engine
        self._lock = threading.Lock()
        self._conn: Optional[socket.socket] = None
        self._f: Any = None
        self._session: Optional[_Session] = None
        self.local_ip = "127.0.0.1"

    def _readline(self, f) -> bytes:
        line = f.readline(MAX_LINE + 66)
        if not line or not line.endswith(b"\n"):
            raise ConnectionError("side channel closed (or sent a line too long)")
        return line

    def _connect(self) -> None:
        conn = socket.create_connection((self.host, self.port), timeout=self._timeout)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = conn.makefile("rwb")
        try:
            self._session = self._handshake(f)
        except BaseException:
            f.close()
            conn.close()
            raise
        self.local_ip = conn.getsockname()[0]
        self._conn, self._f = conn, f

    def _handshake(self, f) -> _Session:
        first = parse(self._readline(f))
        ns, theirs = first.get("nonce"), first.get("engine_id")
        if first.get("proto") != PROTOCOL or not _short_str(ns):
            raise ConnectionError(f"side channel: {self.host}:{self.port} does not speak {PROTOCOL}")
        if theirs != self._peer_engine:
            raise ConnectionError(f"side channel: {self.host}:{self.port} says it is engine {theirs!r}, expected "
                                  f"{self._peer_engine!r} (restarted?)")
        nc = os.urandom(16).hex()
        addr = f"{self.host}:{self.port}"
        c2s, s2c, key = _proofs(self._token, str(ns), nc, self._peer_engine, self._engine_id, addr)
        f.write(_dump({"op": "auth", "nonce": nc, "engine_id": self._engine_id, "peer": self._peer_engine,
                       "addr": addr, "mac": c2s}) + b"\n")
        f.flush()
        ans = parse(self._readline(f))
        if not ans.get("ok"):
            raise ConnectionError(f"side channel: authentication refused: {str(ans.get('error'))[:200]}")
        if not hmac.compare_digest(str(ans.get("mac", "")), s2c):
            raise ConnectionError(f"side channel: {self.host}:{self.port} could not prove it is engine "
                                  f"{self._peer_engine!r} (wrong auth token, or not a prefill)")
        return _Session(key, "c2s", "s2c")

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._f.close()
                self._conn.close()
            except OSError:
                pass
        self._conn = self._f = self._session = None

    def call(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        """Send one message and return the answer.

        Raises:
            OSError / ConnectionError / ValueError: the producer is unreachable, not authenticated, closed
                the connection, did not answer within the timeout, or sent something malformed.
            Refused: the producer refused the message (``ok`` false).
        """
        with self._lock:
            try:
                if self._conn is None:
                    self._connect()
                assert self._session is not None
                self._f.write(self._session.seal(msg))
                self._f.flush()
                ans = self._session.open(self._readline(self._f))
            except BaseException:
                self._drop()
                raise
        if not ans.get("ok"):
            raise Refused(f"side channel: {str(ans.get('error', 'refused'))[:200]}")
        return ans

    def close(self) -> None:
        with self._lock:
            self._drop()


__all__: List[str] = ["Handoffs", "Refused", "SideChannelClient", "SideChannelServer", "parse", "PROTOCOL"]
