# SPDX-License-Identifier: Apache-2.0
"""The one status -> exception mapping used by every kvblocks call. The status table itself,
:class:`Status`, is generated from the C++ header's ``LLM_*`` constants (kvblocks/_tables.py)."""
from __future__ import annotations

from kvblocks._tables import Status

__all__ = ["Status", "LLMException", "ParamInvalidError", "CacheNotExistError", "LLMTimeoutError", "LinkError",
           "LLMOutOfMemoryError", "FeatureNotEnabledError", "status_name", "exception_for"]


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
