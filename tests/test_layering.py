# SPDX-License-Identifier: Apache-2.0
"""The runtime's folders depend one way (README "Architecture"):

    api, hixl -> engine -> {link, cache, plan} -> transport -> net -> {wire, metrics} -> {common, security}

net sits above wire: wire is the codec (bytes <-> message structs, no I/O) and net the I/O that sends
and receives wire's frames with deadlines (net/socket.h), so net uses wire and never the reverse.

This test reads every `#include "folder/..."` under kvblocks/runtime/ and fails on an include that goes
up or sideways, unless it is one of the KNOWN edges below: debt, listed so that it can only shrink (an
edge that no longer exists must be removed from the list too). Issue 26 paid the last one off (transport
-> link: backends now see a link only through transport/peer.h's PeerLink), so the list is empty."""
import collections
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNTIME = os.path.join(ROOT, "kvblocks", "runtime")
LAYERS = [{"api", "hixl"}, {"engine"}, {"link", "cache", "plan"}, {"transport"}, {"net"}, {"wire", "metrics"},
          {"common", "security"}]
PUBLIC_INCLUDE = os.path.join(ROOT, "include")  # the public headers: usable anywhere
INCLUDE = re.compile(r'^\s*#\s*include\s+"(([a-z_]+)/[^"]+)"', re.M)

# (from, to): edges that break the order today. Each names what it is for; none may be added.
KNOWN = {}


def _level(folder):
    for i, layer in enumerate(LAYERS):
        if folder in layer:
            return i
    return None


def _edges():
    """{(from folder, to folder): [files]} for every include between two runtime folders."""
    edges = collections.defaultdict(list)
    for dirpath, _, files in os.walk(RUNTIME):
        rel = os.path.relpath(dirpath, RUNTIME)
        src = "api" if rel == "." else rel.split(os.sep)[0]
        for name in files:
            if not name.endswith((".h", ".cc")):
                continue
            with open(os.path.join(dirpath, name)) as f:
                for path, dst in INCLUDE.findall(f.read()):
                    public = os.path.isfile(os.path.join(PUBLIC_INCLUDE, path))
                    if dst != src and not public:
                        edges[(src, dst)].append(os.path.join(rel, name))
    return edges


def test_every_runtime_folder_has_a_layer():
    folders = {d for d in os.listdir(RUNTIME) if os.path.isdir(os.path.join(RUNTIME, d))}
    assert not {f for f in folders if _level(f) is None}, "add the new folder to LAYERS (and README)"


def test_includes_go_down_only():
    bad = {}
    for (src, dst), files in _edges().items():
        if (src, dst) in KNOWN:
            continue
        ls, ld = _level(src), _level(dst)
        if ls is None or ld is None or ld <= ls:
            bad[(src, dst)] = sorted(files)
    assert not bad, f"includes that go up or sideways: {bad}"


def test_known_debt_only_shrinks():
    gone = set(KNOWN) - set(_edges())
    assert not gone, f"these edges are gone: remove them from KNOWN: {sorted(gone)}"


def test_no_cycle_outside_the_known_edges():
    graph = collections.defaultdict(set)
    for (src, dst) in _edges():
        if (src, dst) not in KNOWN:
            graph[src].add(dst)
    seen, stack = set(), []

    def visit(node):
        if node in stack:
            pytest.fail(f"include cycle: {' -> '.join(stack[stack.index(node):] + [node])}")
        if node in seen:
            return
        stack.append(node)
        for nxt in sorted(graph[node]):
            visit(nxt)
        stack.pop()
        seen.add(node)

    for node in sorted(graph):
        visit(node)
