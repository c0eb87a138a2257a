# SPDX-License-Identifier: Apache-2.0
"""KvblocksConnector's statistics for vLLM (KVConnectorStats and Prometheus metrics), as
NixlConnector reports its own: the worker collects one interval's observations, vLLM's scheduler
aggregates them across workers and steps, its logger prints :meth:`KvblocksConnectorStats.reduce`
and its ``/metrics`` shows :class:`KvblocksPromMetrics`.

An interval holds the decode worker's request pulls (time, bytes) and failed pulls, plus the
growth of the kvblocks engine's own counters (README "Metrics") since the previous interval:
transfers that failed, timeouts, bytes in and out, link breaks and failed link attempts.
"""
import copy
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.v1.metrics.utils import create_metric_per_engine

# Counters of the engine snapshot summed into an interval (delta since the previous one).
ENGINE_COUNTERS = ("transfers", "transfers_failed", "timeouts", "bytes_in", "bytes_out", "links",
                   "link_failures", "link_breaks")


def engine_totals(snapshot: Dict[str, Any]) -> Dict[str, int]:
    """The ENGINE_COUNTERS of one ``LlmDataDist.metrics()`` snapshot, over every peer and path."""
    t = dict.fromkeys(ENGINE_COUNTERS, 0)
    for p in snapshot.get("peers", []):
        t["timeouts"] += p["timeouts"]
        t["links"] += p["links"]
        t["link_failures"] += p["link_failures"]
        t["link_breaks"] += p["link_breaks"]
        for path in p["paths"]:
            t["bytes_in"] += path["bytes_in"]
            t["bytes_out"] += path["bytes_out"]
            for k in path["kinds"]:
                t["transfers"] += k["count"]
                t["transfers_failed"] += k["count"] - k["status"].get("success", 0)
    return t


@dataclass
class KvblocksConnectorStats(KVConnectorStats):
    """One interval: lists of per-pull observations and engine counter deltas (all serializable)."""

    def __post_init__(self) -> None:
        if not self.data:
            self.reset()

    def reset(self) -> None:
        self.data: Dict[str, Any] = {
            "pull_duration": [],    # seconds per successful request pull (link, claim and pull_kv_blocks)
            "pull_bytes": [],       # bytes per successful request pull
            "num_failed_pulls": 0,  # request pulls whose blocks vLLM recomputes
            "engine": dict.fromkeys(ENGINE_COUNTERS, 0),
        }

    def record_pull(self, seconds: float, nbytes: int) -> None:
        self.data["pull_duration"].append(seconds)
        self.data["pull_bytes"].append(nbytes)

    def record_failed_pull(self) -> None:
        self.data["num_failed_pulls"] += 1

    def record_engine(self, delta: Dict[str, int]) -> None:
        for k, v in delta.items():
            self.data["engine"][k] = self.data["engine"].get(k, 0) + v

    def clone_and_reset(self) -> "KvblocksConnectorStats":
        old = copy.copy(self)
        self.reset()
        return old

    def is_empty(self) -> bool:
        return (not self.data["pull_duration"] and not self.data["num_failed_pulls"]
                and not any(self.data["engine"].values()))

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        if not other.is_empty():
            o = other.data
            self.data["pull_duration"].extend(o.get("pull_duration", []))
            self.data["pull_bytes"].extend(o.get("pull_bytes", []))
            self.data["num_failed_pulls"] += o.get("num_failed_pulls", 0)
            self.record_engine(o.get("engine", {}))
        return self

    def reduce(self) -> Dict[str, Any]:
        d, e = self.data["pull_duration"], self.data["engine"]
        n = len(d)
        mb = sum(self.data["pull_bytes"]) / 2**20
        p90 = sorted(d)[min(n - 1, (9 * n) // 10)] if n else 0.0
        return {
            "Num successful pulls": n,
            "Avg pull time (ms)": round(sum(d) / n * 1e3, 3) if n else 0,
            "P90 pull time (ms)": round(p90 * 1e3, 3),
            "Avg MB per pull": round(mb / n, 3) if n else 0,
            "Throughput (MB/s)": round(mb / sum(d), 3) if n and sum(d) > 0 else 0,
            "Num failed pulls": self.data["num_failed_pulls"],
            "Failed transfers": e.get("transfers_failed", 0),
            "Timeouts": e.get("timeouts", 0),
            "Link breaks": e.get("link_breaks", 0),
        }


class KvblocksPromMetrics(KVConnectorPromMetrics):
    """``vllm:kvblocks_*`` on vLLM's ``/metrics``, labelled per vLLM engine as vLLM's own metrics."""

    # kvblocks' latency buckets (1 us .. 100 s, 4 a decade), from 100 us: a request pull takes longer.
    PULL_BUCKETS: List[float] = [10 ** (e / 4) for e in range(-16, 9)]

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)

        def per_engine(cls, name, doc, **kw):
            return create_metric_per_engine(cls(name=name, documentation=doc, labelnames=labelnames, **kw),
                                            self.per_engine_labelvalues)

        self.pull_time = per_engine(self._histogram_cls, "vllm:kvblocks_pull_time_seconds",
                                    "Time of one request's KV pull over kvblocks (link, claim and transfer).",
                                    buckets=self.PULL_BUCKETS)
        self.pull_bytes = per_engine(self._counter_cls, "vllm:kvblocks_pulled_bytes",
                                     "Bytes of KV pulled by successful request pulls over kvblocks.")
        self.failed_pulls = per_engine(self._counter_cls, "vllm:kvblocks_failed_pulls",
                                       "Request pulls that failed (vLLM recomputes their blocks).")
        self.engine: Dict[str, Any] = {}
        for key, doc in (("transfers", "kvblocks transfers finished, any status."),
                         ("transfers_failed", "kvblocks transfers that ended with an error."),
                         ("timeouts", "kvblocks transfers that timed out."),
                         ("bytes_in", "Bytes kvblocks transfers moved into this instance."),
                         ("bytes_out", "Bytes kvblocks transfers moved out of this instance."),
                         ("links", "kvblocks links made or accepted."),
                         ("link_failures", "kvblocks link attempts that failed."),
                         ("link_breaks", "kvblocks links that broke while up.")):
            self.engine[key] = per_engine(self._counter_cls, f"vllm:kvblocks_{key}", doc)

    def observe(self, transfer_stats_data: Dict[str, Any], engine_idx: int = 0) -> None:
        for s in transfer_stats_data.get("pull_duration", []):
            self.pull_time[engine_idx].observe(s)
        nbytes = sum(transfer_stats_data.get("pull_bytes", []))
        if nbytes:
            self.pull_bytes[engine_idx].inc(nbytes)
        if transfer_stats_data.get("num_failed_pulls"):
            self.failed_pulls[engine_idx].inc(transfer_stats_data["num_failed_pulls"])
        for k, v in transfer_stats_data.get("engine", {}).items():
            if v and k in self.engine:
                self.engine[k][engine_idx].inc(v)


class EngineDelta:
    """Growth of one engine's counters between calls (a counter never shrinks while the engine lives)."""

    def __init__(self) -> None:
        self._last: Optional[Dict[str, int]] = None

    def take(self, snapshot: Dict[str, Any]) -> Dict[str, int]:
        now = engine_totals(snapshot)
        last = self._last or dict.fromkeys(ENGINE_COUNTERS, 0)
        self._last = now
        return {k: now[k] - last[k] for k in ENGINE_COUNTERS if now[k] != last[k]}
