#!/usr/bin/env bash
# Interleaved A/B: b583bef (/tmp/ab/base) against the .ci/run fresh-clone release build of f2f2f50.
set -u
common=(--no-progress --placement same-core --sizes 64,4096 --skip-throughput --skip-scale --skip-invalidation --skip-in-process --skip-global-executor --spin-microseconds 0 --sample-scale 0.5)
for round in 1 2 3 4; do
  /tmp/ab/base/.build/release/ipcbench run "${common[@]}" --output /tmp/ab9/runs/base-$round > /tmp/ab9/runs/base-$round.log 2>&1
  /tmp/ci/repo/.build/release/ipcbench run "${common[@]}" --output /tmp/ab9/runs/new-$round > /tmp/ab9/runs/new-$round.log 2>&1
done
echo finished
