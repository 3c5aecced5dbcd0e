#!/usr/bin/env bash
# Counts what the one-way stream of Benchmarks/RoundTripInstructions costs per message: system
# calls (perf's raw_syscalls:sys_enter), context switches, and user and system CPU time (perf's
# user_time and system_time, from the kernel's accounting) of its client and its server, both
# pinned to CPU 0, 64-byte messages unless --bytes says. Each figure is the difference between a
# long and a short stream divided by the difference in messages, so start-up and the final
# request cancel out. The counts change little on a busy machine; the times do, so compare
# binaries in one run.
#   Scripts/stream-syscalls.sh BIN [BIN...] [--rounds N] [--messages LONG] [--short SHORT] [--bytes B]
#     BIN         a build of the binary: Benchmarks/.build/release/round-trip-instructions
#     --rounds    pairs of streams per binary (default 3); the table gives each pair and the median
#     --messages  the long stream (default 200000); --short the short one (default 20000);
#     --bytes     each message's payload (default 64)
# Needs perf (Debian: apt-get install linux-perf) and perf_event_paranoid <= 1 or root.
set -euo pipefail

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
binaries=()
rounds=3
long=200000
short=20000
bytes=64
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
        --messages) long=${2:?--messages needs a number}; shift 2 ;;
        --short) short=${2:?--short needs a number}; shift 2 ;;
        --bytes) bytes=${2:?--bytes needs a number}; shift 2 ;;
        -*) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
        *) binaries+=("$1"); shift ;;
    esac
done
[ ${#binaries[@]} -gt 0 ] || { usage >&2; exit 2; }
for number in "$rounds" "$long" "$short" "$bytes"; do
    [[ "$number" =~ ^[1-9][0-9]*$ ]] || { echo "not a positive number: $number" >&2; exit 2; }
done
[ "$long" -gt "$short" ] || { echo "--messages must be above --short" >&2; exit 2; }
command -v perf > /dev/null || { echo "perf is not installed (Debian: apt-get install linux-perf)" >&2; exit 1; }
for binary in "${binaries[@]}"; do
    [ -x "$binary" ] || { echo "not an executable: $binary" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

events=raw_syscalls:sys_enter,context-switches,user_time,system_time
# stream BIN MESSAGES: prints, for the client then the server, "syscalls switches user-ns system-ns".
stream() {
    local binary=$1 messages=$2 dir
    dir=$(mktemp -d "$work/stream-XXXXXX")
    taskset -c 0 perf stat -x, -e "$events" -o "$dir/server.perf" "$binary" serve "$dir" sink > "$dir/server.log" 2>&1 &
    local server=$!
    "$(dirname "$0")/wait-for-server.sh" "$dir" "$server" 30 || { kill "$server" 2>/dev/null; return 1; }
    if ! taskset -c 0 perf stat -x, -e "$events" -o "$dir/client.perf" "$binary" client "$dir" "$messages" "$bytes" stream > "$dir/client.log" 2>&1; then
        echo "the client failed:" >&2; cat "$dir/client.log" >&2; kill "$server" 2>/dev/null; return 1
    fi
    wait "$server" || { echo "the server failed:" >&2; cat "$dir/server.log" >&2; return 1; }
    local field
    for side in client server; do
        for event in raw_syscalls:sys_enter context-switches user_time system_time; do
            field=$(grep ",$event," "$dir/$side.perf" | cut -d, -f1)
            [[ "$field" =~ ^[0-9]+$ ]] || { echo "perf counted nothing for $event ($side): is perf allowed here?" >&2; cat "$dir/$side.perf" >&2; return 1; }
            printf '%s ' "$field"
        done
    done
    echo
}

echo "| binary | client system calls / message | client switches / message | client user µs / message | client system µs / message | server system calls / message | server switches / message | server user µs / message | server system µs / message | pairs (client calls, server calls) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
for binary in "${binaries[@]}"; do
    : > "$work/pairs"
    for _ in $(seq "$rounds"); do
        long_counts=$(stream "$binary" "$long")
        short_counts=$(stream "$binary" "$short")
        echo "$long_counts $short_counts" >> "$work/pairs"
    done
    python3 - "$binary" "$long" "$short" "$work/pairs" <<'PY'
import statistics, sys
binary, long, short, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rows = [list(map(int, line.split())) for line in open(path) if line.strip()]
# Per pair: the client's then the server's calls, switches, user and system time (ns -> µs).
scale = [1, 1, 1e-3, 1e-3] * 2
per = [[(r[i] - r[i + 8]) / (long - short) * scale[i] for i in range(8)] for r in rows]
median = [statistics.median(p[i] for p in per) for i in range(8)]
pairs = ", ".join(f"{p[0]:.3f}/{p[4]:.3f}" for p in per)
print("| " + binary + " | " + " | ".join(f"{m:.3f}" if i % 4 < 2 else f"{m:.2f}" for i, m in enumerate(median)) + f" | {pairs} |")
PY
done
