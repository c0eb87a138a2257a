# SPDX-License-Identifier: Apache-2.0
"""kvblocks metrics for Prometheus (README "Metrics").

``kvblocks.metrics()`` snapshots become Prometheus families here, once, in one place:

* :func:`exposition` renders them in Prometheus' text format (no dependency);
* :class:`KvblocksCollector` plugs them into ``prometheus_client`` (``pip install kvblocks[prometheus]``):
  ``prometheus_client.REGISTRY.register(KvblocksCollector())``, or :func:`register`;
* :func:`serve` (``kvblocks.serve_metrics``) answers ``GET /metrics`` from a daemon thread.

``import kvblocks`` never imports this module, and this module imports ``prometheus_client`` only
inside the functions that need it.
"""
import http.server
import threading
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

Labels = Tuple[Tuple[str, str], ...]


class Family(NamedTuple):
    """One metric family: ``kind`` is "counter", "gauge" or "histogram". Counter names carry no
    ``_total`` (the renderers add it). A histogram's sample value is (cumulative buckets as
    [(le, count)], sum, count)."""
    name: str
    kind: str
    help: str
    samples: List[Tuple[Labels, object]]


_HELP = {
    "kvblocks_transfers": ("counter", "Transfers finished, by kind, path, peer and final status."),
    "kvblocks_transfer_seconds": ("histogram", "Transfer latency from the call (or submission) to its end."),
    "kvblocks_bytes": ("counter", "Bytes moved by successful transfers; direction in: pulled/read, out: pushed/written."),
    "kvblocks_transfers_in_flight": ("gauge", "Transfers moving bytes on a path now."),
    "kvblocks_transfer_timeouts": ("counter", "Transfers that ended LLM_TIMEOUT."),
    "kvblocks_link_events": ("counter", "Link events: linked, relinked, unlinked, failed (attempt), broken (was up)."),
    "kvblocks_link_up": ("gauge", "1 while a live link to the peer exists."),
    "kvblocks_data_channels": ("gauge", "Data channels open on the link to the peer."),
    "kvblocks_notifications": ("counter", "Notifications sent (acknowledged) and received."),
    "kvblocks_crc_mismatches": ("counter", "Transfer checks (kvblocks.Integrity=crc32c) that failed on this side."),
    "kvblocks_caches": ("gauge", "Caches registered or allocated in the engine."),
    "kvblocks_cache_bytes": ("gauge", "Bytes of the caches registered or allocated in the engine."),
}

_EVENTS = (("linked", "links"), ("relinked", "relinks"), ("unlinked", "unlinks"), ("failed", "link_failures"),
           ("broken", "link_breaks"))


def _peer(p: dict) -> str:
    return "none" if p["peer"] is None else str(p["peer"])


def _add_engine(fam: Dict[str, Family], e: dict) -> None:
    eng = (("engine", str(e["cluster_id"])),)
    fam["kvblocks_caches"].samples.append((eng, e["caches"]))
    fam["kvblocks_cache_bytes"].samples.append((eng, e["cache_bytes"]))
    bounds = e["bucket_bounds"]
    for p in e["peers"]:
        peer = eng + (("peer", _peer(p)),)
        if p["peer"] is not None:
            fam["kvblocks_link_up"].samples.append((peer, 1 if p["linked"] else 0))
            fam["kvblocks_data_channels"].samples.append((peer, p["data_channels"]))
            for event, key in _EVENTS:
                fam["kvblocks_link_events"].samples.append((peer + (("event", event),), p[key]))
            for d in ("sent", "received"):
                fam["kvblocks_notifications"].samples.append((peer + (("direction", d),), p["notifies_" + d]))
        fam["kvblocks_transfer_timeouts"].samples.append((peer, p["timeouts"]))
        fam["kvblocks_crc_mismatches"].samples.append((peer, p["crc_mismatches"]))
        for path in p["paths"]:
            at = peer + (("path", path["path"]),)
            fam["kvblocks_transfers_in_flight"].samples.append((at, path["in_flight"]))
            for d in ("in", "out"):
                fam["kvblocks_bytes"].samples.append((at + (("direction", d),), path["bytes_" + d]))
            for k in path["kinds"]:
                kind = at + (("kind", k["kind"]),)
                for status, n in k["status"].items():
                    fam["kvblocks_transfers"].samples.append((kind + (("status", status),), n))
                cum, acc = [], 0
                for le, n in zip(bounds + [float("inf")], k["buckets"]):
                    acc += n
                    cum.append((le, acc))
                fam["kvblocks_transfer_seconds"].samples.append((kind, (cum, k["seconds_sum"], k["count"])))


def families(engines: Optional[List[dict]] = None) -> List[Family]:
    """The families of ``engines`` (default: ``kvblocks.metrics()``, this process's engines)."""
    if engines is None:
        import kvblocks

        engines = kvblocks.metrics()
    fam = {n: Family(n, k, h, []) for n, (k, h) in _HELP.items()}
    for e in engines:
        _add_engine(fam, e)
    return list(fam.values())


def _fmt(v) -> str:
    if isinstance(v, float):
        if v == float("inf"):
            return "+Inf"
        return repr(v)
    return str(v)


def _labels(labels: Labels) -> str:
    esc = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, v in labels)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(labels, esc)) + "}" if labels else ""


def exposition(engines: Optional[List[dict]] = None) -> str:
    """Prometheus' text format (version 0.0.4) of ``engines`` (default: this process's)."""
    out = []
    for f in families(engines):
        name = f.name + "_total" if f.kind == "counter" else f.name
        out.append(f"# HELP {name} {f.help}")
        out.append(f"# TYPE {name} {f.kind}")
        for labels, v in f.samples:
            if f.kind != "histogram":
                out.append(f"{name}{_labels(labels)} {_fmt(v)}")
                continue
            cum, total, count = v
            for le, n in cum:
                out.append(f"{name}_bucket{_labels(labels + (('le', _fmt(float(le))),))} {n}")
            out.append(f"{name}_sum{_labels(labels)} {_fmt(float(total))}")
            out.append(f"{name}_count{_labels(labels)} {count}")
    return "\n".join(out) + "\n"


class KvblocksCollector:
    """A ``prometheus_client`` collector of every kvblocks engine of this process, read at each scrape."""

    def describe(self) -> Iterable:
        return []  # families appear with engines; an empty describe keeps registration cheap

    def collect(self) -> Iterable:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        for f in families():
            names = sorted({k for labels, _ in f.samples for k, _ in labels if k != "le"})
            if f.kind == "histogram":
                m = HistogramMetricFamily(f.name, f.help, labels=names)
                for labels, (cum, total, _) in f.samples:
                    d = dict(labels)
                    m.add_metric([d[n] for n in names], [(_fmt(float(le)), n) for le, n in cum], total)
            else:
                cls = CounterMetricFamily if f.kind == "counter" else GaugeMetricFamily
                m = cls(f.name, f.help, labels=names)
                for labels, v in f.samples:
                    d = dict(labels)
                    m.add_metric([d[n] for n in names], v)
            yield m


def register(registry=None) -> KvblocksCollector:
    """Registers a :class:`KvblocksCollector` with ``registry`` (default: prometheus_client's REGISTRY)."""
    if registry is None:
        from prometheus_client import REGISTRY as registry
    c = KvblocksCollector()
    registry.register(c)
    return c


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        body = exposition().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # scrapes are not worth a line each
        pass


def serve(port: int, addr: str = "127.0.0.1") -> http.server.ThreadingHTTPServer:
    """Serves ``GET /metrics`` on ADDR:PORT from a daemon thread; ``port`` 0 picks one
    (``server.server_port``); ``server.shutdown()`` stops it. With prometheus_client installed the
    body is its rendering of :class:`KvblocksCollector` (in a registry of its own), else
    :func:`exposition`'s: the same families either way."""
    handler = _Handler
    try:
        from prometheus_client import CollectorRegistry, generate_latest
    except ImportError:
        pass
    else:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(KvblocksCollector())

        class _ClientHandler(_Handler):
            def do_GET(self):  # noqa: N802
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = generate_latest(reg)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        handler = _ClientHandler
    server = http.server.ThreadingHTTPServer((addr, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="kvblocks-metrics", daemon=True).start()
    return server


def parse(text: str) -> Dict[Tuple[str, Labels], float]:
    """Samples of an exposition as {(name, sorted labels): value} (for ``kvblocks stats URL`` and tests)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels = []
        for part in rest.rstrip("}").split('",') if rest else []:
            k, _, v = part.partition('="')
            labels.append((k.strip(","), v.rstrip('"')))
        out[(name, tuple(sorted(labels)))] = float(value)
    return out
