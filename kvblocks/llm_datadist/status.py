# SPDX-License-Identifier: Apache-2.0
"""CANN ``llm_datadist`` status types: LLMStatusCode, LLMException, Status."""
from __future__ import annotations

import contextlib
import enum
from typing import Iterator, NoReturn, Union

from kvblocks import _errors

__all__ = ["LLMStatusCode", "LLMException", "Status", "code_2_status", "raise_if_false"]

_S = _errors.Status
# kvblocks.Status members that CANN's Python LLMStatusCode does not have (spec section 2).
_NOT_IN_CANN_PYTHON = frozenset({_S.LLM_CACHE_INCOMPATIBLE, _S.LLM_CACHE_KEY_ALREADY_EXIST,
                                 _S.LLM_COPY_CACHE_FAILED, _S.LLM_CACHE_ID_ALREADY_EXIST})


class LLMStatusCode(enum.IntEnum):
    """Status codes with CANN's Python member names (note LLM_WAIT_PROCESS_TIMEOUT and
    LLM_SEQ_LENOVERLIMIT). An unknown integer converts to ``LLM_FAILED``.

    The values come from the one status table, :class:`kvblocks.Status`; only CANN's Python spellings,
    the codes CANN's enum leaves out (``_NOT_IN_CANN_PYTHON``) and its Python-only raw codes live here.
    """

    LLM_SUCCESS = _S.LLM_SUCCESS.value
    LLM_FAILED = _S.LLM_FAILED.value
    LLM_WAIT_PROCESS_TIMEOUT = _S.LLM_WAIT_PROC_TIMEOUT.value
    LLM_KV_CACHE_NOT_EXIST = _S.LLM_KV_CACHE_NOT_EXIST.value
    LLM_REPEAT_REQUEST = _S.LLM_REPEAT_REQUEST.value
    LLM_REQUEST_ALREADY_COMPLETED = _S.LLM_REQUEST_ALREADY_COMPLETED.value
    LLM_PARAM_INVALID = _S.LLM_PARAM_INVALID.value
    LLM_ENGINE_FINALIZED = _S.LLM_ENGINE_FINALIZED.value
    LLM_NOT_YET_LINK = _S.LLM_NOT_YET_LINK.value
    LLM_ALREADY_LINK = _S.LLM_ALREADY_LINK.value
    LLM_LINK_FAILED = _S.LLM_LINK_FAILED.value
    LLM_UNLINK_FAILED = _S.LLM_UNLINK_FAILED.value
    LLM_NOTIFY_PROMPT_UNLINK_FAILED = _S.LLM_NOTIFY_PROMPT_UNLINK_FAILED.value
    LLM_CLUSTER_NUM_EXCEED_LIMIT = _S.LLM_CLUSTER_NUM_EXCEED_LIMIT.value
    LLM_PROCESSING_LINK = _S.LLM_PROCESSING_LINK.value
    LLM_DEVICE_OUT_OF_MEMORY = _S.LLM_DEVICE_OUT_OF_MEMORY.value
    LLM_PREFIX_ALREADY_EXIST = _S.LLM_PREFIX_ALREADY_EXIST.value
    LLM_PREFIX_NOT_EXIST = _S.LLM_PREFIX_NOT_EXIST.value
    LLM_SEQ_LENOVERLIMIT = _S.LLM_SEQ_LEN_OVER_LIMIT.value
    LLM_NO_FREE_BLOCK = _S.LLM_NO_FREE_BLOCK.value
    LLM_BLOCKS_OUT_OF_MEMORY = _S.LLM_BLOCKS_OUT_OF_MEMORY.value
    LLM_EXIST_LINK = _S.LLM_EXIST_LINK.value
    LLM_FEATURE_NOT_ENABLED = _S.LLM_FEATURE_NOT_ENABLED.value
    LLM_TIMEOUT = _S.LLM_TIMEOUT.value
    LLM_LINK_BUSY = _S.LLM_LINK_BUSY.value
    LLM_OUT_OF_MEMORY = _S.LLM_OUT_OF_MEMORY.value
    # Python-only: raw ACL runtime codes that CANN passes through, and CANN's "unknown" marker.
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
