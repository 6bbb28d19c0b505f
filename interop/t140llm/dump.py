#!/usr/bin/env python3
"""Tiny UDP receiver that hex-dumps every datagram and decodes the RTP header.

Used to verify what the t140llm sender (send.mjs) actually puts on the wire.
Standard library only.

    python3 dump.py [--host 127.0.0.1] [--port 5004] [--idle 3] [--max N]

Exits after --idle seconds without a datagram (once at least one arrived), or
after --max datagrams.  For payload types 98 (t140llm's default RED PT) it also
prints the RED block headers decoded both the t140llm way (8-bit PT byte,
16-bit offset, 8-bit length) and the RFC 2198 way (F|PT, 14-bit offset,
10-bit length), so the difference is visible.
"""
import argparse
import socket
import sys
import time


def decode_red(payload: bytes):
    out = []
    pos = 0
    blocks = []
    while pos < len(payload):
        b0 = payload[pos]
        if b0 & 0x80:
            if pos + 4 > len(payload):
                out.append("    RED: truncated block header")
                return out
            h = payload[pos:pos + 4]
            off16 = int.from_bytes(h[1:3], "big")
            len8 = h[3]
            rfc24 = int.from_bytes(h[1:4], "big")
            rfc_off, rfc_len = rfc24 >> 10, rfc24 & 0x3FF
            out.append(
                f"    RED hdr {h.hex()}: PT={b0 & 0x7F} | t140llm view: off={off16} len={len8}"
                f" | RFC2198 view: off={rfc_off} len={rfc_len}")
            blocks.append(len8)
            pos += 4
        else:
            out.append(f"    RED primary hdr {payload[pos:pos + 1].hex()}: PT={b0 & 0x7F}")
            pos += 1
            break
    for i, n in enumerate(blocks):
        out.append(f"    redundant[{i}] ({n} B): {payload[pos:pos + n]!r}")
        pos += n
    out.append(f"    primary ({len(payload) - pos} B): {payload[pos:]!r}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5004)
    ap.add_argument("--idle", type=float, default=3.0)
    ap.add_argument("--max", type=int, default=0)
    ap.add_argument("--red-pt", type=int, default=98)
    a = ap.parse_args()

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((a.host, a.port))
    s.settimeout(0.2)
    print(f"listening on {a.host}:{a.port}", flush=True)
    n = 0
    t0 = None
    last = time.monotonic()
    while True:
        try:
            data, peer = s.recvfrom(65535)
        except socket.timeout:
            if n and time.monotonic() - last > a.idle:
                break
            continue
        now = time.monotonic()
        if t0 is None:
            t0 = now
        last = now
        n += 1
        print(f"#{n} t=+{(now - t0) * 1000:.0f}ms from {peer[0]}:{peer[1]} len={len(data)}")
        print(f"  hex: {data.hex()}")
        if len(data) >= 12:
            v = data[0] >> 6
            p = (data[0] >> 5) & 1
            x = (data[0] >> 4) & 1
            cc = data[0] & 0x0F
            m = data[1] >> 7
            pt = data[1] & 0x7F
            seq = int.from_bytes(data[2:4], "big")
            ts = int.from_bytes(data[4:8], "big")
            ssrc = int.from_bytes(data[8:12], "big")
            csrc = [int.from_bytes(data[12 + 4 * i:16 + 4 * i], "big") for i in range(cc)]
            hl = 12 + 4 * cc
            print(f"  RTP V={v} P={p} X={x} CC={cc} M={m} PT={pt} seq={seq} ts={ts}"
                  f" ssrc=0x{ssrc:08x} csrc={csrc}")
            payload = data[hl:]
            print(f"  payload ({len(payload)} B): {payload!r}")
            if pt == a.red_pt:
                for line in decode_red(payload):
                    print(line)
        sys.stdout.flush()
        if a.max and n >= a.max:
            break
    print(f"done: {n} datagrams", flush=True)


if __name__ == "__main__":
    main()
