# SPDX-License-Identifier: Apache-2.0
"""kvblocks: KV-cache block transfer for disaggregated LLM serving.

API-compatible with Huawei CANN LLM-DataDist (``PullKvBlocks`` / ``PushKvBlocks``), on any Linux
machine: in-process copies, same-host shared memory, and TCP between hosts.
"""
import os as _os

__version__ = "0.1.0"


def _source_tree_error(err: ImportError) -> None:
    """Raise a clear ImportError when this ``kvblocks`` is an unbuilt source tree, not an install.

    ``python -m kvblocks`` or ``import kvblocks`` run in the checkout root find ``./kvblocks`` (which has
    ``_lib.pyx`` but no compiled ``_lib``) before the installed package, as Python puts the current
    directory first on ``sys.path``. In any other case this returns and the caller re-raises ``err``.

    Raises:
        ImportError: with what to do instead, when this directory is a source checkout without a built
            ``_lib`` for this interpreter.
    """
    import importlib.machinery

    here = _os.path.dirname(_os.path.abspath(__file__))
    if not _os.path.exists(_os.path.join(here, "_lib.pyx")):
        return  # an installed package: the original error says more
    if any(_os.path.exists(_os.path.join(here, "_lib" + sfx)) for sfx in importlib.machinery.EXTENSION_SUFFIXES):
        return  # built in place but failed to load (e.g. libllm_datadist.so missing): show why
    raise ImportError(
        f"you are importing kvblocks from its source tree ({here}), where the Cython/C++ core is not built "
        f"({err}); the current directory comes first on sys.path and hides an installed kvblocks. "
        "Either `pip install .` and then use the `kvblocks` command (`kvblocks demo`, `kvblocks --help`) or "
        "run Python from another directory, or build in place with `python setup.py build_ext --inplace`."
    ) from None


from kvblocks._errors import (  # noqa: E402
    CacheNotExistError,
    FeatureNotEnabledError,
    LinkError,
    LLMException,
    LLMOutOfMemoryError,
    LLMTimeoutError,
    ParamInvalidError,
)
from kvblocks._tables import *  # noqa: E402,F403  Status and the OPTION_* keys of the C++ headers (generated)
from kvblocks import _tables  # noqa: E402

try:
    from kvblocks._lib import (
        Cache,
        CacheDesc,
        CacheIndex,
        CachePlacement,
        ClusterInfo,
        DataType,
        IpInfo,
        KvCacheExtParam,
        BlockLayout,
        LayerPush,
        PreparedTransfer,
        LINK_FAILURE_REASONS,
        LinkFailure,
        LlmDataDist,
        LlmRole,
        TransferHandle,
        route_logs_to_python,
        process_metrics,
        validate_blocks,
        wait_all,
    )
except ImportError as _err:
    _source_tree_error(_err)
    raise


def metrics() -> list:
    """Counters of every live engine (initialized, not finalized) of this process now: a list with one
    dict per engine, as :meth:`LlmDataDist.metrics` returns (README "Metrics"). Takes no lock a transfer
    needs. Raises nothing."""
    return process_metrics()


def serve_metrics(port: int, addr: str = "127.0.0.1"):
    """Serves this process's metrics in Prometheus' text format on http://ADDR:PORT/metrics from a
    daemon thread (prometheus_client's server when installed, else a small one of kvblocks' own).
    Returns the server; ``port`` 0 picks a free one (``server.server_port``)."""
    from kvblocks.prometheus import serve

    return serve(port, addr)


def get_include() -> str:
    """Directory holding ``llm_datadist/llm_datadist.h`` and ``kvblocks/*.h`` (for ``-I``).

    In a source checkout built in place this is the checkout's ``include/``. Raises nothing.
    """
    here = _os.path.dirname(_os.path.abspath(__file__))
    inc = _os.path.join(here, "include")
    if _os.path.isdir(inc):
        return inc
    return _os.path.join(_os.path.dirname(here), "include")  # a source checkout


def get_library_dir() -> str:
    """Directory holding ``libllm_datadist.so`` (for ``-L`` and ``-Wl,-rpath``). Raises nothing."""
    return _os.path.dirname(_os.path.abspath(__file__))


__all__ = [
    "Cache", "CacheDesc", "CacheIndex", "CacheNotExistError", "CachePlacement", "ClusterInfo", "DataType",
    "FeatureNotEnabledError", "IpInfo", "KvCacheExtParam", "LLMException", "LLMOutOfMemoryError",
    "LLMTimeoutError", "LINK_FAILURE_REASONS", "LinkError", "LinkFailure", "LlmDataDist", "LlmRole", "ParamInvalidError",
    "get_include", "route_logs_to_python",
    "get_library_dir", "validate_blocks", "TransferHandle", "wait_all", "LayerPush", "metrics", "serve_metrics",
    "BlockLayout", "PreparedTransfer",
]
__all__ += _tables.__all__  # Status and the OPTION_* keys
