#!/usr/bin/env python3
"""Interleaved A/B of two ipcbench builds: OLD and NEW run in turn (old first in odd rounds,
new first in even), ROUNDS times, round trips on one core and on two (64 B but for http-large), nothing else.
Prints each row's median over the rounds of its p50 and of its CPU time a round trip (both
processes), and new / old; writes ab.md and ab.json to OUT_DIR.

  rows    `ipcbench run`: message-port, notify and unix-socket (binary), the default async
          handler, blocking waits (no floor, throughput, peer death or in-process rows)
  floors  `ipcbench floor`: unix-stream+epoll, eventfd+epoll and unix-stream+epoll+handoff
  every-floor  `ipcbench floor`: the blocking unix-stream and mqueue floors, the epoll and
          poll floors and their hand-offs (pipe, the spin floors and inotify's writes were
          made direct too, and are not in this set)
  http-large  `ipcbench run`: unix-socket, HTTP and binary framing, 64 KiB and 1 MiB, the default
          async handler (HTTP's large bodies gathered, Reports/http-gathering)

    Reports/direct-syscalls/ipcbench-ab.py rows|floors|every-floor|http-large OLD_IPCBENCH NEW_IPCBENCH ROUNDS OUT_DIR
"""
import json, os, statistics, subprocess, sys

ARGUMENTS = {
    "rows": ["run", "--transport", "message-port", "--transport", "notify", "--transport", "unix-socket",
             "--framing", "binary", "--sizes", "64", "--spin-microseconds", "0",
             "--skip-floor", "--skip-invalidation", "--skip-throughput", "--skip-in-process"],
    "floors": ["floor", "--mechanism", "unix-stream+epoll", "--mechanism", "eventfd+epoll",
               "--mechanism", "unix-stream+epoll+handoff", "--size", "64"],
    "every-floor": ["floor", *[argument for mechanism in
                               ["unix-stream", "mqueue", "unix-stream+epoll", "mqueue+epoll", "mqueue+poll", "eventfd+epoll",
                                "unix-stream+epoll+handoff", "eventfd+epoll+handoff", "mqueue+epoll+handoff"]
                               for argument in ("--mechanism", mechanism)], "--size", "64"],
    "http-large": ["run", "--transport", "unix-socket", "--framing", "http", "--framing", "binary", "--sizes", "65536,1048576",
                   "--spin-microseconds", "0", "--skip-floor", "--skip-invalidation", "--skip-throughput", "--skip-in-process"],
}
if len(sys.argv) != 6 or sys.argv[1] not in ARGUMENTS:
    sys.exit(__doc__)
mode, old, new, rounds, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
args = ARGUMENTS[mode] + ["--placement", "same-core", "--placement", "split-cores"]
os.makedirs(out, exist_ok=True)
table = {"old": {}, "new": {}}
for round in range(1, rounds + 1):
    order = [("old", old), ("new", new)] if round % 2 else [("new", new), ("old", old)]
    for name, binary in order:
        directory = os.path.join(out, f"{name}-{round}")
        subprocess.run([binary, *args, "--output", directory], check=True, stdout=subprocess.DEVNULL)
        for row in json.load(open(os.path.join(directory, "results.json")))["latency"]:
            key = (row["transport"], row.get("framing") or "-", row["payloadBytes"], row["placement"])
            entry = table[name].setdefault(key, {"p50": [], "cpu": []})
            entry["p50"].append(row["p50"] / 1000)
            entry["cpu"].append((row["localCPUPerRoundTrip"] + row["peerCPUPerRoundTrip"]) / 1000)
    print(f"round {round} of {rounds}", file=sys.stderr)
lines = ["| row | framing | payload | placement | old p50 | new p50 | new ÷ old | old CPU a round trip | new CPU | new ÷ old |",
         "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
for key in sorted(table["old"]):
    o, n = table["old"][key], table["new"][key]
    op, np_, oc, nc = (statistics.median(x) for x in (o["p50"], n["p50"], o["cpu"], n["cpu"]))
    lines.append(f"| {key[0]} | {key[1]} | {key[2]} B | {key[3]} | {op:.2f} µs | {np_:.2f} µs | {np_ / op:.3f} | {oc:.2f} µs | {nc:.2f} µs | {nc / oc:.3f} |")
print("\n".join(lines))
open(os.path.join(out, "ab.md"), "w").write(f"`ipcbench-ab.py {mode}`, {rounds} rounds; medians of each round's figure.\n\n" + "\n".join(lines) + "\n")
json.dump({"/".join(map(str, k)): {"old": table["old"][k], "new": table["new"][k]} for k in table["old"]}, open(os.path.join(out, "ab.json"), "w"), indent=1)
