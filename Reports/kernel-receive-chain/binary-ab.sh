#!/usr/bin/env bash
# The engine's one-way stream built from two commits, alternated: Benchmarks/RoundTripInstructions
# of OLD and of NEW (each checked out into a temporary directory and built in release), then
# ROUNDS rounds of `client … stream` against `serve … sink`, MESSAGES messages of BYTES each,
# the client on CPU 0 and the server on SERVER_CPU (0: same core, 1: two cores). Prints each
# run's microseconds a message. Run from a clone of the repository (both commits in it).
#
#   [SERVER_CPU=0] [ROUNDS=5] [MESSAGES=2000] [BYTES=1048576] Reports/kernel-receive-chain/binary-ab.sh OLD NEW
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-5} messages=${MESSAGES:-2000} bytes=${BYTES:-1048576} server_cpu=${SERVER_CPU:-0}
work=$(mktemp -d /tmp/binary-ab-XXXX)
trap 'rm -rf "$work"' EXIT
for commit in "$1" "$2"; do
    mkdir -p "$work/$commit"
    git archive "$commit" | tar -x -C "$work/$commit"
    swift build -c release --package-path "$work/$commit/Benchmarks/RoundTripInstructions" > "$work/$commit.build.log" 2>&1 \
        || { cat "$work/$commit.build.log" >&2; exit 1; }
done
for round in $(seq 1 "$rounds"); do
    for commit in "$1" "$2"; do
        binary=$work/$commit/Benchmarks/RoundTripInstructions/.build/release/round-trip-instructions
        echo "$round $commit $(Reports/kernel-receive-chain/stream-once.sh "$binary" "$server_cpu" "$messages" "$bytes") µs a message"
    done
done
