# SPDX-License-Identifier: Apache-2.0
"""kvblocks demo: a Prompt and a Decoder process move real KV blocks.

The Prompt (a second process) fills its cache with a known pattern and listens; the Decoder (this
process) links over TCP, pulls blocks {1,3,5,7} into {0,2,4,6}, then the Prompt pushes layer 3 with
reversed blocks. Every byte is checked; bytes, time and the chosen data path are printed.

Across two hosts: 'kvblocks demo --listen IP:PORT' on one (the Prompt; it serves until Ctrl-C, or
--count peers), 'kvblocks demo --connect IP:PORT' on the other (the Decoder). Both need the same
KVBLOCKS_AUTH_TOKEN when the listener has one. 'kvblocks ping IP:PORT' measures a link to a listener.
"""
import argparse
import multiprocessing as mp
import socket
import sys
import time

import kvblocks as kb

TENSORS, BLOCKS, BLOCK_BYTES = 8, 64, 64 * 1024  # 4 layers x (K, V), 64 blocks of 64 KiB


def _fill(cache, cluster):
    for t in range(TENSORS):
        view = cache.tensor(t)
        for b in range(BLOCKS):
            view[b * BLOCK_BYTES:(b + 1) * BLOCK_BYTES] = bytes([(cluster * 31 + t * 7 + b) % 251]) * BLOCK_BYTES


def _block_ok(cache, t, b, cluster, src_block):
    want = (cluster * 31 + t * 7 + src_block) % 251
    return bytes(cache.tensor(t)[b * BLOCK_BYTES:(b + 1) * BLOCK_BYTES]) == bytes([want]) * BLOCK_BYTES


def _prompt(port, transport, ready, go, done):
    dd = kb.LlmDataDist(1, kb.LlmRole.PROMPT)
    dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}",
                   kb.OPTION_TRANSPORT: transport})
    cache = dd.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BLOCK_BYTES]))
    _fill(cache, 1)
    ready.put(cache.cache_id)
    remote_cache = go.get(timeout=60)  # the decoder's cache id, once it has linked
    ext = kb.KvCacheExtParam(src_layer_range=(3, 3), dst_layer_range=(3, 3), tensor_num_per_layer=2)
    t0 = time.perf_counter()
    dd.push_kv_blocks(cache, kb.CacheIndex(2, remote_cache), [0, 1, 2, 3], [3, 2, 1, 0], ext)
    done.put(time.perf_counter() - t0)
    go.get(timeout=60)
    dd.finalize()


def _two_hosts(ap: argparse.ArgumentParser, args) -> int:
    from kvblocks import remote

    try:
        if args.connect:
            return remote.run_connect(args.connect, transport=args.transport)
        listener = remote.Listener(args.listen, transport=args.transport)
    except ValueError as e:
        ap.error(str(e))
    except (kb.LLMException, TimeoutError) as e:
        print(f"{ap.prog}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    bound = listener.dd.listen_address  # the port the kernel gave when asked for port 0
    dial = bound.replace("0.0.0.0:", "<this host's IP>:")
    try:
        print(f"listening on {bound} as cluster {listener.cluster_id}; on another host run:\n"
              f"  kvblocks demo --connect {dial}    (or: kvblocks ping {dial})", flush=True)
        return listener.serve(count=args.count)
    finally:
        listener.close()


def main(argv=None, prog: str = "kvblocks demo") -> int:
    """Run the demo (``kvblocks demo``); returns 0 when every byte checked out, 1 otherwise.

    Raises:
        SystemExit: status 0 after ``--help``, 2 with a usage message for a bad argument (argparse),
            including an address that is not ``IPV4:PORT``.
        kvblocks.LLMException: a kvblocks call of the one-host demo failed (subclasses such as ``LinkError``
            name the cause). With ``--listen``/``--connect`` such failures, and a listener that does not
            answer, are printed on one line and the status is 1.
        queue.Empty: the Prompt process did not answer within 60 s (it failed to start or crashed).
    """
    summary, details = __doc__.split("\n\n", 1)
    ap = argparse.ArgumentParser(prog=prog, description=summary, epilog=details)
    ap.add_argument("--transport", choices=["auto", "shm", "tcp"], default="auto",
                    help="data path: auto picks shared memory on one host, TCP otherwise")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--listen", metavar="IP:PORT", help="be the Prompt side for peers on other hosts")
    where.add_argument("--connect", metavar="IP:PORT", help="be the Decoder side of a --listen demo")
    ap.add_argument("--count", type=int, default=0, metavar="N",
                    help="with --listen: exit after N peers finished (default: serve until Ctrl-C)")
    args = ap.parse_args(argv)
    if args.count and not args.listen:
        ap.error("--count goes with --listen")
    if args.listen or args.connect:
        return _two_hosts(ap, args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    ready, go, done = ctx.Queue(), ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_prompt, args=(port, args.transport, ready, go, done), daemon=True)
    proc.start()
    prompt_cache = ready.get(timeout=60)

    dd = kb.LlmDataDist(2, kb.LlmRole.DECODER)
    dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: args.transport})
    cache = dd.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BLOCK_BYTES]))
    _fill(cache, 2)
    t0 = time.perf_counter()
    rets = dd.link_llm_clusters([kb.ClusterInfo(1, 0, [kb.IpInfo("127.0.0.1", 0)], [kb.IpInfo("127.0.0.1", port)])])
    link_s = time.perf_counter() - t0
    if rets != [kb.Status.LLM_SUCCESS]:
        print(f"link failed: {rets}", file=sys.stderr)
        return 1
    print(f"linked Decoder(2) -> Prompt(1) at 127.0.0.1:{port} in {link_s * 1e3:.2f} ms, "
          f"data path: {dd.link_path(1)}")

    src, dst = [1, 3, 5, 7], [0, 2, 4, 6]
    t0 = time.perf_counter()
    dd.pull_kv_blocks(kb.CacheIndex(1, prompt_cache), cache, src, dst)
    pull_s = time.perf_counter() - t0
    nbytes = TENSORS * len(src) * BLOCK_BYTES
    ok = all(_block_ok(cache, t, d, 1, s) for t in range(TENSORS) for s, d in zip(src, dst))
    ok &= all(_block_ok(cache, t, b, 2, b) for t in range(TENSORS) for b in (1, 3, 5, 7, 8))
    print(f"pull  {src} -> {dst} x {TENSORS} tensors: {nbytes} bytes in {pull_s * 1e6:.1f} us "
          f"({nbytes / pull_s / 1e9:.2f} GB/s)  verified: {'OK' if ok else 'MISMATCH'}")

    go.put(cache.cache_id)
    push_s = done.get(timeout=60)
    nbytes = 2 * 4 * BLOCK_BYTES
    ok2 = all(_block_ok(cache, t, d, 1, s) for t in (6, 7) for s, d in zip([0, 1, 2, 3], [3, 2, 1, 0]))
    ok2 &= all(_block_ok(cache, t, b, 2, b) for t in (4, 5) for b in (1, 3))
    print(f"push  layer 3 (tensors 6,7) blocks [0,1,2,3] -> [3,2,1,0]: {nbytes} bytes in {push_s * 1e6:.1f} us  "
          f"verified: {'OK' if ok2 else 'MISMATCH'}")
    go.put(None)
    proc.join(30)
    dd.finalize()
    return 0 if ok and ok2 else 1


if __name__ == "__main__":
    sys.exit(main())
