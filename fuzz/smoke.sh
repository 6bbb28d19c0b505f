#!/usr/bin/env bash
# Fuzz smoke test: runs every cargo-fuzz target for ${FUZZ_SECONDS:-30} s, on the stable
# toolchain (-s none: no sanitizer), starting from the committed seed corpus. Fails if any
# target crashes, panics (a broken invariant), hangs (> 10 s on one input) or runs out of memory.
#
#   fuzz/smoke.sh                                   # every target, 30 s each
#   FUZZ_SECONDS=300 fuzz/smoke.sh                  # longer
#   FUZZ_TARGETS="gateway rtp_parse" fuzz/smoke.sh  # a subset
#
# New inputs found go to a temporary directory, not into fuzz/corpus/, so the committed corpus
# stays small; crash inputs are written to fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TERM_COLOR=never

secs=${FUZZ_SECONDS:-30}
# With FUZZ_SEED set, each target runs a fixed number of inputs from a fixed seed: CI explores
# exactly the inputs that were explored when this was committed (or fewer, on a slower
# machine), so a pass here is a pass there; without it, exploration is fresh every run.
runs_for() {
    case $1 in
        rtp_parse) echo 3000000 ;; red_parse) echo 1500000 ;; t140_decode) echo 400000 ;;
        pcap_read) echo 2000000 ;; gateway) echo 25000 ;; batch) echo 1000 ;; ws_frames) echo 300000 ;;
        *) echo 100000 ;;
    esac
}
# `batch` reads the `gateway` target's input format, and starts from its seeds.
corpus_of() {
    case $1 in batch) echo corpus/gateway ;; *) echo "corpus/$1" ;; esac
}
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi
targets=${FUZZ_TARGETS:-$(cargo fuzz list)}

echo "== build"
cargo fuzz build -s none
echo "== oracle tests"
cargo test --lib --locked --quiet

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
for t in $targets; do
    echo "== $t (${secs}s)"
    mkdir -p "$work/$t"
    fixed=()
    if [ -n "${FUZZ_SEED:-}" ]; then fixed=(-seed="$FUZZ_SEED" -runs="$(runs_for "$t")"); fi
    # ${fixed[@]+...}: an empty array under `set -u` is an error before bash 4.4.
    if cargo fuzz run -s none "$t" "$work/$t" "$(corpus_of "$t")" -- ${fixed[@]+"${fixed[@]}"} \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$work/$t.log" 2>&1; then
        grep -E '^(Done|stat::number_of_executed_units)' "$work/$t.log" || true
    else
        failed+=("$t")
        echo "!! $t failed:"
        grep -E -A15 'panicked|ERROR: libFuzzer|SUMMARY' "$work/$t.log" | head -60 || tail -40 "$work/$t.log"
        grep -E 'Test unit written to' "$work/$t.log" || true
    fi
done

if ((${#failed[@]})); then
    echo "== FAILED: ${failed[*]} (reproduce: cargo fuzz run -s none TARGET fuzz/artifacts/TARGET/crash-...)"
    exit 1
fi
echo "== all targets ran ${secs}s without a crash"
