#!/usr/bin/env python3
"""Writes pcaps/NAME.expected.jsonl from what `pvp-t140 replay` emits for a capture.

    python3 tools/expected_from_replay.py NAME [replay flags...]

Only for captures whose correct transcript was checked by hand (the file is the test's
oracle, so read it before committing it). The projection matches tests/replay_pcaps.rs.
"""
import json
import subprocess
import sys

name, flags = sys.argv[1], sys.argv[2:]
capture = next(f"pcaps/{name}{ext}" for ext in (".pcap", ".pcapng")
               if __import__("os").path.exists(f"pcaps/{name}{ext}"))
out = subprocess.run(["cargo", "run", "-q", "--", "replay", capture, *flags],
                     check=True, capture_output=True, text=True).stdout
with open(f"pcaps/{name}.expected.jsonl", "w", encoding="utf-8") as f:
    for line in out.splitlines():
        e = json.loads(line)
        o = {"type": e["type"], "sender": e["sender"]}
        if e["type"] == "context.add":
            o["content"] = e["payload"]["content"]
            o["flush"] = next(t[6:] for t in e["payload"]["tags"] if t.startswith("flush:"))
        f.write(json.dumps(o, ensure_ascii=False, separators=(",", ":")) + "\n")
print(open(f"pcaps/{name}.expected.jsonl", encoding="utf-8").read(), end="")
