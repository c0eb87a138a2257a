# SPDX-License-Identifier: Apache-2.0
"""Argument checkers with CANN's exception types: TypeError for types, ValueError for ranges."""
from __future__ import annotations

from typing import Any, Tuple, Type, Union

_TypeSpec = Union[Type[Any], Tuple[Type[Any], ...]]


def check_isinstance(name: str, value: object, types: _TypeSpec, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, types):
        want = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise TypeError(f"{name} must be {want}, got {type(value).__name__}")


def _check_int(name: str, value: object, lo: int, hi: int, kind: str) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{name} must be int ({kind}), got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} = {value} is out of range for {kind} [{lo}, {hi}]")
    return int(value)


def check_uint16(name: str, value: object) -> int:
    return _check_int(name, value, 0, 2**16 - 1, "uint16")


def check_uint32(name: str, value: object) -> int:
    return _check_int(name, value, 0, 2**32 - 1, "uint32")


def check_int32(name: str, value: object) -> int:
    return _check_int(name, value, -(2**31), 2**31 - 1, "int32")


def check_uint64(name: str, value: object) -> int:
    return _check_int(name, value, 0, 2**64 - 1, "uint64")


def check_int64(name: str, value: object) -> int:
    return _check_int(name, value, -(2**63), 2**63 - 1, "int64")


def check_int_list(name: str, value: object) -> None:
    """A list or tuple of int (numpy arrays are rejected, as CANN)."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list or tuple of int, got {type(value).__name__}")
    for x in value:
        if not isinstance(x, int):
            raise TypeError(f"{name} must contain int, got {type(x).__name__}")
