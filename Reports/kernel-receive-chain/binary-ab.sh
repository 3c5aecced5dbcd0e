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
    # In older commits the binary is a package of its own (RoundTripInstructions/Package.swift);
    # in newer ones, a product of the Benchmarks package.
    if [ -f "$work/$commit/Benchmarks/RoundTripInstructions/Package.swift" ]; then
        package=$work/$commit/Benchmarks/RoundTripInstructions
    else
        package=$work/$commit/Benchmarks
    fi
    swift build -c release --package-path "$package" --product round-trip-instructions > "$work/$commit.build.log" 2>&1 \
        || { cat "$work/$commit.build.log" >&2; exit 1; }
    ln -s "$package/.build/release/round-trip-instructions" "$work/$commit.bin"
done
for round in $(seq 1 "$rounds"); do
    for commit in "$1" "$2"; do
        binary=$work/$commit.bin
        echo "$round $commit $(Reports/kernel-receive-chain/stream-once.sh "$binary" "$server_cpu" "$messages" "$bytes") µs a message"
    done
done
