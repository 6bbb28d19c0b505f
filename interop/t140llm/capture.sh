#!/usr/bin/env bash
# Re-record the loopback captures in captures/ from the real t140llm sender.
# Needs tcpdump (apt-get install -y tcpdump), root or CAP_NET_RAW, `npm ci` done,
# and nothing else sending to UDP 127.0.0.1:5004 meanwhile.  Timing (and so
# the pcap timestamps) differs per run; the packet bytes are deterministic
# except where noted in README.md.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p captures
PORT=${PORT:-5004}
SSRC=287454020 # 0x11223344, fixed so captures are comparable

cap() {
  local name=$1; shift
  tcpdump -i lo -U -w "captures/$name.pcap" "udp port $PORT" 2>/dev/null &
  local tp=$!
  sleep 1.5 # let tcpdump attach before the first packet
  node send.mjs --host 127.0.0.1 --port "$PORT" --ssrc "$SSRC" "$@"
  sleep 1
  kill -INT "$tp"
  wait "$tp" 2>/dev/null || true
  echo "captures/$name.pcap: $(tcpdump -r "captures/$name.pcap" 2>/dev/null | wc -l) datagrams"
}

TEXT="Hello from t140llm. RED test, 3 gens."
cap plain            --mode plain --text "$TEXT"
cap red              --mode red --text "$TEXT"
cap red3             --mode red --text "$TEXT" --red-generations 3
cap multiplex-prefix --mode multiplex --text "Hi A." --stream-id alpha,beta
cap multiplex-csrc   --mode multiplex --text "Hi A." --stream-id alpha,beta --csrc
cap multiplex-red    --mode multiplex --text "Hi A." --stream-id alpha,beta --with-red
cap fec              --mode plain --text "abcdefghijklmnopqrstu" --fec --fec-group 3 --custom-transport
cap direct-metadata  --mode direct --text "Hello" --metadata '{"k":"v"}'
# Tail loss: an LLM-like feed that outruns 30 cps and ends; t140llm 0.0.19 on
# Node >= 20 drops its end-of-stream flush packet (compare with the
# --custom-transport runs, where the same flush packet does go out).
LONG="The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump!"
cap tail-drop        --mode plain --text "$LONG" --chunk 10 --chunk-interval-ms 30 --end-immediately
cap tail-flush       --mode plain --text "$LONG" --chunk 10 --chunk-interval-ms 30 --end-immediately --custom-transport
# A reply streamed in under one pacer tick (100 ms) is lost entirely.
cap short-lost       --mode plain --text "$TEXT" --chunk 10 --chunk-interval-ms 20 --end-immediately
