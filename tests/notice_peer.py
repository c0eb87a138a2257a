# SPDX-License-Identifier: Apache-2.0
"""A kvblocks engine in its own process that links to a holder and sends notices as told (JSON lines):
``{"op": "send", "kind", "rid", "ticket", "seconds"}`` (a well-formed notice), ``{"op": "raw", "name",
"message"}`` (any notification) and ``{"op": "flood", "n"}`` (up to n notices with random request ids
and tickets; stops at the holder's queue cap and says how many were queued). Prints ``{"ready": true}``
once linked. Run as ``python tests/notice_peer.py --cluster C --holder H --port P [--auth TOKEN]``."""
import argparse
import json
import secrets
import sys

import kvblocks as kb
from kvblocks.integrations import notices


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", type=int, required=True)
    ap.add_argument("--holder", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--auth", default=None)
    args = ap.parse_args()
    dd = kb.LlmDataDist(args.cluster, kb.LlmRole.DECODER)
    opts = {kb.OPTION_DEVICE_ID: "0"}
    if args.auth:
        opts[kb.OPTION_AUTH_TOKEN] = args.auth
    dd.initialize(opts)
    info = kb.ClusterInfo(args.holder, 0, [kb.IpInfo("127.0.0.1", 0)], [kb.IpInfo("127.0.0.1", args.port)])
    rets = dd.link_llm_clusters([info], 5000)

    def reply(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    reply({"ready": rets == [kb.Status.LLM_SUCCESS], "rets": [int(r) for r in rets]})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "exit":
                break
            if cmd["op"] == "send":
                notices.send(dd, args.holder, cmd["kind"], cmd["rid"], cmd["ticket"], cmd.get("seconds", 0.0),
                             pullers=cmd.get("pullers", 1))
                reply({"ok": True})
            elif cmd["op"] == "raw":
                dd.send_notify(args.holder, cmd["name"], cmd["message"])
                reply({"ok": True})
            elif cmd["op"] == "flood":
                sent = 0
                try:
                    for _ in range(cmd["n"]):
                        notices.send(dd, args.holder, "done", secrets.token_hex(8), notices.new_ticket())
                        sent += 1
                except kb.LinkError as e:
                    reply({"sent": sent, "stopped": e.status_code == 0x5010B01B})
                    continue
                reply({"sent": sent, "stopped": False})
        except kb.LLMException as e:
            reply({"error": str(e), "status": int(e.status_code)})
    dd.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
