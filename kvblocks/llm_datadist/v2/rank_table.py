# SPDX-License-Identifier: Apache-2.0
"""CANN's rank-table JSON, as :meth:`LLMDataDist.link` takes it, mapped onto kvblocks listeners.

A rank table names every member by ``rank_id`` and gives its NPU's RoCE address, ``device_ip``,
without a port. kvblocks links over TCP to a listener, so each member's listener is
``(device_ip, port)`` where ``port`` is the device entry's ``device_port`` (a kvblocks extension;
``port`` is accepted too), else the caller's default (this engine's own listen port: CANN
deployments listen on the same port everywhere).
"""
from __future__ import annotations

import ipaddress
import json
from typing import Any, Dict, Optional, Tuple

from kvblocks.llm_datadist.status import LLMException, LLMStatusCode

__all__ = ["RankEntry", "parse_rank_table"]

VERSIONS = ("1.0", "1.2")
_PORT_KEYS = ("device_port", "port")


class RankEntry:
    """One device of the rank table: where its rank's kvblocks listener is."""

    __slots__ = ("rank_id", "device_ip", "port", "where")

    def __init__(self, rank_id: int, device_ip: str, port: Optional[int], where: str) -> None:
        self.rank_id = rank_id
        self.device_ip = device_ip
        self.port = port
        self.where = where

    def __repr__(self) -> str:
        return f"RankEntry(rank_id={self.rank_id}, device_ip={self.device_ip!r}, port={self.port}, at {self.where})"


def _bad(msg: str) -> LLMException:
    return LLMException(f"rank_table: {msg}", status_code=LLMStatusCode.LLM_PARAM_INVALID)


def _uint(value: Any, where: str, limit: int) -> int:
    # HCCL rank tables write numbers as strings ("0"); plain JSON integers are accepted too.
    if isinstance(value, bool):
        raise _bad(f"{where} must be a non-negative integer, got {value!r}")
    if isinstance(value, str) and value.isdigit() and value.isascii():
        value = int(value)
    if not isinstance(value, int) or not 0 <= value <= limit:
        raise _bad(f"{where} must be a non-negative integer (at most {limit}), got {value!r}")
    return value


def parse_rank_table(rank_table: str) -> Dict[int, RankEntry]:
    """Returns ``{rank_id: RankEntry}``; raises ``LLMException(LLM_PARAM_INVALID)`` naming the bad field."""
    try:
        doc = json.loads(rank_table)
    except ValueError as e:
        raise _bad(f"not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise _bad(f"must be a JSON object, got {type(doc).__name__}")
    if "status" not in doc:
        raise _bad('has no "status"')
    if doc["status"] != "completed":
        raise _bad(f'status must be "completed", got {doc["status"]!r}')
    if "version" not in doc:
        raise _bad('has no "version"')
    if doc["version"] not in VERSIONS:
        raise _bad(f"version must be one of {', '.join(map(repr, VERSIONS))}, got {doc['version']!r}")
    servers = doc.get("server_list")
    if servers is None:
        raise _bad('has no "server_list"')
    if not isinstance(servers, list) or not servers:
        raise _bad("server_list must be a non-empty list")
    out: Dict[int, RankEntry] = {}
    for si, server in enumerate(servers):
        sw = f"server_list[{si}]"
        if not isinstance(server, dict):
            raise _bad(f"{sw} must be an object")
        if "server_id" not in server:
            raise _bad(f"{sw} has no server_id")
        devices = server.get("device")
        if devices is None:
            raise _bad(f"{sw} has no device")
        if not isinstance(devices, list) or not devices:
            raise _bad(f"{sw}.device must be a non-empty list")
        for di, dev in enumerate(devices):
            dw = f"{sw}.device[{di}]"
            if not isinstance(dev, dict):
                raise _bad(f"{dw} must be an object")
            for field in ("device_id", "device_ip", "rank_id"):
                if field not in dev:
                    raise _bad(f"{dw} has no {field}")
            _uint(dev["device_id"], f"{dw}.device_id", 2**32 - 1)
            rank = _uint(dev["rank_id"], f"{dw}.rank_id", 2**32 - 1)
            ip = dev["device_ip"]
            try:
                ok = isinstance(ip, str) and ipaddress.ip_address(ip).version == 4 and ip.count(".") == 3
            except ValueError:
                ok = False
            if not ok:
                raise _bad(f"{dw}.device_ip must be an IPv4 address without a port, got {ip!r}")
            port: Optional[int] = None
            for key in _PORT_KEYS:
                if key in dev:
                    port = _uint(dev[key], f"{dw}.{key}", 65535)
                    if port == 0:
                        raise _bad(f"{dw}.{key} must be in [1, 65535], got 0")
                    break
            if rank in out:
                raise _bad(f"{dw}.rank_id {rank} is also at {out[rank].where}")
            out[rank] = RankEntry(rank, ip, port, dw)
    return out


def listener_of(entry: RankEntry, default_port: Optional[int]) -> Tuple[str, int]:
    """``(ip, port)`` of the kvblocks listener of ``entry``'s rank."""
    if entry.port is not None:
        return entry.device_ip, entry.port
    if default_port:
        return entry.device_ip, default_port
    raise _bad(f"{entry.where} has no device_port, and this LLMDataDist has no llm.listenIpInfo port to use "
               f"instead (kvblocks links to device_ip:device_port)")
