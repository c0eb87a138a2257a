# SPDX-License-Identifier: Apache-2.0
"""KvblocksConnector and vLLM's NixlConnector with the same stopwatch (for the hand-off comparison).

Both subclasses time, in the decode's scheduler, from the moment the engine gets a request
(``on_new_request``) to the step whose worker output reports its KV landed (``finished_recving`` in
``update_connector_output``), and append ``{"req": id, "seconds": s}`` lines to the file named by
``KVB_TIMING_FILE``. On a prefill they time from ``request_finished`` (blocks kept) to ``finished_sending``
(blocks freed) into ``KVB_SEND_FILE``. ``KVB_STATS_FILE`` gets each KVConnectorStats the scheduler receives. Load with ``kv_connector_module_path="timed_connectors"`` (this folder on PYTHONPATH).
"""
import json
import os
import time

from kvblocks.vllm import KvblocksConnector
from kvblocks.vllm.connector import _allow_amx


class _Timed:
    def on_new_request(self, request):
        self.__dict__.setdefault("_t0", {})[request.request_id] = time.perf_counter()
        return super().on_new_request(request)

    def request_finished(self, request, block_ids):
        delay, params = super().request_finished(request, block_ids)
        if delay:
            self.__dict__.setdefault("_tf", {})[request.request_id] = time.perf_counter()
        return delay, params

    def update_connector_output(self, connector_output):
        now = time.perf_counter()
        stats, path = connector_output.kv_connector_stats, os.environ.get("KVB_STATS_FILE")
        if stats is not None and path:  # what the workers reported, as vLLM's scheduler received it
            with open(path, "a") as f:
                f.write(json.dumps(stats.data) + "\n")
        for ids, store, var in ((connector_output.finished_recving, "_t0", "KVB_TIMING_FILE"),
                                (connector_output.finished_sending, "_tf", "KVB_SEND_FILE")):
            path = os.environ.get(var)
            t0s = self.__dict__.setdefault(store, {})
            for rid in ids or ():
                t0 = t0s.pop(rid, None)
                if t0 is not None and path:
                    with open(path, "a") as f:
                        f.write(json.dumps({"req": rid, "seconds": now - t0}) + "\n")
        return super().update_connector_output(connector_output)


class TimedKvblocksConnector(_Timed, KvblocksConnector):
    pass


try:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector

    class TimedNixlConnector(_Timed, NixlConnector):
        def __init__(self, *args, **kwargs):
            _allow_amx()  # the same vLLM CPU-attention workaround as KvblocksConnector's, so both run
            super().__init__(*args, **kwargs)
except ImportError:  # no nixl support in this vLLM
    pass
