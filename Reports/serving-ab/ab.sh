#!/usr/bin/env bash
# Interleaved A/B on this VM: b583bef (base, built at /tmp/ab/base) against a fresh clone of the
# final commit (built at /tmp/ab8/final): main rows served by the async handler (new; also measures
# the on-loop rows) and by the async handler started on the loop (tol). Same core, 64 B and 4 KiB.
# Eight rounds, alternating base, new, tol.
set -u
common=(--no-progress --placement same-core --sizes 64,4096 --skip-throughput --skip-scale --skip-invalidation --skip-in-process --skip-global-executor --spin-microseconds 0 --sample-scale 0.5)
for round in 1 2 3 4 5 6 7 8; do
  /tmp/ab/base/.build/release/ipcbench run "${common[@]}" --output /tmp/ab8/runs/base-$round > /tmp/ab8/runs/base-$round.log 2>&1
  /tmp/ab8/final/.build/release/ipcbench run "${common[@]}" --output /tmp/ab8/runs/new-$round > /tmp/ab8/runs/new-$round.log 2>&1
  /tmp/ab8/final/.build/release/ipcbench run "${common[@]}" --handler task-on-loop --skip-on-loop-handler --output /tmp/ab8/runs/tol-$round > /tmp/ab8/runs/tol-$round.log 2>&1
done
