# SPDX-License-Identifier: Apache-2.0
"""The connector's tiny TCP side channel: a hand-shake and "done" notices (no vLLM, no torch).

kvblocks has no notification API yet, so a producer (prefill) worker runs this small server next to its
kvblocks listener. A consumer (decode) worker opens one connection per producer and keeps it:

* ``hello``: the producer answers with what a pull needs (kvblocks cluster id and cache id) and what
  the consumer checks before linking (layout hash, number of tensors, block bytes, data type).
* ``done``: the consumer has pulled the blocks of request ``req`` (or given up on them): the producer
  may free them now instead of waiting for its lease to expire.

Wire format: one JSON object per line, each way. The server speaks first with ``{"nonce": hex}``. With an
auth token the client's first line must be ``{"op": "auth", "mac": HMAC-SHA256(token, "kvblocks-vllm" +
nonce)}``; the server closes the connection on a wrong or missing mac. Without a token the server accepts
anything (as the kvblocks listener does: bind it to a private interface).
"""
import hashlib
import hmac
import json
import logging
import os
import socket
import threading
from typing import Any, Callable, Dict, Optional

logger = logging.getLogger("vllm.kvblocks")

_MAX_LINE = 1 << 16


def _mac(token: str, nonce: str) -> str:
    return hmac.new(token.encode(), ("kvblocks-vllm" + nonce).encode(), hashlib.sha256).hexdigest()


def _send(f, obj: Dict[str, Any]) -> None:
    f.write((json.dumps(obj, separators=(",", ":")) + "\n").encode())
    f.flush()


def _recv(f) -> Dict[str, Any]:
    line = f.readline(_MAX_LINE)
    if not line or not line.endswith(b"\n"):
        raise ConnectionError("side channel closed")
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("side channel: expected a JSON object")
    return obj


class SideChannelServer:
    """Serves ``hello`` and ``done`` on ``host:port`` from daemon threads.

    Args:
        host, port: where to listen (port 0 picks a free one; see ``port``).
        hello: returns the hand-shake answer (called per ``hello``).
        on_done: called with the request id of each ``done``.
        token: auth token, or None.
    """

    def __init__(self, host: str, port: int, hello: Callable[[], Dict[str, Any]],
                 on_done: Callable[[str], None], token: Optional[str] = None):
        self._hello = hello
        self._on_done = on_done
        self._token = token or None
        self._sock = socket.create_server((host, port), reuse_port=False)
        self.port = self._sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept_loop, name="kvblocks-vllm-notify", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = conn.makefile("rwb")
        try:
            nonce = os.urandom(16).hex()
            _send(f, {"nonce": nonce})
            if self._token:
                msg = _recv(f)
                if msg.get("op") != "auth" or not hmac.compare_digest(str(msg.get("mac", "")),
                                                                      _mac(self._token, nonce)):
                    logger.warning("kvblocks side channel: rejected a peer with a wrong auth token")
                    return
                _send(f, {"ok": True})
            while True:
                msg = _recv(f)
                op = msg.get("op")
                if op == "hello":
                    _send(f, {"ok": True, **self._hello()})
                elif op == "done":
                    self._on_done(str(msg.get("req")))
                    _send(f, {"ok": True})
                elif op == "auth":
                    _send(f, {"ok": True})
                else:
                    _send(f, {"ok": False, "error": f"unknown op {op!r}"})
        except (OSError, ValueError, ConnectionError):
            pass
        finally:
            try:
                f.close()
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not on Linux)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass


class SideChannelClient:
    """One connection to a producer's side channel; thread-safe, reconnects on the next call after an error.

    Args:
        host, port: the producer's side channel.
        token: auth token, or None.
        timeout_s: connect and per-answer timeout.
    """

    def __init__(self, host: str, port: int, token: Optional[str] = None, timeout_s: float = 2.0):
        self.host, self.port = host, port
        self._token = token or None
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._conn: Optional[socket.socket] = None
        self._f = None
        self.local_ip = "127.0.0.1"

    def _connect(self) -> None:
        conn = socket.create_connection((self.host, self.port), timeout=self._timeout)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = conn.makefile("rwb")
        try:
            nonce = str(_recv(f).get("nonce", ""))
            if self._token:
                _send(f, {"op": "auth", "mac": _mac(self._token, nonce)})
                if not _recv(f).get("ok"):
                    raise ConnectionError("side channel: authentication refused")
        except BaseException:
            f.close()
            conn.close()
            raise
        self.local_ip = conn.getsockname()[0]
        self._conn, self._f = conn, f

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._f.close()
                self._conn.close()
            except OSError:
                pass
        self._conn = self._f = None

    def call(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        """Send one message and return the answer.

        Raises:
            OSError / ConnectionError / ValueError: the producer is unreachable, closed the connection,
                did not answer within the timeout, or refused the message (``ok`` false).
        """
        with self._lock:
            try:
                if self._conn is None:
                    self._connect()
                _send(self._f, msg)
                ans = _recv(self._f)
            except BaseException:
                self._drop()
                raise
        if not ans.get("ok"):
            raise ValueError(f"side channel: {ans.get('error', 'refused')}")
        return ans

    def close(self) -> None:
        with self._lock:
            self._drop()
