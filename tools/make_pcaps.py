#!/usr/bin/env python3
"""Generate the T.140/RTP replay captures in pcaps/ (real loopback traffic).

Every capture is made by really sending UDP datagrams over the loopback
interface while tcpdump records them; nothing is synthesised into the capture
file.  For each scenario the script

  1. starts ``tcpdump -i lo --immediate-mode -U -w pcaps/NAME.pcap 'udp port 5004'``
     (``-i any -y LINUX_SLL2`` for the SLL2 variant, converted to pcapng with
     ``editcap -F pcapng`` afterwards) and waits for its "listening on" line,
  2. sends hand-built RTP packets (RFC 3550 / RFC 4103 / RFC 2198) from a UDP
     socket bound to a fixed source port, pausing for real between packets,
  3. stops tcpdump with SIGINT,
  4. reads the capture back (its own small pcap/pcapng reader), checks that it
     holds exactly the datagrams that were sent, in order, from the right ports,
  5. runs a reference model of the gateway's chunking rules over the capture
     (using the capture's own timestamps) and checks the result against the
     expectation written out by hand below, then writes
     ``pcaps/NAME.expected.jsonl``.

Only the Python standard library is used.  Needs root (or capture
capabilities), tcpdump, and editcap (Debian package wireshark-common / tshark)
for the pcapng variant.

Usage:  python3 tools/make_pcaps.py            # all scenarios
        python3 tools/make_pcaps.py red wrap   # just these
        python3 tools/make_pcaps.py --check    # only re-verify existing files
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PCAPS = ROOT / "pcaps"
PORT = 5004
V4 = "127.0.0.1"
V6 = "::1"

PT_T140 = 98
PT_RED = 100
BOM = "\ufeff"

IDLE_S = 2.0  # gateway idle-flush threshold
PACE = 0.3  # RFC 4103 recommends 300 ms buffering
SILENCE = 2.5  # > IDLE_S, so an idle flush happens on the wire


# --------------------------------------------------------------------------
# RTP packet building
# --------------------------------------------------------------------------

def rtp_packet(pt, seq, ts, ssrc, payload, marker=False, version=2,
               padding=None, ext=None, csrcs=(), cc_override=None):
    """Build an RTP datagram.

    padding: bytes appended after the payload; the P bit is set and the last
    byte of `padding` must be its count (not checked, so junk can be made).
    ext: (profile, data) -> X bit set, header extension with len(data)/4 words.
    """
    cc = len(csrcs) if cc_override is None else cc_override
    b0 = (version << 6) | ((1 if padding is not None else 0) << 5) \
        | ((1 if ext is not None else 0) << 4) | (cc & 0x0F)
    b1 = ((1 if marker else 0) << 7) | (pt & 0x7F)
    out = struct.pack("!BBHII", b0, b1, seq & 0xFFFF, ts & 0xFFFFFFFF, ssrc)
    for c in csrcs:
        out += struct.pack("!I", c)
    if ext is not None:
        profile, data = ext
        assert len(data) % 4 == 0
        out += struct.pack("!HH", profile, len(data) // 4) + data
    out += payload
    if padding is not None:
        out += padding
    return out


def red_payload(primary, gens, block_pt=PT_T140):
    """RFC 2198 payload.  gens = [(ts_offset, data), ...] oldest first."""
    hdr = b""
    for off, data in gens:
        assert 0 <= off < (1 << 14) and len(data) < (1 << 10)
        hdr += struct.pack("!I", (1 << 31) | (block_pt << 24) | (off << 10) | len(data))
    hdr += bytes([block_pt & 0x7F])  # F=0, primary block
    return hdr + b"".join(d for _, d in gens) + primary


def udp_socket(family, port):
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.bind((V6 if family == socket.AF_INET6 else V4, port))
    return s


def send(sock, data, dst):
    try:
        sock.sendto(data, dst)
    except ConnectionRefusedError:  # ICMP port unreachable from an earlier send
        sock.sendto(data, dst)


class Stream:
    """One RTP sender (one SSRC) with a 1000 Hz clock taken from real time."""

    def __init__(self, sock, ssrc, seq=1000, ts=100000, red=False, dst=None, log=None):
        self.sock = sock
        self.ssrc = ssrc
        self.seq = seq
        self.ts0 = ts
        self.t0 = None
        self.red = red
        self.history = []  # [(ts, data)] of previous packets (RED)
        self.last_send = None
        fam = sock.family
        self.dst = dst or ((V6, PORT) if fam == socket.AF_INET6 else (V4, PORT))
        self.sent = [] if log is None else log  # (source port, datagram) as sent

    def now_ts(self):
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        return (self.ts0 + round((now - self.t0) * 1000)) & 0xFFFFFFFF

    def send_text(self, data, **kw):
        """data: str or bytes of T.140 for this packet (primary)."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        ts = self.now_ts()
        now = time.monotonic()
        # marker: first packet, and first packet after an idle period (RFC 4103 5.2)
        marker = self.last_send is None or (now - self.last_send) > 1.0
        if self.red:
            gens = []
            for i in (2, 1):  # oldest first
                if len(self.history) >= i:
                    hts, hdata = self.history[-i]
                    gens.append(((ts - hts) & 0xFFFFFFFF, hdata))
                else:
                    gens.append((0, b""))
            payload = red_payload(data, gens)
            self.history.append((ts, data))
            self.history = self.history[-2:]
            pt = PT_RED
        else:
            payload = data
            pt = PT_T140
        pkt = rtp_packet(pt, self.seq, ts, self.ssrc, payload, marker=marker, **kw)
        self.seq = (self.seq + 1) & 0xFFFF
        self.last_send = now
        self.raw(pkt)

    def raw(self, pkt):
        send(self.sock, pkt, self.dst)
        self.sent.append((self.sock.getsockname()[1], pkt))


# --------------------------------------------------------------------------
# Capture control
# --------------------------------------------------------------------------

class Capture:
    def __init__(self, name, any_iface=False, pcapng=False):
        self.name = name
        self.any_iface = any_iface
        self.pcapng = pcapng
        self.out = PCAPS / name
        self.raw_out = self.out.with_suffix(".tmp.pcap") if pcapng else self.out
        self.sent = []

    def __enter__(self):
        for p in (self.out, self.raw_out):
            if p.exists():
                p.unlink()
        cmd = ["tcpdump", "-i", "any" if self.any_iface else "lo", "-Z", "root",
               "--immediate-mode", "-U", "-w", str(self.raw_out)]
        if self.any_iface:
            cmd += ["-y", "LINUX_SLL2"]
        cmd.append(f"udp port {PORT}")
        print("  $", " ".join(cmd[:-1]), repr(cmd[-1]))
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        buf = b""
        while b"listening on" not in buf:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.proc.kill()
                raise RuntimeError(f"tcpdump did not start: {buf.decode(errors='replace')}")
            r, _, _ = select.select([self.proc.stderr], [], [], 0.2)
            if r:
                buf += os.read(self.proc.stderr.fileno(), 4096)
        self.banner = buf
        time.sleep(0.5)
        # Dummy receivers so no ICMP port-unreachable comes back.
        self.sinks = []
        for fam, addr in ((socket.AF_INET, V4), (socket.AF_INET6, V6)):
            try:
                self.sinks.append(udp_socket(fam, PORT))
            except OSError as e:
                print(f"  (could not bind sink {addr}:{PORT}: {e}; continuing)")
        return self

    def __exit__(self, *exc):
        time.sleep(0.5)
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        for s in self.sinks:
            s.close()
        for line in (self.banner + err).decode(errors="replace").splitlines():
            if "link-type" in line or "captured" in line:
                print("  " + line.strip())
        if exc[0] is not None:
            return False
        if not self.raw_out.exists() or self.raw_out.stat().st_size <= 24:
            raise RuntimeError(f"{self.raw_out} is empty")
        if self.pcapng:
            cmd = ["editcap", "-F", "pcapng", str(self.raw_out), str(self.out)]
            print("  $", " ".join(cmd))
            subprocess.run(cmd, check=True)
            self.raw_out.unlink()
        return False


# --------------------------------------------------------------------------
# Scenarios.  Each function sends its packets and returns the list of
# (source port, datagram) sent, in order; EXPECTED[name] is written by hand.
# --------------------------------------------------------------------------

def sc_single():
    s = Stream(udp_socket(socket.AF_INET, 40000), 0x11111111, seq=1000, ts=100000)
    parts = ["Hello w", "orld.", " This is", " a test ", "of real ", "time tex", "t."]
    for i, p in enumerate(parts):
        if i:
            time.sleep(PACE)
        s.send_text((BOM if i == 0 else "") + p)
    time.sleep(SILENCE)
    s.send_text("Tail wit")
    time.sleep(PACE)
    s.send_text("hout end")
    time.sleep(SILENCE)
    s.send_text("bye")
    s.sock.close()
    return s.sent


A1 = "t140:11111111@127.0.0.1:40000"
EXP_SINGLE = [
    ("join", A1),
    ("add", A1, "Hello world.", "sentence"),
    ("add", A1, "This is a test of real time text.", "idle"),
    ("add", A1, "Tail without end", "idle"),
    ("add", A1, "bye", "end"),
    ("leave", A1),
]


def sc_two_ssrc():
    log = []  # both streams, in global send order
    a = Stream(udp_socket(socket.AF_INET, 40000), 0x11111111, seq=5000, ts=200000, log=log)
    b = Stream(udp_socket(socket.AF_INET, 40002), 0x22222222, seq=9000, ts=700000, log=log)
    pa = [BOM + "Alpha ", "speaks ", "first. ", "Then ", "more. ", "ok"]
    pb = [BOM + "Bravo ", "answers! ", "Done? ", "ok"]
    order = []
    for i in range(max(len(pa), len(pb))):
        if i < len(pa):
            order.append((a, pa[i]))
        if i < len(pb):
            order.append((b, pb[i]))
    for i, (st, txt) in enumerate(order):
        if i:
            time.sleep(PACE / 2)  # each stream still sends every ~300 ms
        st.send_text(txt)
    a.sock.close()
    b.sock.close()
    return log


B1 = "t140:22222222@127.0.0.1:40002"
EXP_TWO_SSRC = [
    ("join", A1),
    ("join", B1),
    ("add", B1, "Bravo answers!", "sentence"),
    ("add", A1, "Alpha speaks first.", "sentence"),
    ("add", B1, "Done?", "sentence"),
    ("add", A1, "Then more.", "sentence"),
    ("add", A1, "ok", "end"),
    ("leave", A1),
    ("add", B1, "ok", "end"),
    ("leave", B1),
]


def sc_red():
    s = Stream(udp_socket(socket.AF_INET, 40000), 0xAABBCCDD, seq=300, ts=5000, red=True)
    parts = [BOM + "Redund", "ancy ke", "eps tex", "t safe.", " Really", ".",
             "", ""]  # two trailing packets carry only redundancy (RFC 4103 4)
    for i, p in enumerate(parts):
        if i:
            time.sleep(PACE)
        s.send_text(p)
    s.sock.close()
    return s.sent


R1 = "t140:aabbccdd@127.0.0.1:40000"
EXP_RED = [
    ("join", R1),
    ("add", R1, "Redundancy keeps text safe.", "sentence"),
    ("add", R1, "Really.", "end"),
    ("leave", R1),
]


def sc_unicode():
    s = Stream(udp_socket(socket.AF_INET, 40000), 0x55555555, seq=42, ts=0)
    nichi = "日".encode()  # e6 97 a5
    emoji = "😀".encode()  # f0 9f 98 80
    parts = [
        (BOM + "café — ").encode(),
        "naïve ".encode(),
        b"\xff",                                   # invalid byte, own packet
        b" " + nichi[:1],                          # 日 split 1 | 2
        nichi[1:] + "本語 ".encode() + emoji[:2],  # 😀 split 2 | 2
        emoji[2:] + b". ",
    ]
    for i, p in enumerate(parts):
        if i:
            time.sleep(PACE)
        s.send_text(p)
    s.sock.close()
    return s.sent


U1 = "t140:55555555@127.0.0.1:40000"
EXP_UNICODE = [
    ("join", U1),
    ("add", U1, "café — naïve \ufffd 日本語 😀.", "sentence"),
    ("leave", U1),
]


def sc_backspace():
    s = Stream(udp_socket(socket.AF_INET, 40000), 0x66666666, seq=7, ts=1234567)
    parts = [
        BOM + "Helo",
        "\b\b",                 # erases "lo" -> "He"
        "llo world",
        ".",
        " ",
        "Second lin",
        "\r\n",                 # CR LF -> one newline
        "e. ",
        "Third\x07 line",       # BEL dropped
        "\nfourth",             # bare LF
        "\u2028fifth\rsixth",   # LINE SEPARATOR, lone CR (mid-packet)
        " ends here!\r\n",
        "Line\n",
        "\b joined. ",          # backspace erases the newline
        "Cafè",
        "\bé ok",               # backspace erases a 2-byte character
    ]
    for i, p in enumerate(parts):
        if i:
            time.sleep(PACE)
        s.send_text(p)
    s.sock.close()
    return s.sent


K1 = "t140:66666666@127.0.0.1:40000"
EXP_BACKSPACE = [
    ("join", K1),
    ("add", K1, "Hello world.", "sentence"),
    ("add", K1, "Second lin\ne.", "sentence"),
    ("add", K1, "Third line\nfourth\nfifth\nsixth ends here!", "sentence"),
    ("add", K1, "Line joined.", "sentence"),
    ("add", K1, "Café ok", "end"),
    ("leave", K1),
]


def sc_ipv6():
    s = Stream(udp_socket(socket.AF_INET6, 40000), 0x77777777, seq=100, ts=900)
    for i, p in enumerate([BOM + "IPv6 w", "orks t", "oo. "]):
        if i:
            time.sleep(PACE)
        s.send_text(p)
    s.sock.close()
    return s.sent


I1 = "t140:77777777@[::1]:40000"
EXP_IPV6 = [
    ("join", I1),
    ("add", I1, "IPv6 works too.", "sentence"),
    ("leave", I1),
]


def sc_wrap():
    # sequence 65533, 65534, 65535, 0, 1, 2; the RTP timestamp wraps too.
    s = Stream(udp_socket(socket.AF_INET, 40000), 0x0000BEEF, seq=65533, ts=0xFFFFFF00)
    for i, p in enumerate([BOM + "Wrap", " aro", "und ", "work", "s.", " "]):
        if i:
            time.sleep(PACE)
        s.send_text(p)
    s.sock.close()
    return s.sent


W1 = "t140:0000beef@127.0.0.1:40000"
EXP_WRAP = [
    ("join", W1),
    ("add", W1, "Wrap around works.", "sentence"),
    ("leave", W1),
]


def sc_malformed():
    sock = udp_socket(socket.AF_INET, 40000)
    s = Stream(sock, 0x33333333, seq=20000, ts=3000)

    def junk(pkt):
        s.raw(pkt)

    steps = [
        lambda: s.send_text(BOM + "Valid"),
        # 3-byte datagram
        lambda: junk(b"\x80\x62\x00"),
        # VALID: padding (P=1, 4 padding bytes "ZZZ" + count 4)
        lambda: s.send_text(" text", padding=b"ZZZ\x04"),
        # RTP version 0
        lambda: junk(rtp_packet(PT_T140, 1, 1, 0xDEAD0002, b"JUNK", version=0)),
        # VALID: header extension (profile 0xBEDE, 1 word)
        lambda: s.send_text(" sur", ext=(0xBEDE, b"XTN!")),
        # X=1 but extension length (255 words) runs past the end
        lambda: junk(bytes([0x90]) + rtp_packet(PT_T140, 2, 2, 0xDEAD0003, b"")[1:]
                     + b"\xbe\xde\x00\xffJUNK"),
        # VALID: one CSRC
        lambda: s.send_text("vives", csrcs=(0x12345678,)),
        # P=1 with padding count 200 > payload
        lambda: junk(rtp_packet(PT_T140, 3, 3, 0xDEAD0004, b"JUNK", padding=b"\xc8")),
        # CC=15 but datagram only 20 bytes
        lambda: junk(rtp_packet(PT_T140, 4, 4, 0xDEAD0005, b"JUNKJUNK", cc_override=15)),
        lambda: s.send_text(". "),
        # RED with block length 200 past the end
        lambda: junk(rtp_packet(PT_RED, 5, 5, 0xDEAD0006,
                                struct.pack("!I", (1 << 31) | (PT_T140 << 24) | (0 << 10) | 200)
                                + bytes([PT_T140]) + b"JUNK")),
        lambda: s.send_text("end"),
    ]
    for i, f in enumerate(steps):
        if i:
            time.sleep(PACE / 2)
        f()
    sock.close()
    return s.sent


M1 = "t140:33333333@127.0.0.1:40000"
EXP_MALFORMED = [
    ("join", M1),
    ("add", M1, "Valid text survives.", "sentence"),
    ("add", M1, "end", "end"),
    ("leave", M1),
]


SCENARIOS = {
    # name: (file, sender, expected, any_iface, pcapng)
    "single": ("single.pcap", sc_single, EXP_SINGLE, False, False),
    "two_ssrc": ("two_ssrc.pcap", sc_two_ssrc, EXP_TWO_SSRC, False, False),
    "red": ("red.pcap", sc_red, EXP_RED, False, False),
    "unicode": ("unicode.pcap", sc_unicode, EXP_UNICODE, False, False),
    "backspace": ("backspace.pcap", sc_backspace, EXP_BACKSPACE, False, False),
    "single_any": ("single_any.pcapng", sc_single, EXP_SINGLE, True, True),
    "ipv6": ("ipv6.pcap", sc_ipv6, EXP_IPV6, False, False),
    "wrap": ("wrap.pcap", sc_wrap, EXP_WRAP, False, False),
    "malformed": ("malformed.pcap", sc_malformed, EXP_MALFORMED, False, False),
}


# --------------------------------------------------------------------------
# Reading captures back
# --------------------------------------------------------------------------

LINKTYPES = {1: "EN10MB", 113: "LINUX_SLL", 276: "LINUX_SLL2"}


def read_capture(path):
    """Return (format, [linktype names], [(time_s, linktype, frame_bytes)])."""
    data = Path(path).read_bytes()
    magic = data[:4]
    frames = []
    if magic in (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d"):
        e = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
        nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
        linktype = struct.unpack(e + "I", data[20:24])[0] & 0x0FFFFFFF
        off = 24
        while off + 16 <= len(data):
            sec, frac, incl, _orig = struct.unpack(e + "IIII", data[off:off + 16])
            off += 16
            frames.append((sec + frac / (1e9 if nano else 1e6), linktype, data[off:off + incl]))
            off += incl
        return "pcap", [LINKTYPES.get(linktype, str(linktype))], frames
    if magic == b"\x0a\x0d\x0d\x0a":
        e = "<" if data[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
        ifaces = []  # (linktype, ts units per second)
        off = 0
        while off + 12 <= len(data):
            btype, blen = struct.unpack(e + "II", data[off:off + 8])
            body = data[off + 8:off + blen - 4]
            if btype == 0x0A0D0D0A:
                ifaces = []
            elif btype == 1:
                lt = struct.unpack(e + "H", body[:2])[0]
                res = 10 ** 6
                o = 8
                while o + 4 <= len(body):
                    code, ln = struct.unpack(e + "HH", body[o:o + 4])
                    if code == 0:
                        break
                    if code == 9:
                        v = body[o + 4]
                        res = 2 ** (v & 0x7F) if v & 0x80 else 10 ** v
                    o += 4 + ((ln + 3) & ~3)
                ifaces.append((lt, res))
            elif btype == 6:
                iid, hi, lo, caplen, _orig = struct.unpack(e + "IIIII", body[:20])
                lt, res = ifaces[iid]
                frames.append((((hi << 32) | lo) / res, lt, body[20:20 + caplen]))
            off += blen
        return "pcapng", [LINKTYPES.get(lt, str(lt)) for lt, _ in ifaces], frames
    raise ValueError(f"{path}: unknown capture format")


def frame_to_udp(linktype, frame):
    """Return (src_host, src_port, dst_host, dst_port, payload)."""
    if linktype == 1:
        proto, l3 = struct.unpack("!H", frame[12:14])[0], frame[14:]
    elif linktype == 113:
        proto, l3 = struct.unpack("!H", frame[14:16])[0], frame[16:]
    elif linktype == 276:
        proto, l3 = struct.unpack("!H", frame[0:2])[0], frame[20:]
    else:
        raise ValueError(f"linktype {linktype}")
    if proto == 0x0800:
        ihl = (l3[0] & 0x0F) * 4
        assert l3[9] == 17
        src, dst = socket.inet_ntop(socket.AF_INET, l3[12:16]), socket.inet_ntop(socket.AF_INET, l3[16:20])
        udp = l3[ihl:]
    elif proto == 0x86DD:
        assert l3[6] == 17
        src, dst = socket.inet_ntop(socket.AF_INET6, l3[8:24]), socket.inet_ntop(socket.AF_INET6, l3[24:40])
        udp = l3[40:]
    else:
        raise ValueError(f"ethertype {proto:#x}")
    sport, dport, ulen = struct.unpack("!HHH", udp[:6])
    return src, sport, dst, dport, udp[8:ulen]


# --------------------------------------------------------------------------
# Reference model of the gateway (for checking the hand-written expectations)
# --------------------------------------------------------------------------

def parse_rtp(d):
    """Return (pt, seq, ssrc, payload) or None if the datagram is not valid RTP."""
    if len(d) < 12 or d[0] >> 6 != 2:
        return None
    p, x, cc = (d[0] >> 5) & 1, (d[0] >> 4) & 1, d[0] & 0x0F
    pt = d[1] & 0x7F
    seq, _ts, ssrc = struct.unpack("!HII", d[2:12])
    off = 12 + 4 * cc
    if off > len(d):
        return None
    if x:
        if off + 4 > len(d):
            return None
        off += 4 + 4 * struct.unpack("!H", d[off + 2:off + 4])[0]
        if off > len(d):
            return None
    end = len(d)
    if p:
        if end == off or d[-1] == 0 or d[-1] > end - off:
            return None
        end -= d[-1]
    payload = d[off:end]
    if pt == PT_RED:
        o, blocks = 0, []
        while True:
            if o >= len(payload):
                return None
            if payload[o] & 0x80:
                if o + 4 > len(payload):
                    return None
                blocks.append(struct.unpack("!I", payload[o:o + 4])[0] & 0x3FF)
                o += 4
            else:
                o += 1
                break
        if o + sum(blocks) > len(payload):
            return None
        payload = payload[o + sum(blocks):]  # primary only (no loss handled here)
    elif pt != PT_T140:
        return None
    return pt, seq, ssrc, payload


class Model:
    def __init__(self):
        self.out = []
        self.streams = {}  # key -> dict; insertion order = creation order

    def flush(self, st, cause):
        text = "".join(st["buf"]).strip()
        st["buf"] = []
        if text:
            self.out.append(("add", st["id"], text, cause))

    def packet(self, t, src_host, src_port, datagram):
        for st in self.streams.values():
            if t - st["last"] > IDLE_S and "".join(st["buf"]).strip():
                self.flush(st, "idle")
        r = parse_rtp(datagram)
        if r is None:
            return
        _pt, _seq, ssrc, payload = r
        key = (src_host, src_port, ssrc)
        if key not in self.streams:
            host = f"[{src_host}]" if ":" in src_host else src_host
            sid = f"t140:{ssrc:08x}@{host}:{src_port}"
            self.streams[key] = dict(id=sid, buf=[], last=t, cr=False,
                                     dec=codecs.getincrementaldecoder("utf-8")("replace"))
            self.out.append(("join", sid))
        st = self.streams[key]
        st["last"] = t
        for ch in st["dec"].decode(payload):
            after_cr, st["cr"] = st["cr"], False
            if ch == BOM:
                continue
            if ch == "\b":
                if st["buf"]:
                    st["buf"].pop()
                continue
            if ch == "\r":
                st["cr"] = True
                ch = "\n"
            elif ch == "\n":
                if after_cr:
                    continue
            elif ch == "\u2028":
                ch = "\n"
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                continue
            if ch.isspace() and st["buf"] and st["buf"][-1] in ".!?":
                self.flush(st, "sentence")
                continue
            st["buf"].append(ch)
            if len(st["buf"]) >= 500:
                self.flush(st, "size")

    def end(self):
        for st in self.streams.values():
            self.flush(st, "end")
            self.out.append(("leave", st["id"]))
        return self.out


def to_json(ev):
    if ev[0] == "join":
        obj = {"type": "session.join", "sender": ev[1]}
    elif ev[0] == "leave":
        obj = {"type": "session.leave", "sender": ev[1]}
    else:
        obj = {"type": "context.add", "sender": ev[1], "content": ev[2], "flush": ev[3]}
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def verify(name, sent=None):
    fname, _f, expected, any_iface, pcapng = SCENARIOS[name]
    path = PCAPS / fname
    fmt, links, frames = read_capture(path)
    udp = [(t, *frame_to_udp(lt, fr)) for t, lt, fr in frames]
    for t, sh, sp, dh, dp, _ in udp:
        assert dp == PORT and dh in (V4, V6) and sh == dh, (name, sh, sp, dh, dp)
        assert sp in (40000, 40002), (name, sp)
    if sent is not None:
        got = [(sp, pl) for _t, _sh, sp, _dh, _dp, pl in udp]
        if got != sent:
            raise RuntimeError(f"{name}: captured {len(got)} datagrams, sent {len(sent)}; "
                               "contents differ (other traffic on udp/5004?)")
    # Timing margins: every gap within a stream is clearly below or clearly
    # above the 2000 ms idle threshold, so '>' vs '>=' or jitter cannot matter.
    last = {}
    for t, sh, sp, _dh, _dp, pl in udp:
        r = parse_rtp(pl)
        if r is None:
            continue
        key = (sh, sp, r[2])
        if key in last and 1.0 <= t - last[key] <= 2.3:
            raise RuntimeError(f"{name}: borderline gap {t - last[key]:.3f} s in stream {key}")
        last[key] = t
    m = Model()
    for t, sh, sp, _dh, _dp, pl in udp:
        m.packet(t, sh, sp, pl)
    model = m.end()
    if model != expected:
        raise RuntimeError(f"{name}: model disagrees with the hand-written expectation:\n"
                           f"  model:    {model}\n  expected: {expected}")
    return fmt, links, len(frames), udp[-1][0] - udp[0][0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help=f"scenarios (default all): {', '.join(SCENARIOS)}")
    ap.add_argument("--check", action="store_true", help="only verify existing captures")
    args = ap.parse_args()
    names = args.names or list(SCENARIOS)
    for n in names:
        if n not in SCENARIOS:
            ap.error(f"unknown scenario {n}")
    PCAPS.mkdir(exist_ok=True)
    for n in names:
        fname, sender, expected, any_iface, pcapng = SCENARIOS[n]
        print(f"== {n} -> pcaps/{fname}")
        sent = None
        if not args.check:
            with Capture(fname, any_iface, pcapng):
                sent = sender()
        fmt, links, count, span = verify(n, sent)
        stem = fname.rsplit(".", 1)[0]
        exp = PCAPS / f"{stem}.expected.jsonl"
        text = "".join(to_json(ev) + "\n" for ev in expected)
        if args.check:
            if exp.read_text(encoding="utf-8") != text:
                raise RuntimeError(f"{exp} differs from the expectation in this script")
        else:
            exp.write_text(text, encoding="utf-8")
        print(f"  ok: {fmt} {'/'.join(links)}, {count} packets over {span:.2f} s, "
              f"{len(expected)} expected events -> pcaps/{exp.name}")


if __name__ == "__main__":
    main()
