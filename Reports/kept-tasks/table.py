#!/usr/bin/env python3
"""Medians of the interleaved A/B in ab.json: python3 table.py [FIRST LAST] (rounds, default all).

Each row's p50 before and after, and its p50 divided by floor:unix-stream+epoll+handoff in the
same run (the hand-off floor), whose medians are taken per run first."""
import json, os, statistics, sys

data = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ab.json")))
first, last = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) == 3 else (1, 10**6)
rows = {}
for name, results in data["runs"].items():
    side, number = name.rsplit("-", 1)
    if not first <= int(number) <= last:
        continue
    handoff = {r["payloadBytes"]: r["p50"] for r in results if r["transport"] == "floor:unix-stream+epoll+handoff"}
    for r in results:
        if r["waitStrategy"] != "blocking":
            continue
        key = f'{r["transport"]} {r["payloadBytes"]} B'
        rows.setdefault(key, {}).setdefault(side, []).append((r["p50"] / 1000, r["p50"] / handoff[r["payloadBytes"]]))
print(f"rounds {first}-{min(last, max(int(n.rsplit('-', 1)[1]) for n in data['runs']))}")
print(f"| row | runs | p50 before (µs) | p50 after (µs) | ÷ hand-off floor before | after |")
print("|---|---:|---:|---:|---:|---:|")
for key, sides in rows.items():
    if "before" not in sides or "after" not in sides:
        continue
    median = lambda side, i: statistics.median(x[i] for x in sides[side])
    print(f"| {key} | {len(sides['before'])} | {median('before', 0):.1f} | {median('after', 0):.1f} | "
          f"{median('before', 1):.2f} | {median('after', 1):.2f} |")
