#!/usr/bin/env python3
# Ratios within one run, from its results.json (issue 32): each main row (async handler) and
# on-loop row of every transport at 64 B and 4 KiB against its C floors, and the one-way
# stream's share of the best event-driven C stream (epoll or io_uring), with that stream's share
# of the blocking one, unix-socket both framings, every size.
#   python3 Scripts/baseline-ratios.py Reports/baseline/results.json
import json, sys
if len(sys.argv) != 2:
    sys.exit("usage: python3 Scripts/baseline-ratios.py RESULTS.json")
d = json.load(open(sys.argv[1]))
print("context:", d["context"].get("cpuModel"), d["context"].get("date"), d["context"].get("command"))
L = d["latency"]
def row(transport, placement, size, handler=None, framing=None, executor="preferred", wait="blocking"):
    for r in L:
        if r["transport"] == transport and r["placement"] == placement and r["payloadBytes"] == size and r.get("waitStrategy") == wait \
           and (handler is None or r.get("handler") == handler) and (framing is None or r.get("framing") == framing) \
           and (transport.startswith("floor:") or r.get("executor") == executor):
            return r
    return None
subjects = [("unix-socket binary", "unix-socket", "binary", "floor:unix-stream+epoll+handoff", "floor:unix-stream+epoll", "floor:unix-stream"),
            ("unix-socket http", "unix-socket", "http", "floor:unix-stream+epoll+handoff", "floor:unix-stream+epoll", "floor:unix-stream"),
            ("notify", "notify", None, "floor:eventfd+epoll+handoff", "floor:eventfd+epoll", "floor:futex"),
            ("message-port", "message-port", None, "floor:mqueue+epoll+handoff", "floor:mqueue+epoll", "floor:mqueue"),
            ("file-presenter", "file-presenter", None, "floor:journal+handoff", "floor:journal", "floor:inotify")]
for placement in ("same-core", "split-cores"):
    for size in (64, 4096):
        print(f"== {placement} {size} B: main (task) p50 (p99) ÷ hand-off floor; on-loop ÷ epoll floor; hand-off floor ÷ native")
        for name, t, fr, handoff, epoll, native in subjects:
            m = row(t, placement, size, "task", fr); o = row(t, placement, size, "on-loop", fr)
            if m is None or row(handoff, placement, size) is None: continue
            h = row(handoff, placement, size); e = row(epoll, placement, size); n = row(native, placement, size)
            s = f"  {name}: main {m['p50']/1000:.2f} µs ÷ {h['p50']/1000:.2f} = {m['p50']/h['p50']:.2f} (p99 {m['p99']/h['p99']:.2f})"
            if o and e: s += f"; on-loop {o['p50']/1000:.2f} ÷ {e['p50']/1000:.2f} = {o['p50']/e['p50']:.2f}"
            if n: s += f"; hand-off ÷ native {h['p50']/n['p50']:.2f}"
            print(s)
print("== spinning, two cores, 64 B, on-loop handler ÷ the floor that spins the same way")
for name, spinning_floor in (("unix-socket", "floor:unix-stream+spin"), ("message-port", "floor:mqueue+spin"), ("notify", "floor:shm+spin")):
    o = row(name, "split-cores", 64, "on-loop", wait="spin-then-block"); f = row(spinning_floor, "split-cores", 64, wait="spin-then-block")
    if o and f:
        print(f"  {name}: {o['p50']/1000:.2f} µs ÷ {f['p50']/1000:.2f} µs = {o['p50']/f['p50']:.2f}")
print("context.largeTransfers:", d["context"].get("largeTransfers", "not recorded"))
T = d["throughput"]
print("== throughput unix-socket, preferred executor, a message per send, share of best event-driven floor stream (and that floor's share of the blocking unix-stream)")
for framing in ("binary", "http"):
  for placement in ("same-core", "split-cores"):
    for size in (64, 4096, 65536, 1048576):
        rows = [r for r in T if r["placement"] == placement and r["payloadBytes"] == size]
        eng = [r for r in rows if r["transport"] == "unix-socket" and r.get("framing") == framing and r.get("executor") == "preferred" and r.get("handler", "task") == "task" and not r.get("batch")]
        blocking = [r for r in rows if r["transport"] == "floor:unix-stream" and not r.get("batch")]
        floors = [r for r in rows if r["transport"] in ("floor:unix-stream+epoll", "floor:unix-stream+io_uring") and not r.get("batch")]
        if eng and floors:
            best = max(floors, key=lambda r: r["messagesPerSecond"])
            share = f"; floor ÷ blocking {best['messagesPerSecond']/blocking[0]['messagesPerSecond']*100:.0f} %" if blocking else ""
            print(f"  {framing} {placement} {size}: engine {eng[0]['messagesPerSecond']/1000:.0f} k/s ÷ {best['transport']} {best['messagesPerSecond']/1000:.0f} k/s = {eng[0]['messagesPerSecond']/best['messagesPerSecond']*100:.0f} %{share}")
