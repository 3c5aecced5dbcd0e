#!/usr/bin/env python3
# Prints each run of harness-ab.sh: unix-socket binary (async handler, the connection's executor,
# a message per send) in messages a second beside the best event-driven C stream of the same run,
# with its share, per size and placement; and what the run says it used for large frames.
#   python3 Reports/kernel-transfers/harness-ab.py DIR
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json")), key=lambda p: (os.path.basename(p).split("-")[1], p)):
    d = json.load(open(path))
    parts = []
    for placement in ("same-core", "split-cores"):
        for size in sorted({r["payloadBytes"] for r in d["throughput"]}):
            rows = [r for r in d["throughput"] if r["placement"] == placement and r["payloadBytes"] == size and not r.get("batch")]
            engine = [r for r in rows if r["transport"] == "unix-socket" and r.get("handler", "task") == "task" and r.get("executor") == "preferred"]
            floors = [r for r in rows if r["transport"] in ("floor:unix-stream+epoll", "floor:unix-stream+io_uring")]
            if not engine or not floors:
                continue
            best = max(floors, key=lambda r: r["messagesPerSecond"])
            parts.append(f"{placement} {size}: {engine[0]['messagesPerSecond']:.0f} ÷ {best['messagesPerSecond']:.0f} ({best['transport'][6:]}) = {100 * engine[0]['messagesPerSecond'] / best['messagesPerSecond']:.0f} %")
    print(os.path.basename(path)[:-5], f"[{d['context'].get('largeTransfers')}]", " | ".join(parts))
