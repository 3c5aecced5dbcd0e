#!/usr/bin/env bash
# The spinning C floors of two builds, alternated: ROUNDS rounds of `ipcbench floor` for the
# four spinning stream and queue floors (plain and hand-off), split cores, 64 B and 4 KiB, first
# with OLD's executable, then with NEW's. OLD and NEW are directories that each hold a release
# `ipcbench` (its floor peer is the same executable), for instance
#   git worktree add /tmp/floor-old 784f12f && swift build -c release --product ipcbench --package-path /tmp/floor-old
# and OLD=/tmp/floor-old/.build/release. Prints one line a row: round, build, floor, payload,
# p50, p90 (the floor command's own table, 20,000 round trips a row at SAMPLE_SCALE 1).
#
#   [ROUNDS=3] [SAMPLE_SCALE=1] Reports/spinning-floors/floor-ab.sh OLD NEW
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
rounds=${ROUNDS:-3} scale=${SAMPLE_SCALE:-1}
for round in $(seq 1 "$rounds"); do
    for build in "$1" "$2"; do
        "$build/ipcbench" floor --mechanism unix-stream+spin --mechanism mqueue+spin \
            --mechanism unix-stream+spin+handoff --mechanism mqueue+spin+handoff \
            --placement split-cores --size 64 --size 4096 --sample-scale "$scale" 2>/dev/null \
            | awk -v round="$round" -v build="$build" '/^floor:/ { printf "%s %s %s %s %s %s %s %s\n", round, build, $1, $5, $6, $8, $9, $10 }'
    done
done
