# SPDX-License-Identifier: Apache-2.0
"""kvblocks in LMCache (0.5.6): a multi-process P2P transfer channel named ``kvblocks``.

LMCache picks its P2P channel by name (``--p2p-transfer-engine``) from a registry filled at import time
and has no plugin discovery, so the channel must be registered in the LMCache server's process before
the server starts: ``python -m kvblocks.lmcache server [kvblocks options] [LMCache server options]``
does that (see :mod:`kvblocks.lmcache.__main__`), or call :func:`register` yourself.

Never imported by ``import kvblocks``; importing this package does not import LMCache either.
"""
from typing import Any, Dict, Optional

__all__ = ["CHANNEL_NAME", "register", "registered_options"]

CHANNEL_NAME = "kvblocks"
_options: Dict[str, Any] = {}


def register(name: str = CHANNEL_NAME, **options: Any) -> None:
    """Registers the kvblocks channel in LMCache's transfer-channel registry under ``name``.

    ``options`` are the defaults of :class:`kvblocks.lmcache.channel.KvblocksChannelContext`'s keyword
    arguments (``auth_token``, ``transport``, ``timeout_ms``, ``link_timeout_ms``, ``options``); keyword
    arguments LMCache passes when it creates the context win. Registering the same name again only
    updates the options.

    Raises ImportError without LMCache; TypeError for an unknown option.
    """
    from lmcache.v1.distributed.transfer_channel import factory

    unknown = set(options) - {"auth_token", "transport", "timeout_ms", "link_timeout_ms", "options"}
    if unknown:
        raise TypeError(f"unknown kvblocks channel option(s): {sorted(unknown)}")
    _options.clear()
    _options.update(options)
    if factory._TRANSFER_CHANNEL_FACTORY_REGISTRY.get(name) is not _create:
        factory.register_transfer_channel_factory(name, _create)


def registered_options() -> Dict[str, Any]:
    """The options :func:`register` was last called with."""
    return dict(_options)


def _create(l1_memory_desc: Any, listen_url: str, advertise_url: str, **kwargs: Any) -> Any:
    from kvblocks.lmcache.channel import create_context

    merged: Dict[str, Optional[Any]] = {**_options, **kwargs}
    return create_context(l1_memory_desc=l1_memory_desc, listen_url=listen_url, advertise_url=advertise_url,
                          **merged)
