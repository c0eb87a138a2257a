# SPDX-License-Identifier: Apache-2.0
"""vLLM integration: ``KvblocksConnector``, a disaggregated prefill/decode KV connector on kvblocks.

Needs vLLM (``pip install "kvblocks[vllm]"``); ``import kvblocks`` alone never imports vLLM or torch.
Select it with ``KVTransferConfig(kv_connector="KvblocksConnector", kv_connector_module_path="kvblocks.vllm",
kv_role=..., kv_connector_extra_config={...})``; see :mod:`kvblocks.vllm.connector` and the README.
"""
from kvblocks.vllm.connector import KvblocksConnector, KvblocksConnectorMetadata

__all__ = ["KvblocksConnector", "KvblocksConnectorMetadata"]
