#!/usr/bin/env bash
# Instructions per round trip through the connection engine, both processes, counted by
# callgrind: unix-socket, binary framing, 64-byte requests from a task on the connection's
# executor to a server that echoes with the on-loop handler (the engine's own path) and with the
# default async handler (on the serving threads). Counts are of user-space instructions (the
# engine, the Swift runtime, libc), not the kernel's: what the engine's own code costs, and
# repeatable on a busy machine, where times are not.
#
# Two rows more are the same on-loop round trip over notify and message-port
# (`ROUND_TRIP_TRANSPORT`): the engine's path over shared-memory rings and eventfd doorbells, and
# over message queues. valgrind 3.19 does not know `pidfd_open`, so the engine watches the peer's
# process by polling /proc there (docs/DESIGN-NOTES.md, "Where there is no pidfd"). The polling
# thread runs by the clock, not by the round trip: at the default 10 ms it added 300-400
# instructions a round trip to each side under valgrind. Its interval is set to a second
# (`IPCBENCH_PROCESS_WATCH_INTERVAL_MS`), a few instructions a round trip; not longer, since a
# notify or message-port server learns that its client has gone this way.
#
# Three rows more are the Swift floor (Benchmarks/RoundTripInstructions/.../SwiftFloor.swift):
# the same round trip between a minimal async Swift client on a task executor of its own and a
# synchronous epoll echo server, without and with the cancellation handler a cancellable request
# awaits in, and with a server that hands each request to a kept task on a serving thread (the
# default async handler's work). They are what any async Swift program needs for that work, not
# the engine: they have no threshold, and Scripts/swift-floor.sh times them beside the engine
# and the C floors.
#
# Each process runs for 1,000 and for 5,000 round trips (Benchmarks/RoundTripInstructions, a
# release build stripped of its DWARF, which valgrind 3.19 cannot read); the difference over
# 4,000 is per round trip, so start-up and connection set-up cancel out. Three such pairs
# (--pairs), and the median of each side: how the two processes' threads interleave moves a
# count by a few per cent from one pair to the next (both sides together, each pair within 2 %
# of the medians in a fresh-clone CI run of d063b7a, against the thresholds' 10 %
# margin: one pair is enough for a check, which is what benchmarks.sh --quick runs).
#
# With --stream, one row more: the one-way stream (`client ... stream` against `serve ... sink`),
# per message: 64-byte messages sent one `send` each from a task on the connection's executor,
# taken in place by a borrowing handler on the server's loop. Its counts move more between pairs
# than the round trips' (how many messages one read takes, and how often a full socket suspends
# the sender, depend on how valgrind interleaves the two processes), so it has no threshold.
#
#   Scripts/instructions.sh [--output DIR] [--check FILE] [--update FILE] [--stream] [--pairs N]
#     --output  writes instructions.json and instructions.md there (default: a temporary folder)
#     --check   exits 1 if a count is above its threshold in FILE (JSON: name -> instructions), 3
#               if FILE does not exist; any other failure (build, valgrind) exits non-zero too
#     --update  writes FILE: each count plus 10 %, the margin for the client's spread (about 3 %)
#     --pairs   pairs of runs per row (default 3; the median is taken)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

output="" check="" update="" stream=0 pairs=3
usage="usage: $0 [--output DIR] [--check FILE] [--update FILE] [--stream] [--pairs N]"
while [ $# -gt 0 ]; do
    case "$1" in
        --output|--check|--update|--pairs)
            [ $# -ge 2 ] || { echo "instructions.sh: $1 needs a value" >&2; echo "$usage" >&2; exit 64; } ;;
    esac
    case "$1" in
        --output) output="$2"; shift ;;
        --check) check="$2"; shift ;;
        --update) update="$2"; shift ;;
        --stream) stream=1 ;;
        --pairs) pairs="$2"; shift ;;
        *) echo "$usage" >&2; exit 64 ;;
    esac
    shift
done
[[ "$pairs" =~ ^[1-9][0-9]*$ ]] || { echo "instructions.sh: --pairs needs a positive whole number" >&2; exit 64; }

Scripts/install-system-packages.sh
output=${output:-$(mktemp -d "${TMPDIR:-/tmp}/ipcbench-instructions-XXXXXX")}
mkdir -p "$output"
output=$(cd "$output" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ipcbench-instructions-work-XXXXXX")
# (Scripts/callgrind-pair.sh stops a server still running when it is interrupted or fails.)
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

swift build -c release --package-path Benchmarks --product round-trip-instructions >&2
binary="$work/round-trip-instructions"
strip --strip-debug -o "$binary" "Benchmarks/.build/release/round-trip-instructions"

# count SERVER CLIENT ROUND_TRIPS TRANSPORT: a server (on-loop, task, sink, floor or floor-task)
# and a client (engine, stream, floor or floor-cancellable) under callgrind
# (Scripts/callgrind-pair.sh); prints "server client". For the stream, ROUND_TRIPS is its number
# of messages.
count() {
    ROUND_TRIP_TRANSPORT=$4 IPCBENCH_PROCESS_WATCH_INTERVAL_MS=1000 \
        "$(dirname "$0")/callgrind-pair.sh" "$binary" "$1" "$2" "$3" "$(mktemp -d "$work/group-XXXXXX")"
}

results="$work/results.txt"
: > "$results"
# Each row: its name's key, the server, the client, the transport.
rows=("on-loop on-loop engine unix-socket" "task task engine unix-socket" "notify-on-loop on-loop engine notify"
    "message-port-on-loop on-loop engine message-port" "floor floor floor unix-socket"
    "floor-cancellable floor floor-cancellable unix-socket" "floor-task floor-task floor-cancellable unix-socket")
[ "$stream" -eq 0 ] || rows+=("stream sink stream unix-socket")
for row in "${rows[@]}"; do
    read -r key server client transport <<< "$row"
    unit="round trip"
    [ "$key" != stream ] || unit=message
    echo "== instructions per $unit: $key (server $server, client $client, $transport; callgrind, $pairs pair(s))" >&2
    for pair in $(seq "$pairs"); do
        short=$(count "$server" "$client" 1000 "$transport")
        long=$(count "$server" "$client" 5000 "$transport")
        echo "$key $short $long" >> "$results"
    done
done

python3 - "$results" "$output" "$check" "$update" <<'PYTHON'
import json, statistics, sys
results, output, check, update = sys.argv[1:5]
# The engine's rows keep their names (the thresholds files use them); the floor's are "floor: …".
names = {
    "on-loop": "unix-socket binary 64 B, on-loop handler",
    "task": "unix-socket binary 64 B, task handler",
    "notify-on-loop": "notify 64 B, on-loop handler",
    "message-port-on-loop": "message-port 64 B, on-loop handler",
    "floor": "floor: Swift async client, epoll echo server, 64 B",
    "floor-cancellable": "floor: Swift async client with a cancellation handler, epoll echo server, 64 B",
    "floor-task": "floor: Swift async client with a cancellation handler, async handler on a serving thread, 64 B",
    "stream": "one-way: unix-socket binary 64 B, a send a message, per message",
}
# Rows with a threshold: the engine's round trips.
def checked(name):
    return not name.startswith(("floor:", "one-way:"))
pairs = {}
for line in open(results):
    key, server_a, client_a, server_b, client_b = line.split()
    pair = pairs.setdefault(names[key], {"client": [], "server": []})
    pair["server"].append((int(server_b) - int(server_a)) / 4000)
    pair["client"].append((int(client_b) - int(client_a)) / 4000)
rows = {}
for name, pair in pairs.items():
    client, server = statistics.median(pair["client"]), statistics.median(pair["server"])
    rows[name] = {"client": round(client), "server": round(server), "both": round(client + server),
                  "pairs": {side: [round(value) for value in values] for side, values in pair.items()}}
json.dump({"unit": "instructions per round trip, the one-way row per message (user space, callgrind)", "rows": rows}, open(f"{output}/instructions.json", "w"), indent=2)
with open(f"{output}/instructions.md", "w") as markdown:
    markdown.write("| round trip (one-way: a message) | client | server | both | client, server of each pair |\n|---|---:|---:|---:|---|\n")
    for name, row in rows.items():
        spread = ", ".join(f"{c:,}/{s:,}" for c, s in zip(row["pairs"]["client"], row["pairs"]["server"]))
        markdown.write(f"| {name} | {row['client']:,} | {row['server']:,} | {row['both']:,} | {spread} |\n")
print(open(f"{output}/instructions.md").read(), end="")
if update:
    json.dump({name: round(row["both"] * 1.1) for name, row in rows.items() if checked(name)}, open(update, "w"), indent=2)
    print(f"wrote {update}", file=sys.stderr)
status = 0
if check:
    try:
        thresholds = json.load(open(check))
    except FileNotFoundError:
        print(f"no thresholds file {check} (this Swift version has none yet): make it with --update {check}", file=sys.stderr)
        sys.exit(3)
    for name, row in rows.items():
        if not checked(name):
            continue
        limit = thresholds.get(name)
        if limit is None:
            print(f"no threshold for {name}: add it with --update", file=sys.stderr); status = 1
        elif row["both"] > limit:
            print(f"REGRESSED: {name}: {row['both']:,} instructions per round trip, threshold {limit:,}", file=sys.stderr); status = 1
        elif row["both"] < limit / 1.1 * 0.9:
            print(f"improved: {name}: {row['both']:,} against a threshold of {limit:,}; update it (--update)", file=sys.stderr)
sys.exit(status)
PYTHON
echo "wrote $output" >&2
