#!/usr/bin/env bash
# Two-core 1 MiB throughput (unix-socket binary and the C floors, `ipcbench run --full`) at the
# harness's repetition volume of 64 MiB and at 256 MiB, alternated three times: run from the
# root of a checkout with volume-override.patch applied (it reads TP_VOLUME_MIB; not kept in
# the package) and `swift build -c release --product ipcbench` done. Keeps each run's
# results.json as OUT/volume-V-R.json; volume-ab.txt is their summary.
#
#   Reports/kernel-receive-chain/volume-ab.sh OUT
set -euo pipefail
out=$1; mkdir -p "$out"
for round in 1 2 3; do
  for volume in 64 256; do
    work=$(mktemp -d)
    TP_VOLUME_MIB=$volume .build/release/ipcbench run --full --skip-scale --skip-global-executor --skip-in-process \
      --transport unix-socket --framing binary --sizes 1048576 --placement split-cores --skip-invalidation --no-progress --output "$work" > "$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
    cp "$work/results.json" "$out/volume-$volume-$round.json"; rm -rf "$work"
    echo "round $round volume $volume done" >&2
  done
done
