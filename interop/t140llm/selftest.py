#!/usr/bin/env python3
"""Checks send.mjs end to end: each mode exits 0 and the text arrives.

    python3 selftest.py [--port 5004]

Receives on 127.0.0.1:PORT, decodes t140llm's formats (plain PT 96, RED PT 98
with t140llm's newest-first 8-bit-length blocks, multiplex prefix/CSRC) and
compares the reassembled text per stream with what was sent.  Needs node and
`npm install` done in this directory.  Prints 'N passed, N failed'.
"""
import argparse
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = "Grüße, 世界! Real-time text 👍🏽 over RTP."


def decode(datagrams):
    """stream id -> text, using primaries only (no loss expected on loopback)."""
    out = {}
    for d in datagrams:
        cc = d[0] & 0x0F
        pt = d[1] & 0x7F
        csrc = int.from_bytes(d[12:16], "big") if cc else None
        p = d[12 + 4 * cc:]
        if pt == 97:  # t140llm FEC
            continue
        if pt == 98:  # RED, t140llm layout: F|PT, 16-bit offset, 8-bit length
            pos, lens = 0, []
            while p[pos] & 0x80:
                lens.append(p[pos + 3])
                pos += 4
            p = p[pos + 1 + sum(lens):]
        if p.startswith(b"MD:"):
            continue
        sid = f"csrc:{csrc}" if csrc is not None else "default"
        if b"\x1e" in p:
            i = p.index(b"\x1e")
            sid, p = p[:i].decode(), p[i + 1:]
        out[sid] = out.get(sid, b"") + p
    return {k: v.decode("utf-8", "replace") for k, v in out.items()}


def run(port, args, expect):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", port))
    s.settimeout(0.05)
    proc = subprocess.Popen(["node", "send.mjs", "--port", str(port), *args], cwd=HERE)
    got = []
    while True:
        try:
            got.append(s.recvfrom(65535)[0])
        except socket.timeout:
            if proc.poll() is not None:
                break
    # drain anything still queued
    try:
        while True:
            got.append(s.recvfrom(65535)[0])
    except socket.timeout:
        pass
    s.close()
    text = decode(got)
    ok = proc.returncode == 0 and text == expect
    print(f"{'ok  ' if ok else 'FAIL'} {' '.join(args[:6])}...: rc={proc.returncode} "
          f"{len(got)} datagrams, text={text!r}")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=5004)
    port = ap.parse_args().port
    t = ["--text", TEXT, "--chunk", "5", "--chunk-interval-ms", "50"]
    cases = [
        (["--mode", "plain", *t], {"default": TEXT}),
        (["--mode", "red", *t], {"default": TEXT}),
        (["--mode", "red", "--red-generations", "3", "--fec", *t], {"default": TEXT}),
        (["--mode", "multiplex", "--stream-id", "a,b", *t], {"a": TEXT, "b": TEXT}),
        (["--mode", "multiplex", "--stream-id", "a,b", "--csrc", *t],
         {"csrc:1": TEXT, "csrc:2": TEXT}),
        (["--mode", "direct", "--metadata", '{"x":1}', *t], {"default": TEXT}),
        (["--mode", "plain", "--custom-transport", "--end-immediately", *t], {"default": TEXT}),
        (["--mode", "plain", "--text", "", "--chunk", "0"], {}),
    ]
    passed = failed = 0
    for args, expect in cases:
        if run(port, args, expect):
            passed += 1
        else:
            failed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
