#!/usr/bin/env python3
"""Interleaved A/B of two ipcbench builds over the transports' main rows.

Runs `ipcbench run` from OLD and NEW in turn (old first in odd rounds, new first in even), ROUNDS
times: message-port, notify and unix-socket (binary), 64-byte round trips, the default async
handler, on one core and on two, blocking waits, nothing else (no floor, throughput, peer death
or in-process rows). Prints, for each row, the median over the rounds of each build's p50 and of
its CPU time per round trip (both processes), and new / old.

    Reports/direct-syscalls/transports-ab.py OLD_IPCBENCH NEW_IPCBENCH ROUNDS OUT_DIR
"""
import json, os, statistics, subprocess, sys

if len(sys.argv) != 5:
    sys.exit(__doc__)
old, new, rounds, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
os.makedirs(out, exist_ok=True)
args = ["run", "--transport", "message-port", "--transport", "notify", "--transport", "unix-socket",
        "--framing", "binary", "--placement", "same-core", "--placement", "split-cores", "--sizes", "64",
        "--spin-microseconds", "0", "--skip-floor", "--skip-invalidation", "--skip-throughput", "--skip-in-process"]
runs = {"old": [], "new": []}
for round in range(1, rounds + 1):
    order = [("old", old), ("new", new)] if round % 2 else [("new", new), ("old", old)]
    for name, binary in order:
        directory = os.path.join(out, f"{name}-{round}")
        subprocess.run([binary, *args, "--output", directory], check=True, stdout=subprocess.DEVNULL)
        runs[name].append(json.load(open(os.path.join(directory, "results.json")))["latency"])
    print(f"round {round} of {rounds}", file=sys.stderr)

def rows(results):
    table = {}
    for result in results:
        for row in result:
            key = (row["transport"], row["placement"])
            table.setdefault(key, {"p50": [], "cpu": []})
            table[key]["p50"].append(row["p50"] / 1000)
            table[key]["cpu"].append((row["localCPUPerRoundTrip"] + row["peerCPUPerRoundTrip"]) / 1000)
    return table

o, n = rows(runs["old"]), rows(runs["new"])
lines = ["| transport | placement | old p50 | new p50 | new ÷ old | old CPU a round trip | new CPU | new ÷ old |",
         "|---|---|---:|---:|---:|---:|---:|---:|"]
summary = {}
for key in sorted(o):
    op, np_ = statistics.median(o[key]["p50"]), statistics.median(n[key]["p50"])
    oc, nc = statistics.median(o[key]["cpu"]), statistics.median(n[key]["cpu"])
    lines.append(f"| {key[0]} | {key[1]} | {op:.2f} µs | {np_:.2f} µs | {np_ / op:.3f} | {oc:.2f} µs | {nc:.2f} µs | {nc / oc:.3f} |")
    summary[f"{key[0]}/{key[1]}"] = {"old": o[key], "new": n[key]}
print("\n".join(lines))
open(os.path.join(out, "ab.md"), "w").write(f"Rounds: {rounds}; medians of each round's figure.\n\n" + "\n".join(lines) + "\n")
json.dump(summary, open(os.path.join(out, "ab.json"), "w"), indent=1)
