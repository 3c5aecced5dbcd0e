#!/usr/bin/env bash
# Interleaved A/B, same core: 8aa36a6 (shared inbox, a clone in /tmp/ab2/base) against e58ae97 (per-client outboxes, the listener kit, IPCFileCoordination as its own module; /tmp/ab3/new), release builds.
set -u
common=(--no-progress --transport file-presenter --transport unix-socket --placement same-core --sizes 64,4096 --skip-scale --skip-invalidation --skip-in-process --skip-global-executor --spin-microseconds 0 --sample-scale 0.5)
for round in 1 2 3 4; do
  /tmp/ab2/base/.build/release/ipcbench run "${common[@]}" --output /tmp/ab3/runs/base-$round > /tmp/ab3/runs/base-$round.log 2>&1
  /tmp/ab3/new/.build/release/ipcbench run "${common[@]}" --output /tmp/ab3/runs/new-$round > /tmp/ab3/runs/new-$round.log 2>&1
done
echo finished
