#!/usr/bin/env bash
# Round-trip time of the Swift floor beside the engine and the C floor, interleaved: how much of
# the engine's time over the C floor any async Swift client must spend, and how much is the
# engine's own (docs/ENGINE.md, "The Swift floor").
#
# unix-socket binary framing, 64-byte echo requests, one at a time, between two processes of
# Benchmarks/RoundTripInstructions (the binary Scripts/instructions.sh counts under callgrind).
# Each round runs these pairs, in this order, each for --round-trips round trips:
#
#   server   client              what it is
#   floor    floor               the Swift floor: a minimal async client on a task executor of
#                                its own (one thread, epoll), a synchronous epoll echo server
#   floor    floor-cancellable   the same, the request awaited inside a cancellation handler
#   on-loop  floor-cancellable   the engine's server with its on-loop handler
#   floor    engine              the engine's client (a task on the connection's executor)
#   on-loop  engine              both the engine's: the harness's on-loop-handler row
#   floor-task floor-cancellable the Swift floor of the default async handler: the server's
#                                loop hands each request to a kept task on a serving thread of
#                                its own, which calls an async handler closure and replies
#   task     engine              both the engine's, the default async handler: its main row
#
# then `ipcbench floor` for the C floors `unix-stream+epoll`, `unix-stream+epoll+handoff` and
# `unix-stream` at 64 B with the same placement. Each client reports its round trips' median and
# 99th percentile (the clock is read only in these timed runs); the table gives each pair's
# median over the rounds, the range of the rounds' medians, and the ratio to the median of the C
# floor that does the same work: `unix-stream+epoll+handoff` for the pairs whose server hands
# requests to a task, `unix-stream+epoll` for the others; then the median (and range) of each
# round's ratio to that floor in the same round, which the machine's drift between rounds does
# not move as it moves the ratio of medians.
#
# With --stream BYTES, the one-way stream instead (docs/ENGINE.md, "Where the large streams' time
# goes"): messages of BYTES sent one `send` each, then a request the server answers with the
# number it took. Each round runs these pairs, then the C epoll stream (Benchmarks/StreamCost
# with --frames, compiled here with $CC, cc or clang: its receiver puts each message whole in one
# place, as the harness's stream floors and the sinks below do), and the table gives messages a second, the median over
# the rounds of each round's ratio to the C stream, and the same ratio to the Swift floor's pair:
#
#   server      client         what it is
#   floor-sink  floor-stream   the Swift floor: a task on a task executor of its own (one
#                              thread, epoll) writes each message with one writev and waits for
#                              room on a continuation; a synchronous epoll loop counts the
#                              messages whole in its read buffer
#   floor-sink  stream         the engine's client (held writes), the Swift floor's sink
#   sink        floor-stream   the Swift floor's client, the engine's sink (a borrowing handler)
#   sink        stream         both the engine's: the harness's throughput row
#
# On split-cores the C stream's two processes share CPUs 0 and 1 unpinned (it forks its receiver).
#
# With --spin, the round trips spin instead of waiting (split cores only: spinning is never
# measured with both processes on one core): the engine's connections with the spin-then-block
# wait strategy (50 µs, the harness's), the Swift floor's sides with `recv` calls that do not
# wait (`ROUND_TRIP_SPIN`, round-trip-instructions' main.swift), and the C floors are
# `unix-stream+spin` and `unix-stream+spin+handoff`, which poll the same way.
#
#   Scripts/swift-floor.sh [--rounds N] [--round-trips N] [--stream BYTES [--messages N] | --spin]
#                          [--placement same-core|split-cores]... [--output DIR]
#     --rounds       rounds of every pair (default 5)
#     --round-trips  round trips a pair makes in a round (default 20000)
#     --stream       the one-way stream of BYTES-byte messages instead of round trips
#     --messages     messages a stream pair sends in a round (default: 2.5 GB worth, at most 200,000)
#     --spin         the round trips spinning (split-cores only, the default placement then)
#     --placement    same-core (both processes on CPU 0) or split-cores (client on CPU 0, server
#                    on CPU 1); repeat for both (the default)
#     --output       writes swift-floor.json and swift-floor.md there (default: a temporary folder)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

rounds=5 trips=20000 output="" placements=() stream="" messages="" spin=""
usage="usage: $0 [--rounds N] [--round-trips N] [--stream BYTES [--messages N] | --spin] [--placement same-core|split-cores]... [--output DIR]"
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds|--round-trips|--stream|--messages|--placement|--output)
            [ $# -ge 2 ] || { echo "$1 needs a value" >&2; echo "$usage" >&2; exit 64; } ;;
    esac
    case "$1" in
        --rounds) rounds="$2"; shift ;;
        --round-trips) trips="$2"; shift ;;
        --stream) stream="$2"; shift ;;
        --messages) messages="$2"; shift ;;
        --placement) placements+=("$2"); shift ;;
        --output) output="$2"; shift ;;
        --spin) spin=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "$usage" >&2; exit 64 ;;
    esac
    shift
done
if [ -n "$spin" ]; then
    [ -z "$stream" ] || { echo "--spin is for the round trips, not --stream" >&2; exit 64; }
    [ ${#placements[@]} -eq 0 ] && placements=(split-cores)
    [[ " ${placements[*]} " != *" same-core "* ]] || { echo "--spin measures split-cores only (spinning is never measured on one core)" >&2; exit 64; }
    export ROUND_TRIP_SPIN=1
fi
[ ${#placements[@]} -eq 0 ] && placements=(same-core split-cores)
# Each placement once, in the order given.
mapfile -t placements < <(printf '%s\n' "${placements[@]}" | awk '!seen[$0]++')
for placement in "${placements[@]}"; do
    case "$placement" in
        same-core|split-cores) ;;
        *) echo "unknown placement: $placement (same-core or split-cores)" >&2; exit 64 ;;
    esac
done
case "$rounds$trips" in *[!0-9]*) echo "--rounds and --round-trips take whole numbers" >&2; exit 64 ;; esac
[ "$rounds" -ge 1 ] && [ "$trips" -ge 100 ] || { echo "--rounds must be at least 1 and --round-trips at least 100" >&2; exit 64; }
if [ -n "$stream" ]; then
    case "$stream$messages" in *[!0-9]*) echo "--stream and --messages take whole numbers" >&2; exit 64 ;; esac
    [ "$stream" -ge 1 ] && [ "$stream" -le $((64 << 20)) ] || { echo "--stream takes 1 to 67108864 bytes" >&2; exit 64; }
    messages=${messages:-$(( 2500000000 / stream < 200000 ? 2500000000 / stream : 200000 ))}
    [ "$messages" -ge 100 ] || { echo "--messages must be at least 100" >&2; exit 64; }
elif [ -n "$messages" ]; then
    echo "--messages is for --stream" >&2; exit 64
fi
[ "$(nproc)" -ge 2 ] || [[ " ${placements[*]} " != *" split-cores "* ]] || { echo "split-cores needs two CPUs; this machine has $(nproc)" >&2; exit 64; }

Scripts/install-system-packages.sh
swift build -c release --product ipcbench >&2
swift build -c release --package-path Benchmarks --product round-trip-instructions >&2
binary=Benchmarks/.build/release/round-trip-instructions
output=${output:-$(mktemp -d "${TMPDIR:-/tmp}/ipcbench-swift-floor-XXXXXX")}
mkdir -p "$output"
output=$(cd "$output" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ipcbench-swift-floor-work-XXXXXX")
cleanup() {
    [ -f "$work/server" ] && kill "$(cat "$work/server")" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# One pair: starts SERVER_MODE, runs CLIENT_MODE against it with ARGUMENTS, prints the client's line.
run_pair() {
    local server=$1 client=$2 server_cpu=$3 group line
    shift 3
    group=$(mktemp -d "$work/group-XXXXXX")
    taskset -c "$server_cpu" "$binary" serve "$group" "$server" > "$group/server.log" 2>&1 &
    echo $! > "$work/server"
    Scripts/wait-for-server.sh "$group" "$(cat "$work/server")" || { echo "(the $server server)" >&2; exit 1; }
    if ! line=$(ROUND_TRIP_TIMES=1 taskset -c 0 "$binary" client "$group" "$@" "$client" 2> "$group/client.log"); then
        echo "the $client client failed against the $server server:" >&2; cat "$group/client.log" >&2; exit 1
    fi
    wait "$(cat "$work/server")" || { echo "the $server server failed:" >&2; cat "$group/server.log" >&2; exit 1; }
    rm -f "$work/server"
    echo "$line"
}

samples="$work/samples.txt"
: > "$samples"
if [ -n "$stream" ]; then
    compiler=${CC:-$(command -v cc || command -v clang || true)}
    [ -n "$compiler" ] || { echo "--stream needs a C compiler (cc or clang; Scripts/install-system-packages.sh installs one)" >&2; exit 1; }
    "$compiler" -O2 -o "$work/stream-cost" Benchmarks/StreamCost/stream-cost.c
    for placement in "${placements[@]}"; do
        if [ "$placement" = same-core ]; then server_cpu=0 c_cpus=0; else server_cpu=1 c_cpus=0,1; fi
        for round in $(seq 1 "$rounds"); do
            echo "== $placement, $stream-byte stream, round $round of $rounds" >&2
            for pair in "floor-sink floor-stream" "floor-sink stream" "sink floor-stream" "sink stream"; do
                read -r server client <<< "$pair"
                line=$(run_pair "$server" "$client" "$server_cpu" "$messages" "$stream")
                echo "$placement $server $client $line" >> "$samples"
            done
            line=$(taskset -c "$c_cpus" "$work/stream-cost" --frames "$stream" "$messages" | grep messages/s)
            echo "$placement C epoll $line" >> "$samples"
        done
    done
    python3 - "$samples" "$output" "$rounds" "$messages" "$stream" <<'PYTHON'
import json, re, statistics, sys
samples, output, rounds, messages, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
names = {
    ("floor-sink", "floor-stream"): "Swift floor",
    ("floor-sink", "stream"): "engine client, Swift floor sink",
    ("sink", "floor-stream"): "Swift floor client, engine sink",
    ("sink", "stream"): "engine (the harness's row)",
    ("C", "epoll"): "C epoll stream, messages whole (Benchmarks/StreamCost --frames)",
}
rates = {}
for line in open(samples):
    fields = line.split()
    timed = re.search(r"stream (\d+) messages (\d+) ns", line)
    counted = re.search(r"(\d+) messages/s", line)
    if timed:
        rate = int(timed[1]) / (int(timed[2]) / 1e9)
    elif counted:
        rate = float(counted[1])
    else:
        sys.exit(f"unreadable sample: {line!r}")
    rates.setdefault(fields[0], {}).setdefault(names[(fields[1], fields[2])], []).append(rate)
result = {"unit": f"messages a second, unix-socket binary, {size}-byte payloads", "rounds": rounds, "messagesPerRound": messages, "placements": {}}
lines = []
for placement, table in rates.items():
    c, floor = table[names[("C", "epoll")]], table[names[("floor-sink", "floor-stream")]]
    lines += [f"### {placement}, {size}-byte messages", "", "| pair | messages/s (median of rounds) | rounds | ÷ C epoll stream (median of rounds' ratios) | ÷ Swift floor |", "|---|---:|---|---:|---:|"]
    entries = {}
    for name, values in table.items():
        to_c = statistics.median(a / b for a, b in zip(values, c))
        to_floor = statistics.median(a / b for a, b in zip(values, floor))
        entries[name] = {"median": round(statistics.median(values)), "rounds": [round(v) for v in values], "ratioToC": round(to_c, 3), "ratioToSwiftFloor": round(to_floor, 3)}
        lines.append(f"| {name} | {statistics.median(values):,.0f} | {', '.join(f'{v / 1000:.1f}k' for v in values)} | {to_c:.3f} | {to_floor:.3f} |")
    result["placements"][placement] = entries
    lines.append("")
json.dump(result, open(f"{output}/swift-floor.json", "w"), indent=2)
open(f"{output}/swift-floor.md", "w").write("\n".join(lines))
print("\n".join(lines))
PYTHON
    echo "wrote $output" >&2
    exit 0
fi
for placement in "${placements[@]}"; do
    if [ "$placement" = same-core ]; then server_cpu=0; else server_cpu=1; fi
    for round in $(seq 1 "$rounds"); do
        echo "== $placement, round $round of $rounds" >&2
        for pair in "floor floor" "floor floor-cancellable" "on-loop floor-cancellable" "floor engine" "on-loop engine" "floor-task floor-cancellable" "task engine"; do
            read -r server client <<< "$pair"
            line=$(run_pair "$server" "$client" "$server_cpu" "$trips" 64)
            echo "$placement $server $client $line" >> "$samples"
        done
        if [ -n "$spin" ]; then mechanisms=(--mechanism unix-stream+spin --mechanism unix-stream+spin+handoff); else mechanisms=(--mechanism unix-stream+epoll --mechanism unix-stream+epoll+handoff --mechanism unix-stream); fi
        .build/release/ipcbench floor "${mechanisms[@]}" --placement "$placement" --size 64 \
            --sample-scale "$(python3 -c "print($trips / 20000)")" --output "$work/c-$placement-$round" > /dev/null
        python3 - "$work/c-$placement-$round/results.json" "$placement" >> "$samples" <<'PYTHON'
import json, sys
for row in json.load(open(sys.argv[1]))["latency"]:
    if row["payloadBytes"] == 64:
        print(f"{sys.argv[2]} C {row['transport']} round trips {row['samples']} p50 {row['p50']} ns p99 {row['p99']} ns")
PYTHON
    done
done

python3 - "$samples" "$output" "$rounds" "$trips" "$spin" <<'PYTHON'
import json, re, statistics, sys
samples, output, rounds, trips, spin = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
way = "+spin" if spin else "+epoll"
names = {
    ("floor", "floor"): "Swift floor",
    ("floor", "floor-cancellable"): "Swift floor, cancellable request",
    ("on-loop", "floor-cancellable"): "engine server (on-loop handler), Swift floor client (cancellable)",
    ("floor", "engine"): "Swift floor server, engine client",
    ("on-loop", "engine"): "engine, on-loop handler",
    ("floor-task", "floor-cancellable"): "Swift floor, async handler on a serving thread",
    ("task", "engine"): "engine, async handler (main rows)",
}
# The C floor that does each pair's work: a hand-off to a serving thread, or the loop's own.
handing_off = {"Swift floor, async handler on a serving thread", "engine, async handler (main rows)", f"C floor:unix-stream{way}+handoff"}
rows = {}
for line in open(samples):
    fields = line.split()
    match = re.search(r"round trips (\d+) p50 (\d+) ns p99 (\d+) ns", line)
    if not match:
        sys.exit(f"unreadable sample: {line!r}")
    placement = fields[0]
    name = f"C {fields[2]}" if fields[1] == "C" else names[(fields[1], fields[2])]
    row = rows.setdefault(placement, {}).setdefault(name, {"p50": [], "p99": []})
    row["p50"].append(int(match[2]))
    row["p99"].append(int(match[3]))
result = {"unit": "nanoseconds per round trip, unix-socket binary 64 B" + (", spinning" if spin else ""), "rounds": rounds, "roundTripsPerRound": trips, "placements": {}}
lines = []
for placement, table in rows.items():
    floors = {False: f"C floor:unix-stream{way}", True: f"C floor:unix-stream{way}+handoff"}
    medians = {hands: statistics.median(table[name]["p50"]) for hands, name in floors.items()}
    lines += [f"### {placement}", "", "| pair | p50 (median of rounds) | rounds' p50 | p99 (median) | ÷ C floor of the same work | rounds' ratios: median (range) |", "|---|---:|---|---:|---|---|"]
    entries = {}
    for name, row in table.items():
        p50, p99 = statistics.median(row["p50"]), statistics.median(row["p99"])
        hands = name in handing_off
        ratio = p50 / medians[hands]
        # Each round's pair against the same round's floor: the VM's speed drifts between rounds
        # (by half, within a minute, on the Intel VM), which a ratio of medians mixes in.
        round_ratios = [a / b for a, b in zip(row["p50"], table[floors[hands]]["p50"])]
        by_round = statistics.median(round_ratios)
        entries[name] = {"p50": p50, "p99": p99, "roundP50s": row["p50"], "roundP99s": row["p99"], "sameWorkFloor": floors[hands][2:], "ratioToSameWorkFloor": round(ratio, 3), "roundRatios": [round(r, 3) for r in round_ratios], "medianOfRoundRatios": round(by_round, 3)}
        lines.append(f"| {name} | {p50 / 1000:.2f} µs | {min(row['p50']) / 1000:.2f}–{max(row['p50']) / 1000:.2f} | {p99 / 1000:.2f} µs | {ratio:.2f}× {floors[hands][8:]} | {by_round:.2f}× ({min(round_ratios):.2f}–{max(round_ratios):.2f}) |")
    result["placements"][placement] = entries
    lines.append("")
json.dump(result, open(f"{output}/swift-floor.json", "w"), indent=2)
open(f"{output}/swift-floor.md", "w").write("\n".join(lines))
print("\n".join(lines))
PYTHON
echo "wrote $output" >&2
