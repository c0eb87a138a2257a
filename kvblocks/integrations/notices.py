# SPDX-License-Identifier: Apache-2.0
"""Request hand-off notices over the runtime's own notifications (``send_notify`` / ``get_notifies``).

A *holder* (a prefill) keeps a request's blocks for the one engine the request is handed to, and frees
them when that engine says ``done`` (it pulled them) or ``abort`` (it gave up), or when the lease runs out;
``lease`` from that engine extends the lease (bounded). Who the request was handed to is whoever holds
its **ticket**: a random 128-bit value the holder puts in the hand-off params (which travel through the
client to one engine only) and the notice must repeat. The first notice with the right ticket binds the
request to the notice's sender (the link's cluster id, authenticated by the link); from then on notices
for it from any other cluster are refused, ticket or not. A request handed to *n* pullers (the ranks of
a decode with more tensor parallelism than the prefill each pull their heads) says so in every notice
(``"n"``): the first *n* senders with the ticket bind it, and it is released once each said ``done`` or
``abort`` (``done`` only if all did). A notice that comes before the holder's ``hold`` (the params can
overtake the holder's own bookkeeping) waits in a bounded buffer.

Wire: notification name ``kvblocks/notice``, message a JSON object ``{"k": kind, "r": request id,
"t": ticket, "s": seconds, "n": pullers}`` ("s" only for lease, "n" only when above 1) of at most
:data:`MAX_MESSAGE` bytes. Anything else under that name is counted and dropped; notifications under
other names are not ours and are dropped too (the runtime caps its queue at 4096 undelivered
notifications per engine, so a flood costs at most that).
"""
import collections
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set, Tuple

NAME = "kvblocks/notice"
KINDS = ("done", "abort", "lease")
MAX_MESSAGE = 512  # bytes; a notice is about 120
RESERVE = "reserve"  # a receiver's blocks for a layer-wise push (see Reservations)
MAX_RESERVE_MESSAGE = 1024  # the runtime's limit: about 140 block ids
MAX_BLOCK_ID = 1 << 31
MAX_ID = 256  # request ids (vLLM's are ~50 characters)
TICKET_HEX = 32
MAX_PULLERS = 64  # engines (tensor-parallel ranks) one request may be handed to


def new_ticket() -> str:
    return secrets.token_hex(TICKET_HEX // 2)


def encode(kind: str, rid: str, ticket: str, seconds: float = 0.0, pullers: int = 1) -> str:
    """One notice; ``pullers``: how many engines the request was handed to (each sends its own).
    Raises ValueError for an unknown kind, a pullers count outside 1..MAX_PULLERS or a notice too long."""
    if kind not in KINDS:
        raise ValueError(f"notice kind must be one of {KINDS}, got {kind!r}")
    if type(pullers) is not int or not 0 < pullers <= MAX_PULLERS:
        raise ValueError(f"pullers must be 1..{MAX_PULLERS}, got {pullers!r}")
    return _dump({"k": kind, "r": rid, "t": ticket, **({"s": float(seconds)} if kind == "lease" else {}),
                  **({"n": pullers} if pullers > 1 else {})}, MAX_MESSAGE)


def encode_reserve(xfer: str, ticket: str, blocks: List[int], offset: int) -> str:
    """A receiver's reservation: push the sender's blocks ``offset..`` of transfer ``xfer`` into ``blocks``."""
    return _dump({"k": RESERVE, "r": xfer, "t": ticket, "b": [int(b) for b in blocks], "o": int(offset)},
                 MAX_RESERVE_MESSAGE)


def _dump(msg: Dict[str, object], limit: int) -> str:
    out = json.dumps(msg, separators=(",", ":"))
    if len(out.encode()) > limit:
        raise ValueError(f"notice longer than {limit} bytes (request id or block list too long?)")
    return out


@dataclass(frozen=True)
class Notice:
    sender: int  # cluster id of the link it came on
    kind: str
    rid: str
    ticket: str
    seconds: float = 0.0
    blocks: Tuple[int, ...] = ()  # reserve only
    offset: int = 0  # reserve only
    pullers: int = 1  # engines the request was handed to (done, abort, lease)


def decode(sender: int, name: str, message: str) -> Notice:
    """One untrusted notification as a :class:`Notice`; ValueError says why it is not one."""
    if name != NAME:
        raise ValueError(f"not a notice ({name[:64]!r})")
    size = len(message.encode())
    if size > MAX_RESERVE_MESSAGE or (size > MAX_MESSAGE and not message.startswith('{"k":"reserve"')):
        raise ValueError(f"notice longer than {MAX_MESSAGE} bytes")
    try:
        obj = json.loads(message)
    except (ValueError, RecursionError):
        raise ValueError("notice is not JSON") from None
    if not isinstance(obj, dict) or not set(obj) <= {"k", "r", "t", "s", "b", "o", "n"}:
        raise ValueError("notice is not an object of k, r, t, s, b, o, n")
    kind, rid, ticket, secs = obj.get("k"), obj.get("r"), obj.get("t"), obj.get("s", 0.0)
    if kind == RESERVE:
        blocks, offset = obj.get("b"), obj.get("o")
        if not isinstance(blocks, list) or not blocks or \
                not all(type(b) is int and 0 <= b < MAX_BLOCK_ID for b in blocks):
            raise ValueError("bad reserved blocks")
        if type(offset) is not int or not 0 <= offset < MAX_BLOCK_ID:
            raise ValueError("bad block offset")
        if not isinstance(rid, str) or not 0 < len(rid) <= MAX_ID or not isinstance(ticket, str) or \
                len(ticket) != TICKET_HEX:
            raise ValueError("bad transfer id or ticket")
        return Notice(sender, RESERVE, rid, ticket, 0.0, tuple(blocks), offset)
    if kind not in KINDS or "b" in obj or "o" in obj:
        raise ValueError("unknown notice kind")
    pullers = obj.get("n", 1)
    if type(pullers) is not int or not 0 < pullers <= MAX_PULLERS:
        raise ValueError("bad pullers count")
    if size > MAX_MESSAGE:
        raise ValueError(f"notice longer than {MAX_MESSAGE} bytes")
    if not isinstance(rid, str) or not 0 < len(rid) <= MAX_ID:
        raise ValueError("bad request id")
    if not isinstance(ticket, str) or len(ticket) != TICKET_HEX:
        raise ValueError("bad ticket")
    if isinstance(secs, bool) or not isinstance(secs, (int, float)) or not 0 <= secs <= 1e6:
        raise ValueError("bad lease seconds")
    return Notice(sender, kind, rid, ticket, float(secs), pullers=pullers)


@dataclass
class _Held:
    ticket: str
    deadline: float
    owners: List[int] = field(default_factory=list)  # cluster ids bound by the first notices with the ticket
    pullers: int = 0  # how many engines the request was handed to (0: no notice yet)
    ended: Dict[int, str] = field(default_factory=dict)  # owner -> its done or abort
    released: bool = False
    kind: str = ""  # what released it: done (every puller said done) or abort
    renewals: int = 0


@dataclass
class HolderStats:
    accepted: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    refused: Dict[str, int] = field(default_factory=dict)  # reason -> count


class Holder:
    """Holder side bookkeeping: held requests, their tickets and owners, early notices. Thread-safe.

    Bounds: ``max_held`` requests held at once (a hold beyond it is refused: the caller frees at once);
    ``max_early`` notices for requests not held yet, each kept ``early_ttl_s`` at most (the oldest goes
    first); a lease extends to at most ``max_lease_s`` from now, ``max_renewals`` times.
    """

    def __init__(self, max_held: int = 16384, max_early: int = 4096, early_ttl_s: float = 60.0,
                 max_lease_s: float = 600.0, max_renewals: int = 16,
                 log: Optional[Callable[[str], None]] = None):
        self.max_held, self.max_early, self.early_ttl_s = max_held, max_early, early_ttl_s
        self.max_lease_s, self.max_renewals = max_lease_s, max_renewals
        self._log = log
        self._lock = threading.Lock()
        self._held: Dict[str, _Held] = {}
        self._early: "collections.OrderedDict[Tuple[str, int], Tuple[Notice, float]]" = collections.OrderedDict()
        self._released: Set[str] = set()
        self._released_by: Dict[str, str] = {}  # the last finished() call's released: rid -> done / abort
        self.stats = HolderStats()

    def hold(self, rid: str, ticket: str, lease_s: float, now: Optional[float] = None) -> bool:
        """Keep ``rid``'s blocks for the holder of ``ticket``, at most ``lease_s``; False when full."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if len(self._held) >= self.max_held and rid not in self._held:
                return False
            h = self._held[rid] = _Held(ticket, now + lease_s)
            early = [k for k in self._early if k[0] == rid]
            for k in early:
                n, _ = self._early.pop(k)
                self._apply(h, n, now)
            return True

    def accept(self, n: Notice, now: Optional[float] = None) -> Optional[str]:
        """Apply one notice. Returns None (applied or kept until the hold) or why it was refused."""
        now = time.monotonic() if now is None else now
        with self._lock:
            h = self._held.get(n.rid)
            if h is None:
                return self._keep_early(n, now)
            return self._apply(h, n, now)

    def _apply(self, h: _Held, n: Notice, now: float) -> Optional[str]:
        if h.pullers and n.pullers != h.pullers:
            return self._refuse("pullers count differs from the first notice's")
        if n.sender not in h.owners and len(h.owners) >= (h.pullers or n.pullers):
            return self._refuse("request handed to another engine")
        if not _same(h.ticket, n.ticket):
            return self._refuse("wrong ticket")
        if h.released:
            return self._refuse("request already released")
        if n.sender in h.ended:
            return self._refuse("this engine already said " + h.ended[n.sender])
        if n.sender not in h.owners:
            h.owners.append(n.sender)
        h.pullers = n.pullers
        if n.kind == "lease":
            if h.renewals >= self.max_renewals:
                return self._refuse("too many lease renewals")
            h.renewals += 1
            h.deadline = max(h.deadline, now + min(n.seconds, self.max_lease_s))
        else:
            h.ended[n.sender] = n.kind
            if len(h.ended) == h.pullers:  # the last puller: free the blocks
                h.released = True
                h.kind = "done" if all(k == "done" for k in h.ended.values()) else "abort"
        self.stats.accepted[n.kind] += 1
        return None

    def _keep_early(self, n: Notice, now: float) -> Optional[str]:
        if n.rid in self._released:
            return self._refuse("request already released")
        self._expire_early(now)
        key = (n.rid, n.sender)
        if key not in self._early and len(self._early) >= self.max_early:
            self._early.popitem(last=False)  # the oldest goes: an early notice is a hint, the lease is the rule
            self._refuse("early notices full")
        self._early[key] = (n, now)
        return None

    def _expire_early(self, now: float) -> None:
        while self._early:
            _, (_, t) = next(iter(self._early.items()))
            if now - t <= self.early_ttl_s:
                return
            self._early.popitem(last=False)

    def _refuse(self, why: str) -> str:
        self.stats.refused[why] = self.stats.refused.get(why, 0) + 1
        return why

    def finished(self, now: Optional[float] = None) -> Tuple[Set[str], Set[str]]:
        """(released, expired) since the last call: requests whose owner said done/abort, and those whose
        lease ran out. Both are forgotten; later notices for them are refused."""
        now = time.monotonic() if now is None else now
        released, expired = set(), set()
        with self._lock:
            self._released_by = {}
            for rid, h in list(self._held.items()):
                if h.released:
                    released.add(rid)
                    self._released_by[rid] = h.kind
                elif now >= h.deadline:
                    expired.add(rid)
                else:
                    continue
                del self._held[rid]
            self._remember_released(released | expired)
            self._expire_early(now)
        return released, expired

    def _remember_released(self, rids: Set[str]) -> None:
        # a bounded set, so that a late notice for a freed request is refused rather than kept early
        if len(self._released) + len(rids) > self.max_held:
            self._released.clear()
        self._released |= rids

    def released_by(self, rid: str) -> Optional[str]:
        """"done" or "abort": the notice that released ``rid`` (of the last :meth:`finished` call)."""
        with self._lock:
            return self._released_by.get(rid)

    def owner(self, rid: str) -> Optional[int]:
        """The cluster id the request is bound to (its first puller's); None before any notice."""
        with self._lock:
            h = self._held.get(rid)
            return h.owners[0] if h and h.owners else None

    def owners(self, rid: str) -> List[int]:
        """Every cluster id the request is bound to (one per puller that sent a notice so far)."""
        with self._lock:
            h = self._held.get(rid)
            return list(h.owners) if h else []

    def __len__(self) -> int:
        with self._lock:
            return len(self._held) + len(self._early)


def _same(a: str, b: str) -> bool:
    import hmac

    return hmac.compare_digest(a.encode(), b.encode())


class Inbox:
    """Takes the engine's notifications and hands every notice to ``holder`` (if any). Call :meth:`poll`
    from one thread (the engine's step); it never raises for what a peer sent."""

    def __init__(self, dd, holder: Optional[Holder] = None, log: Optional[Callable[[str], None]] = None,
                 reservations: Optional["Reservations"] = None):
        self.dd, self.holder, self._log, self.reservations = dd, holder, log, reservations
        self.dropped: Dict[str, int] = {}  # reason -> count (malformed, foreign, no holder)

    def poll(self) -> List[Tuple[Notice, Optional[str]]]:
        """The notices received since the last call, each with None (applied) or why it was refused."""
        out = []
        for sender, name, message in self.dd.get_notifies():
            try:
                n = decode(sender, name, message)
            except ValueError as e:
                self._drop(str(e).split(" (")[0], sender)
                continue
            if n.kind == RESERVE:
                if self.reservations is None:
                    self._drop("no reservations", sender)
                else:
                    self.reservations.add(n)
                continue
            if self.holder is None:
                self._drop("no holder", sender)
                continue
            why = self.holder.accept(n)
            if why is not None and self._log is not None:
                self._log(f"refused {n.kind} notice for request {n.rid[:64]!r} from cluster {sender}: {why}")
            out.append((n, why))
        return out

    def _drop(self, why: str, sender: int) -> None:
        self.dropped[why] = self.dropped.get(why, 0) + 1
        if self._log is not None and self.dropped[why] <= 10:
            self._log(f"dropped a notification from cluster {sender}: {why}")


class Reservations:
    """A pusher's view of the receivers' reservations (layer-wise push): transfer id and sender -> the
    reserve notice. The pusher takes the one from the engine the transfer was handed to (its own params
    name it), so a reservation from any other engine is never used. Bounded: ``max_entries`` (the oldest
    goes first), each kept ``ttl_s`` at most. Thread-safe."""

    def __init__(self, max_entries: int = 4096, ttl_s: float = 60.0):
        self.max_entries, self.ttl_s = max_entries, ttl_s
        self._lock = threading.Lock()
        self._by: "collections.OrderedDict[Tuple[str, int], Tuple[Notice, float]]" = collections.OrderedDict()

    def add(self, n: Notice, now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._expire(now)
            self._by.pop((n.rid, n.sender), None)
            if len(self._by) >= self.max_entries:
                self._by.popitem(last=False)
            self._by[(n.rid, n.sender)] = (n, now)

    def take(self, xfer: str, sender: int) -> Optional[Notice]:
        with self._lock:
            got = self._by.pop((xfer, sender), None)
            return got[0] if got else None

    def _expire(self, now: float) -> None:
        while self._by:
            _, (_, t) = next(iter(self._by.items()))
            if now - t <= self.ttl_s:
                return
            self._by.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by)


def send_reserve(dd, cluster_id: int, xfer: str, ticket: str, blocks: List[int], offset: int,
                 timeout_ms: int = 1000) -> None:
    dd.send_notify(cluster_id, NAME, encode_reserve(xfer, ticket, blocks, offset), timeout_ms)


def send(dd, cluster_id: int, kind: str, rid: str, ticket: str, seconds: float = 0.0,
         timeout_ms: int = 1000, pullers: int = 1) -> None:
    """Send one notice on the link to ``cluster_id`` (returns once the peer queued it); ``pullers``: how
    many engines pull the request from that holder (each sends its own done). Raises what ``encode`` and
    ``send_notify`` raise."""
    dd.send_notify(cluster_id, NAME, encode(kind, rid, ticket, seconds, pullers), timeout_ms)
