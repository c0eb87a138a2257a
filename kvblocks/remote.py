# SPDX-License-Identifier: Apache-2.0
"""Two hosts in two commands: ``kvblocks demo --listen``/``--connect`` and ``kvblocks ping``.

The listening side is a Prompt engine with two caches filled with a known pattern: ``data``
(8 tensors x 64 blocks x 64 KiB, 32 MiB) and ``small`` (1 tensor x 16 blocks x 4 KiB). A connecting
side links to it, asks for the cache ids with a notification (``kvblocks-demo/hello``; the answer,
``kvblocks-demo/caches``, is JSON) and then pulls, pushes or measures. Nothing here is a separate
protocol: it is the public API (link, notifications, pull, push) over whatever path the link chose.
"""
import json
import random
import signal
import statistics
import sys
import time
from typing import Dict, List, Optional, Tuple

import kvblocks as kb
from kvblocks._errors import exception_for

TENSORS, BLOCKS, BLOCK_BYTES = 8, 64, 64 * 1024
SMALL_BLOCKS, SMALL_BYTES = 16, 4096
LISTENER_ID = 1  # the listener's cluster id unless --cluster-id says otherwise
HELLO, CACHES, PULLED, PUSHED, DONE = ("kvblocks-demo/hello", "kvblocks-demo/caches", "kvblocks-demo/pulled",
                                      "kvblocks-demo/pushed", "kvblocks-demo/done")
POLL_S = 0.002


def parse_addr(text: str, *, listening: bool) -> Tuple[str, int]:
    """``IPV4:PORT`` as a pair. ``listening`` allows the wildcard ``0.0.0.0``, which a peer cannot dial,
    and port 0 (any free port: the listener prints the one it got).

    Raises:
        ValueError: not ``IPV4:PORT``, the port is outside 1..65535 (0..65535 when listening), or a peer
            address is ``0.0.0.0``.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 if listening else 1) <= int(port) <= 65535:
        raise ValueError(f"address {text!r} is not IPV4:PORT (for example 10.0.0.1:26000)")
    parts = host.split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) <= 255 for p in parts):
        raise ValueError(f"address {text!r}: {host!r} is not an IPv4 address")
    if not listening and host == "0.0.0.0":
        raise ValueError(f"address {text!r}: dial the listener's own address, not the wildcard")
    return host, int(port)


def pattern_byte(cluster: int, tensor: int, block: int) -> int:
    """The byte every position of ``block`` of ``tensor`` holds in ``cluster``'s demo caches. Raises nothing."""
    return (cluster * 31 + tensor * 7 + block) % 251


def fill(cache, cluster: int, tensors: int, blocks: int, block_bytes: int) -> None:
    """Write the demo pattern into every block of ``cache``. Raises nothing."""
    for t in range(tensors):
        view = cache.tensor(t)
        for b in range(blocks):
            view[b * block_bytes:(b + 1) * block_bytes] = bytes([pattern_byte(cluster, t, b)]) * block_bytes


def block_holds(cache, tensor: int, block: int, block_bytes: int, cluster: int, src_block: int) -> bool:
    """Whether ``block`` of ``tensor`` holds ``cluster``'s pattern of ``src_block``. Raises nothing."""
    got = bytes(cache.tensor(tensor)[block * block_bytes:(block + 1) * block_bytes])
    return got == bytes([pattern_byte(cluster, tensor, src_block)]) * block_bytes


def _options(transport: str, listen: Optional[str] = None) -> Dict[str, str]:
    opts = {kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: transport}
    if listen:
        opts[kb.OPTION_LISTEN_IP_INFO] = listen
    return opts


def _wait_notify(dd, name: str, deadline: float) -> Tuple[int, str]:
    """The first notification called ``name``: (sender cluster, message); others are dropped.

    Raises:
        TimeoutError: none arrived before ``deadline`` (time.monotonic()).
    """
    while time.monotonic() < deadline:
        for cluster, got, message in dd.get_notifies():
            if got == name:
                return cluster, message
        time.sleep(POLL_S)
    raise TimeoutError(f"no {name!r} notification from the peer within the time allowed")


# --- the listening side ------------------------------------------------------------------------------------

class Listener:
    """The demo's Prompt side: two pattern caches behind a listening engine, answering hellos."""

    def __init__(self, addr: str, cluster_id: int = LISTENER_ID, transport: str = "auto"):
        """Listen on ``addr`` (``IPV4:PORT``).

        Raises:
            ValueError: ``addr`` is not ``IPV4:PORT``.
            kvblocks.LLMException: the engine did not start (for example the address is not local).
        """
        parse_addr(addr, listening=True)
        self.addr, self.cluster_id = addr, cluster_id
        self.dd = kb.LlmDataDist(cluster_id, kb.LlmRole.PROMPT)
        self.dd.initialize(_options(transport, addr))
        self.data = self.dd.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BLOCK_BYTES]))
        self.small = self.dd.allocate_cache(kb.CacheDesc(1, kb.DataType.DT_UINT8, [SMALL_BLOCKS, SMALL_BYTES]))
        fill(self.data, cluster_id, TENSORS, BLOCKS, BLOCK_BYTES)
        fill(self.small, cluster_id, 1, SMALL_BLOCKS, SMALL_BYTES)

    def serve(self, count: int = 0, out=sys.stdout) -> int:
        """Answer peers until ``count`` demos finished (0: until SIGINT/SIGTERM); returns 0, or 1 when a
        pushed block did not verify.

        Raises:
            kvblocks.LLMException: a push to a peer failed in a way other than the peer going away.
        """
        stop = []
        old = {s: signal.signal(s, lambda *_: stop.append(1)) for s in (signal.SIGINT, signal.SIGTERM)}
        finished, bad = 0, 0
        try:
            while not stop and (count == 0 or finished < count):
                for cluster, name, message in self.dd.get_notifies():
                    ok = self._handle(cluster, name, message, out)
                    if ok is not None:
                        finished, bad = finished + 1, bad + (not ok)
                time.sleep(POLL_S)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        return 1 if bad else 0

    def _handle(self, cluster: int, name: str, message: str, out) -> Optional[bool]:
        """One notification; returns whether a finished peer's bytes verified, None if none finished.
        A peer that breaks the exchange or goes away is reported and dropped: the listener serves on."""
        try:
            if name == HELLO:
                self._hello(cluster, json.loads(message), out)
            elif name == PULLED:
                self._push(cluster, json.loads(message), out)
            elif name == DONE:
                return self._done(cluster, json.loads(message), out)
        except (ValueError, KeyError, TypeError, kb.LLMException) as e:
            print(f"peer {cluster}: {name} failed: {e}", file=out, flush=True)
        return None

    def _hello(self, cluster: int, peer: dict, out) -> None:
        print(f"peer {cluster} linked ({peer.get('what', 'demo')}), data path: {self.dd.link_path(cluster)}",
              file=out, flush=True)
        self.dd.send_notify(cluster, CACHES, json.dumps({"data": self.data.cache_id, "small": self.small.cache_id}))

    def _push(self, cluster: int, pulled: dict, out) -> None:
        """CANN's Prompt role, once the peer's pull is done: push layer 3 (tensors 6 and 7) blocks
        [0,1,2,3] into the peer's [3,2,1,0]."""
        ext = kb.KvCacheExtParam(src_layer_range=(3, 3), dst_layer_range=(3, 3), tensor_num_per_layer=2)
        t0 = time.perf_counter()
        self.dd.push_kv_blocks(self.data, kb.CacheIndex(cluster, int(pulled["cache"])), [0, 1, 2, 3], [3, 2, 1, 0],
                               ext)
        self.dd.send_notify(cluster, PUSHED, json.dumps({"seconds": time.perf_counter() - t0}))

    def _done(self, cluster: int, report: dict, out) -> bool:
        ok = bool(report.get("ok"))
        print(f"peer {cluster} done ({report.get('what', 'demo')}): its bytes verified {'OK' if ok else 'MISMATCH'}",
              file=out, flush=True)
        return ok

    def close(self) -> None:
        """Release the caches and stop the engine. Raises nothing."""
        self.dd.finalize()


# --- the connecting side -----------------------------------------------------------------------------------

class Connection:
    """A linked Decoder engine that knows the listener's cache ids."""

    def __init__(self, addr: str, cluster_id: Optional[int] = None, listener_id: int = LISTENER_ID,
                 transport: str = "auto", what: str = "demo", timeout_s: float = 10.0):
        """Link to the listener at ``addr`` and learn its caches.

        Raises:
            ValueError: ``addr`` is not ``IPV4:PORT``.
            kvblocks.LinkError: the link failed (the message says why where the runtime knows).
            TimeoutError: the listener did not answer the hello (it is not a kvblocks demo listener).
        """
        host, port = parse_addr(addr, listening=False)
        self.listener_id = listener_id
        self.cluster_id = cluster_id if cluster_id is not None else random.randrange(2, 1 << 31)
        self.dd = kb.LlmDataDist(self.cluster_id, kb.LlmRole.DECODER)
        self.dd.initialize(_options(transport))
        self.cache = self.dd.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BLOCK_BYTES]))
        self.small = self.dd.allocate_cache(kb.CacheDesc(1, kb.DataType.DT_UINT8, [SMALL_BLOCKS, SMALL_BYTES]))
        fill(self.cache, self.cluster_id, TENSORS, BLOCKS, BLOCK_BYTES)
        info = kb.ClusterInfo(listener_id, 0, [kb.IpInfo(host, 0)], [kb.IpInfo(host, port)])
        t0 = time.perf_counter()
        rets = self.dd.link_llm_clusters([info], timeout_in_millis=int(timeout_s * 1000))
        self.link_s = time.perf_counter() - t0
        if rets[0] != kb.Status.LLM_SUCCESS:
            why = self.dd.link_failure(listener_id)
            self.dd.finalize()
            raise exception_for(rets[0], f"linking to the listener at {addr} (cluster {listener_id})",
                                f"{why.reason}: {why.message}" if why else "")
        self.path = self.dd.link_path(listener_id)
        self.dd.send_notify(listener_id, HELLO, json.dumps({"what": what}))
        _, message = _wait_notify(self.dd, CACHES, time.monotonic() + timeout_s)
        ids = json.loads(message)
        self.remote_data, self.remote_small = int(ids["data"]), int(ids["small"])

    def pull(self, src: List[int], dst: List[int]) -> float:
        """Pull ``src`` blocks of the listener's data cache into ``dst``, every tensor; returns seconds.

        Raises:
            kvblocks.LLMException: the pull failed (status and reason in the exception).
        """
        t0 = time.perf_counter()
        self.dd.pull_kv_blocks(kb.CacheIndex(self.listener_id, self.remote_data), self.cache, src, dst)
        return time.perf_counter() - t0

    def pull_small(self) -> float:
        """Pull one 4 KiB block of the listener's small cache; returns seconds.

        Raises:
            kvblocks.LLMException: the pull failed.
        """
        t0 = time.perf_counter()
        self.dd.pull_kv_blocks(kb.CacheIndex(self.listener_id, self.remote_small), self.small, [1], [0])
        return time.perf_counter() - t0

    def close(self) -> None:
        """Unlink and stop the engine. Raises nothing."""
        try:
            self.dd.unlink_llm_clusters([kb.ClusterInfo(self.listener_id, 0, [], [])])
        except kb.LLMException:
            pass
        self.dd.finalize()


def run_connect(addr: str, transport: str = "auto", listener_id: int = LISTENER_ID, out=sys.stdout) -> int:
    """``kvblocks demo --connect ADDR``: pull, receive a push, verify both; returns 0 when all bytes match.

    Raises:
        ValueError, kvblocks.LinkError, TimeoutError: as :class:`Connection`.
        kvblocks.LLMException: a pull failed.
    """
    c = Connection(addr, listener_id=listener_id, transport=transport)
    try:
        print(f"linked Decoder({c.cluster_id}) -> Prompt({listener_id}) at {addr} in {c.link_s * 1e3:.2f} ms, "
              f"data path: {c.path}", file=out)
        src, dst = [1, 3, 5, 7], [0, 2, 4, 6]
        secs = c.pull(src, dst)
        nbytes = TENSORS * len(src) * BLOCK_BYTES
        ok = all(block_holds(c.cache, t, d, BLOCK_BYTES, listener_id, s) for t in range(TENSORS)
                 for s, d in zip(src, dst))
        ok &= all(block_holds(c.cache, t, b, BLOCK_BYTES, c.cluster_id, b) for t in range(TENSORS) for b in (1, 8))
        print(f"pull  {src} -> {dst} x {TENSORS} tensors: {nbytes} bytes in {secs * 1e6:.1f} us "
              f"({nbytes / secs / 1e9:.2f} GB/s)  verified: {'OK' if ok else 'MISMATCH'}", file=out)
        c.dd.send_notify(listener_id, PULLED, json.dumps({"cache": c.cache.cache_id}))
        _, message = _wait_notify(c.dd, PUSHED, time.monotonic() + 30)
        push_s = json.loads(message)["seconds"]
        ok2 = all(block_holds(c.cache, t, d, BLOCK_BYTES, listener_id, s) for t in (6, 7)
                  for s, d in zip([0, 1, 2, 3], [3, 2, 1, 0]))
        ok2 &= all(block_holds(c.cache, t, b, BLOCK_BYTES, c.cluster_id, b) for t in (4, 5) for b in (1, 3))
        print(f"push  layer 3 (tensors 6,7) blocks [0,1,2,3] -> [3,2,1,0]: {2 * 4 * BLOCK_BYTES} bytes in "
              f"{push_s * 1e6:.1f} us  verified: {'OK' if ok2 else 'MISMATCH'}", file=out)
        c.dd.send_notify(listener_id, DONE, json.dumps({"what": "demo", "ok": bool(ok and ok2)}))
        return 0 if ok and ok2 else 1
    finally:
        c.close()


def run_ping(addr: str, count: int = 10, transport: str = "auto", listener_id: int = LISTENER_ID,
             out=sys.stdout) -> int:
    """``kvblocks ping ADDR``: link, print the path, the latency of a 4 KiB pull (a round trip on served paths) and the bandwidth of a
    32 MiB pull (medians over ``count``); returns 0 when every pulled byte matched.

    Raises:
        ValueError, kvblocks.LinkError, TimeoutError: as :class:`Connection`.
        kvblocks.LLMException: a pull failed.
    """
    c = Connection(addr, listener_id=listener_id, transport=transport, what="ping")
    try:
        print(f"linked to cluster {listener_id} at {addr} in {c.link_s * 1e3:.2f} ms, data path: {c.path}",
              file=out)
        small = [c.pull_small() for _ in range(count)]
        big = [c.pull(list(range(BLOCKS)), list(range(BLOCKS))) for _ in range(count)]
        ok = block_holds(c.small, 0, 0, SMALL_BYTES, listener_id, 1)
        ok &= all(block_holds(c.cache, t, b, BLOCK_BYTES, listener_id, b) for t in range(TENSORS) for b in range(BLOCKS))
        nbytes = TENSORS * BLOCKS * BLOCK_BYTES
        rtt, bw = statistics.median(small), [nbytes / s / 1e9 for s in big]
        print(f"latency (4 KiB pull): median {rtt * 1e6:.1f} us, min {min(small) * 1e6:.1f} us "
              f"over {count}", file=out)
        print(f"bandwidth ({nbytes >> 20} MiB pull): median {statistics.median(bw):.2f} GB/s, "
              f"max {max(bw):.2f} GB/s over {count}", file=out)
        print(f"verified: {'OK' if ok else 'MISMATCH'}", file=out)
        c.dd.send_notify(listener_id, DONE, json.dumps({"what": "ping", "ok": bool(ok)}))
        return 0 if ok else 1
    finally:
        c.close()
