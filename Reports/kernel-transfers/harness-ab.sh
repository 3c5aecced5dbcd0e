#!/usr/bin/env bash
# The harness's unix-socket binary rows with the loops' large transfers through io_uring and the
# epoll way, alternated: ROUNDS pairs of `ipcbench run --full` (both placements, the C floors in
# the same run) at SIZES, each pair's results.json kept as OUT/io_uring-N.json and OUT/epoll-N.json.
# Run from the root of a release build (`swift build -c release --product ipcbench`).
#
#   [ROUNDS=3] [SIZES=4096,65536,1048576] Reports/kernel-transfers/harness-ab.sh OUT
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
out=$1 rounds=${ROUNDS:-3} sizes=${SIZES:-4096,65536,1048576}
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
    for transfers in io_uring epoll; do
        work=$(mktemp -d)
        IPCBENCH_LARGE_TRANSFERS=$transfers .build/release/ipcbench run --full --skip-scale --skip-global-executor --skip-in-process \
            --transport unix-socket --framing binary --sizes "$sizes" --skip-invalidation --no-progress --output "$work" > "$work/log" 2>&1 \
            || { cat "$work/log" >&2; exit 1; }
        cp "$work/results.json" "$out/$transfers-$round.json"
        rm -rf "$work"
        echo "round $round, $transfers: done" >&2
    done
done
