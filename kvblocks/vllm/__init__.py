# SPDX-License-Identifier: Apache-2.0
"""vLLM integration: ``KvblocksConnector``, a disaggregated prefill/decode KV connector on kvblocks.

Needs vLLM (``pip install "kvblocks[vllm]"``); ``import kvblocks`` alone never imports vLLM or torch, and
neither does ``import kvblocks.vllm``: the connector module loads on first access to its names.
Select it with ``KVTransferConfig(kv_connector="KvblocksConnector", kv_connector_module_path="kvblocks.vllm",
kv_role=..., kv_connector_extra_config={...})``; see :mod:`kvblocks.vllm.connector` and the README.
"""
from typing import Any

__all__ = ["KvblocksConnector", "KvblocksConnectorMetadata"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kvblocks.vllm import connector

        return getattr(connector, name)
    raise AttributeError(f"module 'kvblocks.vllm' has no attribute {name!r}")
