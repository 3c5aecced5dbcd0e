#!/usr/bin/env python3
# The round trips of harness-ab.sh's runs: unix-socket binary p50 (µs) at each size and placement,
# async handler and on-loop handler, with the run's large-transfer path.
#   python3 Reports/kernel-transfers/latency-ab.py DIR
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json")), key=lambda p: (os.path.basename(p).split("-")[1], p)):
    d = json.load(open(path))
    parts = []
    for placement in ("same-core", "split-cores"):
        for size in sorted({r["payloadBytes"] for r in d["latency"]}):
            rows = {r.get("handler"): r for r in d["latency"] if r["transport"] == "unix-socket" and r["placement"] == placement
                    and r["payloadBytes"] == size and r.get("waitStrategy") == "blocking" and r.get("executor") == "preferred"}
            if "task" in rows and "on-loop" in rows:
                parts.append(f"{placement} {size}: task {rows['task']['p50'] / 1000:.1f}, on-loop {rows['on-loop']['p50'] / 1000:.1f}")
    print(os.path.basename(path)[:-5], " | ".join(parts))
