#!/usr/bin/env bash
# Times two builds of the engine against each other, interleaved: the same 64-byte unix-socket
# round trip (Benchmarks/RoundTripInstructions: a client task on the connection's executor, a
# server with the on-loop or the default async handler), run by an old and a new binary in turn,
# round after round, on one core and on two. Interleaving puts both builds under the same drift
# of a shared VM, so their ratio means something where two separate runs' times do not.
#
# With --stream, also the one-way stream (`client ... stream` against `serve ... sink`): 64-byte
# messages sent one `send` each from a task on the connection's executor, taken in place on the
# server's loop; its figure is messages per second, from the first send until the reply to a
# last request, which the server answers after it has taken every message. Both binaries must
# time their stream (4916a71 on; for an older engine, build it with that commit's
# Benchmarks/RoundTripInstructions/Sources/round-trip-instructions/main.swift).
#
#   Scripts/round-trip-ab.sh --old BIN --new BIN [--rounds N] [--round-trips N] [--stream] [--messages N]
#                            [--stream-bytes B] [--stream-only] [--output DIR]
#     --old, --new    round-trip-instructions binaries, e.g. built from two commits:
#                       git worktree add /tmp/old COMMIT
#                       swift build -c release --package-path /tmp/old/Benchmarks --product round-trip-instructions
#                       (the binary: /tmp/old/Benchmarks/.build/release/round-trip-instructions)
#     --rounds        rounds of every pair (default 7); each figure is the median of the rounds' p50s
#     --round-trips   round trips per run (default 20000, every one timed)
#     --stream        also times the one-way stream, on both placements
#     --messages      messages per stream run (default 200000)
#     --stream-bytes  each stream message's payload (default 64; implies --stream)
#     --stream-only   times the stream only, no round trips (implies --stream)
#     --output        writes ab.json and ab.md there (default: prints the table only)
#
# Same core: server and client on CPU 0. Two cores: server on CPU 1, client on CPU 0. Within a
# round the two builds take turns in both orders (old first in odd rounds, new first in even).
set -euo pipefail
shopt -s inherit_errexit

old="" new="" rounds=7 trips=20000 output="" stream=0 messages=200000 stream_bytes=64 stream_only=0
usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --stream) stream=1; shift; continue ;;
        --stream-only) stream=1; stream_only=1; shift; continue ;;
        --old|--new|--rounds|--round-trips|--messages|--stream-bytes|--output)
            [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 64; }
            case "$1" in
                --old) old="$2" ;; --new) new="$2" ;; --rounds) rounds="$2" ;;
                --round-trips) trips="$2" ;; --messages) messages="$2" ;; --output) output="$2" ;;
                --stream-bytes) stream_bytes="$2"; stream=1 ;;
            esac
            shift ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 64 ;;
    esac
    shift
done
[ -n "$old" ] && [ -n "$new" ] || { echo "--old and --new are required (see --help)" >&2; exit 64; }
for binary in "$old" "$new"; do
    [ -f "$binary" ] && [ -x "$binary" ] || { echo "not an executable file: $binary" >&2; exit 66; }
done
# Absolute, so that a relative path names the file the caller meant, never one on PATH.
old=$(realpath "$old") new=$(realpath "$new")
[ -z "$output" ] || output=$(realpath -m "$output")
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "--rounds must be a positive whole number" >&2; exit 64; }
[[ "$trips" =~ ^[1-9][0-9]*$ ]] || { echo "--round-trips must be a positive whole number" >&2; exit 64; }
[[ "$messages" =~ ^[1-9][0-9]*$ ]] || { echo "--messages must be a positive whole number" >&2; exit 64; }
[[ "$stream_bytes" =~ ^(0|[1-9][0-9]*)$ ]] && [ "${#stream_bytes}" -le 9 ] || { echo "--stream-bytes must be a whole number of bytes below 1 GB" >&2; exit 64; }
for cpu in 0 1; do
    taskset -c "$cpu" true 2> /dev/null || { echo "needs CPUs 0 and 1 (same core and two cores); this process may not run on CPU $cpu" >&2; exit 69; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/ipcbench-ab-XXXXXX")
# A server still running (an interrupted or failed pair) is stopped before its folder goes.
cleanup() {
    [ -f "$work/server" ] && kill "$(cat "$work/server")" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# time BINARY HANDLER SERVER_CPU CLIENT_CPU: prints "p50 p99" in nanoseconds; any failure exits
# the script with the failing process's output.
time_pair() {
    local binary=$1 handler=$2 server_cpu=$3 client_cpu=$4 group line pair
    group=$(mktemp -d "$work/group-XXXXXX")
    local server_mode=$handler client_mode=engine count=$trips bytes=64
    [ "$handler" != stream ] || { server_mode=sink client_mode=stream count=$messages bytes=$stream_bytes; }
    taskset -c "$server_cpu" "$binary" serve "$group" "$server_mode" > "$group/server.log" 2>&1 &
    local server=$!
    echo "$server" > "$work/server"
    "$(dirname "$0")/wait-for-server.sh" "$group" "$server" || { echo "($binary $handler)" >&2; exit 1; }
    if ! ROUND_TRIP_TIMES=1 taskset -c "$client_cpu" "$binary" client "$group" "$count" "$bytes" "$client_mode" > "$group/client.log" 2>&1; then
        echo "the client failed ($binary $handler):" >&2; cat "$group/client.log" >&2; exit 1
    fi
    # The server ends when its client has gone; one that does not within a minute has hung.
    local stopped=0
    while kill -0 "$server" 2>/dev/null; do
        sleep 0.02
        stopped=$((stopped + 1))
        if [ "$stopped" -gt 3000 ]; then echo "the server did not end ($binary $handler):" >&2; cat "$group/server.log" >&2; exit 1; fi
    done
    wait "$server" || { echo "the server failed ($binary $handler):" >&2; cat "$group/server.log" >&2; exit 1; }
    rm -f "$work/server"
    if [ "$handler" = stream ]; then
        # "messages/s 0": the stream's figure in the p50 column, nothing in the p99 one.
        line=$(grep '^stream ' "$group/client.log") || { echo "the client printed no time ($binary stream):" >&2; cat "$group/client.log" >&2; exit 1; }
        pair=$(sed -n 's/^stream \([0-9]*\) messages \([0-9]*\) ns$/\1 \2/p' <<< "$line")
        [[ "$pair" =~ ^[0-9]+\ [1-9][0-9]*$ ]] || { echo "unexpected client output ($binary stream): $line" >&2; exit 1; }
        read -r count elapsed <<< "$pair"
        echo "$((count * 1000000000 / elapsed)) 0"
        return
    fi
    line=$(grep '^round trips' "$group/client.log") || { echo "the client printed no times ($binary $handler):" >&2; cat "$group/client.log" >&2; exit 1; }
    pair=$(sed -n 's/^round trips [0-9]* p50 \([0-9]*\) ns p99 \([0-9]*\) ns$/\1 \2/p' <<< "$line")
    [[ "$pair" =~ ^[0-9]+\ [0-9]+$ ]] || { echo "unexpected client output ($binary $handler): $line" >&2; exit 1; }
    echo "$pair"
}

results="$work/results.txt"
: > "$results"
for round in $(seq 1 "$rounds"); do
    echo "round $round of $rounds" >&2
    for placement in "same-core 0 0" "two-cores 1 0"; do
        read -r name server_cpu client_cpu <<< "$placement"
        handlers="on-loop task"
        [ "$stream" -eq 0 ] || handlers="$handlers stream"
        [ "$stream_only" -eq 0 ] || handlers="stream"
        for handler in $handlers; do
            order="old new"; [ $((round % 2)) -eq 0 ] && order="new old"
            for build in $order; do
                binary=$old; [ "$build" = new ] && binary=$new
                # On a line of its own: a failure inside $(...) given to echo would be ignored.
                pair=$(time_pair "$binary" "$handler" "$server_cpu" "$client_cpu")
                echo "$build $handler $name $pair" >> "$results"
            done
        done
    done
done

python3 - "$results" "$output" "$old" "$new" "$rounds" "$trips" "$(sha256sum < "$old" | cut -c1-64)" "$(sha256sum < "$new" | cut -c1-64)" "$stream" "$messages" "$stream_bytes" "$stream_only" <<'PYTHON'
import json, statistics, sys
results, output, old, new, rounds, trips, old_sha, new_sha, stream, messages, stream_bytes, stream_only = sys.argv[1:13]
runs = {}
for line in open(results):
    build, handler, placement, p50, p99 = line.split()
    runs.setdefault((handler, placement, build), []).append((int(p50), int(p99)))
rows = []
for handler in () if stream_only == "1" else ("on-loop", "task"):
    for placement in ("same-core", "two-cores"):
        row = {"handler": handler, "placement": placement}
        for build in ("old", "new"):
            values = runs[(handler, placement, build)]
            row[build] = {"p50_ns": statistics.median(v[0] for v in values), "p99_ns": statistics.median(v[1] for v in values),
                          "p50s_ns": [v[0] for v in values]}
        row["new_over_old_p50"] = round(row["new"]["p50_ns"] / row["old"]["p50_ns"], 3)
        rows.append(row)
table = [] if stream_only == "1" else ["| handler | placement | old p50 (p99) | new p50 (p99) | new ÷ old | old p50s | new p50s |", "|---|---|---:|---:|---:|---|---|"]
for row in rows:
    o, n = row["old"], row["new"]
    table.append(f"| {row['handler']} | {row['placement']} | {o['p50_ns']/1000:.2f} µs ({o['p99_ns']/1000:.2f}) | {n['p50_ns']/1000:.2f} µs ({n['p99_ns']/1000:.2f}) | {row['new_over_old_p50']:.3f} | "
                 + ", ".join(f"{v/1000:.1f}" for v in o["p50s_ns"]) + " | " + ", ".join(f"{v/1000:.1f}" for v in n["p50s_ns"]) + " |")
streams = []
def thousands(value):
    """A round's messages a second in thousands: a decimal below 100 k, so large messages' rounds differ."""
    return f"{value/1000:.1f}" if value < 100_000 else f"{value/1000:.0f}"
if stream == "1":
    table += ([] if stream_only == "1" else [""]) + ["| one-way stream | placement | old messages/s | new messages/s | new ÷ old | old rounds (k/s) | new rounds (k/s) |", "|---|---|---:|---:|---:|---|---|"]
    for placement in ("same-core", "two-cores"):
        row = {"placement": placement}
        for build in ("old", "new"):
            values = [v[0] for v in runs[("stream", placement, build)]]
            row[build] = {"messages_per_second": statistics.median(values), "rounds": values}
        row["new_over_old"] = round(row["new"]["messages_per_second"] / row["old"]["messages_per_second"], 3)
        streams.append(row)
        o, n = row["old"], row["new"]
        table.append(f"| unix-socket binary {stream_bytes} B | {placement} | {o['messages_per_second']:,.0f} | {n['messages_per_second']:,.0f} | {row['new_over_old']:.3f} | "
                     + ", ".join(map(thousands, o["rounds"])) + " | " + ", ".join(map(thousands, n["rounds"])) + " |")
text = "\n".join(table) + "\n"
print(text, end="")
if output:
    import os
    os.makedirs(output, exist_ok=True)
    json.dump({"old": old, "new": new, "old_sha256": old_sha, "new_sha256": new_sha, "rounds": int(rounds), "round_trips": int(trips), "payload_bytes": 64,
               "unit": "nanoseconds, medians of the rounds' p50 and p99", "rows": rows,
               **({"stream_messages": int(messages), "stream_payload_bytes": int(stream_bytes), "streams": streams} if streams else {})}, open(f"{output}/ab.json", "w"), indent=2)
    command = f"Scripts/round-trip-ab.sh --rounds {rounds}" + ("" if stream_only == "1" else f" --round-trips {trips}") + (
        (" --stream-only" if stream_only == "1" else " --stream") + f" --messages {messages}" + (f" --stream-bytes {stream_bytes}" if stream_bytes != "64" else "") if streams else "")
    open(f"{output}/ab.md", "w").write(f"`{command}`; old: `{old}`, new: `{new}`\n\n" + text)
PYTHON
