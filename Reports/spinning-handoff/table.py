#!/usr/bin/env python3
"""Tables of Reports/spinning-handoff: `python3 table.py` for the run in results.json (spinning
rows and floors, split cores), `python3 table.py experiments` for the scheduler experiments."""
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))

def spinning_table():
    rows = json.load(open(os.path.join(here, "results.json")))["latency"]
    def find(transport, size, handler=None):
        for x in rows:
            if x["transport"] == transport and x["payloadBytes"] == size and x.get("waitStrategy", "blocking") != "blocking" \
                    and (handler is None or x.get("handler") == handler) and x.get("framing") in (None, "binary"):
                return x
    cs = lambda x: (x.get("localContextSwitchesPerRoundTrip") or 0) + (x.get("peerContextSwitchesPerRoundTrip") or 0)
    print("| size | transport | plain floor | hand-off floor (÷ plain) | main row (÷ hand-off floor), p99, cs | on-loop row (÷ plain floor), p99, cs |")
    print("|---|---|---|---|---|---|")
    for size in (64, 4096):
        for transport, plain, handoff in (("notify", "shm+spin", "shm+spin+handoff"), ("unix-socket", "unix-stream+spin", "unix-stream+spin+handoff"),
                                          ("message-port", "mqueue+spin", "mqueue+spin+handoff")):
            p, h = find("floor:" + plain, size), find("floor:" + handoff, size)
            m, o = find(transport, size, "task"), find(transport, size, "on-loop")
            print(f"| {size} B | {transport} | {plain} {p['p50']/1000:.2f} µs | {h['p50']/1000:.2f} µs ({h['p50']/p['p50']:.2f}×) "
                  f"| {m['p50']/1000:.2f} µs ({m['p50']/h['p50']:.2f}×), {m['p99']/1000:.0f} µs, {cs(m):.2f} "
                  f"| {o['p50']/1000:.2f} µs ({o['p50']/p['p50']:.2f}×), {o['p99']/1000:.0f} µs, {cs(o):.2f} |")

def experiments_table():
    runs = json.load(open(os.path.join(here, "experiments.json")))
    for experiment in dict.fromkeys(r["experiment"] for r in runs):
        print(f"\n{experiment}: p50/p99 µs (context switches per round trip)")
        for run in (r for r in runs if r["experiment"] == experiment):
            cells = []
            for x in run["rows"]:
                if x["transport"].startswith("floor:"):
                    continue
                spins = "spin" if x["wait"] != "blocking" else "block"
                place = "1 core" if x["placement"] == "same-core" else "2 cores"
                name = x["transport"] + ("/" + x["framing"] if x["framing"] else "")
                cells.append(f"{name} {place} {spins} {x['payload']} B {x['p50']/1000:.1f}/{x['p99']/1000:.0f} ({x['cs']:.2f})")
            print(f"  round {run['round']}, {run['variant']}{' — ' + run['note'] if run['note'] else ''}:")
            for cell in cells:
                print("    " + cell)

experiments_table() if sys.argv[1:] == ["experiments"] else spinning_table()
