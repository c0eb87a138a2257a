# SPDX-License-Identifier: Apache-2.0
"""The integration layer every serving engine's glue builds on (no engine imports here):

* :mod:`kvblocks.integrations.peers`: one link per remote engine, relinked when it broke; cluster ids
  derived from engine ids; a remote cache found by key in the link-time table.
* :mod:`kvblocks.integrations.layouts`: an engine's per-layer KV tensors described, registered once,
  compared field by field.
* :mod:`kvblocks.integrations.notices`: request done / abort / lease messages over the runtime's own
  notifications, accepted only from the peer a request was handed to, bounded in size and count.
* :mod:`kvblocks.integrations.completion`: transfers finished through the runtime's async handles.
"""
