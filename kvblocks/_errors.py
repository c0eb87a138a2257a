# SPDX-License-Identifier: Apache-2.0
"""The status table (the one Python copy of the C++ header's ``LLM_*`` constants) and the one
status -> exception mapping used by every kvblocks call."""
from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """CANN LLM-DataDist status codes (``0x5010B000 + n``; ``LLM_FAILED`` is all ones)."""

    LLM_SUCCESS = 0x0
    LLM_FAILED = 0xFFFFFFFF
    LLM_WAIT_PROC_TIMEOUT = 0x5010B001
    LLM_KV_CACHE_NOT_EXIST = 0x5010B002
    LLM_REPEAT_REQUEST = 0x5010B003
    LLM_REQUEST_ALREADY_COMPLETED = 0x5010B004
    LLM_PARAM_INVALID = 0x5010B005
    LLM_ENGINE_FINALIZED = 0x5010B006
    LLM_NOT_YET_LINK = 0x5010B007
    LLM_ALREADY_LINK = 0x5010B008
    LLM_LINK_FAILED = 0x5010B009
    LLM_UNLINK_FAILED = 0x5010B00A
    LLM_NOTIFY_PROMPT_UNLINK_FAILED = 0x5010B00B
    LLM_CLUSTER_NUM_EXCEED_LIMIT = 0x5010B00C
    LLM_PROCESSING_LINK = 0x5010B00D
    LLM_DEVICE_OUT_OF_MEMORY = 0x5010B00E
    LLM_PREFIX_ALREADY_EXIST = 0x5010B00F
    LLM_PREFIX_NOT_EXIST = 0x5010B010
    LLM_SEQ_LEN_OVER_LIMIT = 0x5010B011
    LLM_NO_FREE_BLOCK = 0x5010B012
    LLM_BLOCKS_OUT_OF_MEMORY = 0x5010B013
    LLM_CACHE_INCOMPATIBLE = 0x5010B014
    LLM_CACHE_KEY_ALREADY_EXIST = 0x5010B015
    LLM_COPY_CACHE_FAILED = 0x5010B016
    LLM_CACHE_ID_ALREADY_EXIST = 0x5010B017
    LLM_EXIST_LINK = 0x5010B018
    LLM_FEATURE_NOT_ENABLED = 0x5010B019
    LLM_TIMEOUT = 0x5010B01A
    LLM_LINK_BUSY = 0x5010B01B
    LLM_OUT_OF_MEMORY = 0x5010B01C


class LLMException(RuntimeError):
    """Base of every kvblocks failure; ``status_code`` is the C++ status."""

    def __init__(self, *args: object, status_code: int = Status.LLM_FAILED) -> None:
        super().__init__(*args)
        try:
            self._status_code: int = Status(status_code)
        except ValueError:
            self._status_code = int(status_code)

    @property
    def status_code(self) -> int:
        return self._status_code


class ParamInvalidError(LLMException, ValueError):
    """``LLM_PARAM_INVALID``: an argument was rejected before any byte moved."""


class CacheNotExistError(LLMException, LookupError):
    """``LLM_KV_CACHE_NOT_EXIST``: the local or remote cache id is unknown."""


class LLMTimeoutError(LLMException, TimeoutError):
    """``LLM_TIMEOUT`` / ``LLM_WAIT_PROC_TIMEOUT``: the deadline passed; the link is now broken."""


class LinkError(LLMException, ConnectionError):
    """Link states: not linked, already linked, link/unlink failed, links still exist."""


class LLMOutOfMemoryError(LLMException, MemoryError):
    """``LLM_OUT_OF_MEMORY`` / ``LLM_DEVICE_OUT_OF_MEMORY``."""


class FeatureNotEnabledError(LLMException, NotImplementedError):
    """``LLM_FEATURE_NOT_ENABLED``."""


_CLASS_BY_STATUS: dict[int, type[LLMException]] = {
    Status.LLM_PARAM_INVALID: ParamInvalidError,
    Status.LLM_KV_CACHE_NOT_EXIST: CacheNotExistError,
    Status.LLM_TIMEOUT: LLMTimeoutError,
    Status.LLM_WAIT_PROC_TIMEOUT: LLMTimeoutError,
    Status.LLM_NOT_YET_LINK: LinkError,
    Status.LLM_ALREADY_LINK: LinkError,
    Status.LLM_LINK_FAILED: LinkError,
    Status.LLM_UNLINK_FAILED: LinkError,
    Status.LLM_EXIST_LINK: LinkError,
    Status.LLM_NOTIFY_PROMPT_UNLINK_FAILED: LinkError,
    Status.LLM_PROCESSING_LINK: LinkError,
    Status.LLM_LINK_BUSY: LinkError,
    Status.LLM_OUT_OF_MEMORY: LLMOutOfMemoryError,
    Status.LLM_DEVICE_OUT_OF_MEMORY: LLMOutOfMemoryError,
    Status.LLM_FEATURE_NOT_ENABLED: FeatureNotEnabledError,
}


def status_name(status: int) -> str:
    try:
        return Status(status).name
    except ValueError:
        return hex(status)


def exception_for(status: int, what: str, detail: str = "") -> LLMException:
    """Builds the exception for a failed call: the one status -> exception mapping."""
    cls = _CLASS_BY_STATUS.get(status, LLMException)
    msg = f"{what} failed: {status_name(status)} ({status:#x})"
    if detail:
        msg += f": {detail}"
    return cls(msg, status_code=status)
