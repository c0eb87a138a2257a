# SPDX-License-Identifier: Apache-2.0
"""CANN ``llm_datadist`` status types: LLMStatusCode, LLMException, Status."""
from __future__ import annotations

import contextlib
import enum
from typing import Iterator, NoReturn, Union

from kvblocks import _errors

__all__ = ["LLMStatusCode", "LLMException", "Status", "code_2_status", "raise_if_false"]


class LLMStatusCode(enum.IntEnum):
    """Status codes with CANN's Python member names (note LLM_WAIT_PROCESS_TIMEOUT and
    LLM_SEQ_LENOVERLIMIT). An unknown integer converts to ``LLM_FAILED``."""

    LLM_SUCCESS = 0x0
    LLM_FAILED = 0xFFFFFFFF
    LLM_WAIT_PROCESS_TIMEOUT = 0x5010B001
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
    LLM_SEQ_LENOVERLIMIT = 0x5010B011
    LLM_NO_FREE_BLOCK = 0x5010B012
    LLM_BLOCKS_OUT_OF_MEMORY = 0x5010B013
    LLM_EXIST_LINK = 0x5010B018
    LLM_FEATURE_NOT_ENABLED = 0x5010B019
    LLM_TIMEOUT = 0x5010B01A
    LLM_LINK_BUSY = 0x5010B01B
    LLM_OUT_OF_MEMORY = 0x5010B01C
    LLM_DEVICE_MEM_ERROR = 507053
    LLM_SUSPECT_REMOTE_ERROR = 507057
    LLM_UNKNOWN_ERROR = -1

    @classmethod
    def _missing_(cls, value: object) -> "LLMStatusCode":
        return cls.LLM_FAILED

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


def code_2_status(code: int) -> LLMStatusCode:
    """Converts an integer status to :class:`LLMStatusCode` (unknown -> ``LLM_FAILED``)."""
    return LLMStatusCode(int(code))


class LLMException(_errors.LLMException):
    """CANN's ``LLMException(RuntimeError)``; ``status_code`` is an :class:`LLMStatusCode`.

    A subclass of :class:`kvblocks.LLMException`, so handlers for either catch it.
    """

    def __init__(self, *args: object, status_code: Union[int, LLMStatusCode] = LLMStatusCode.LLM_SUCCESS) -> None:
        RuntimeError.__init__(self, *args)
        self._status_code: LLMStatusCode = code_2_status(int(status_code))

    @property
    def status_code(self) -> LLMStatusCode:
        return self._status_code


class Status:
    """A status wrapper: ``is_ok()`` and ``status_code``."""

    def __init__(self, status: Union[int, LLMStatusCode]) -> None:
        self._status_code = code_2_status(int(status))

    def is_ok(self) -> bool:
        return self._status_code == LLMStatusCode.LLM_SUCCESS

    @property
    def status_code(self) -> LLMStatusCode:
        return self._status_code

    def __repr__(self) -> str:
        return f"Status({self._status_code})"


def raise_if_false(cond: bool, msg: str, status_code: LLMStatusCode = LLMStatusCode.LLM_PARAM_INVALID) -> None:
    if not cond:
        raise LLMException(msg, status_code=status_code)


def raise_code(func: str, code: Union[int, LLMStatusCode], info: str = "") -> NoReturn:
    st = code_2_status(int(code))
    raise LLMException(f"[{func}] failed, error code is {st}, {info or 'see the kvblocks log'}.", status_code=st)


@contextlib.contextmanager
def engine_call(func: str) -> Iterator[None]:
    """Converts a kvblocks core failure into a compat :class:`LLMException` with the same code."""
    try:
        yield
    except LLMException:
        raise
    except _errors.LLMException as e:
        st = code_2_status(int(e.status_code))
        raise LLMException(f"[{func}] failed, error code is {st}, {e}.", status_code=st) from e
