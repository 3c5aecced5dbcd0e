#!/usr/bin/env python3
"""Each stream row's start-up cost, from two runs that differ only in messages per repetition
(SHORT and LONG results.json, e.g. ab/r1-8388608 and ab/r1-67108864): with T = n / rate the
median repetition's time, T = a + n b gives the steady time a message b and the fixed cost a
repetition a. Two separate runs on a shared VM: read a as an estimate, not a measurement."""
import json, sys

def rows(path):
    out = {}
    for r in json.load(open(path))['throughput']:
        key = (r['transport'], r.get('framing'), r['placement'], r['payloadBytes'], r.get('waitStrategy'), r.get('handler'), r.get('batch'))
        out[key] = (r['messagesPerRepetition'], r['messagesPerSecond'])
    return out

short, long_ = rows(sys.argv[1]), rows(sys.argv[2])
for key in sorted(short, key=lambda k: (k[2], k[3], k[0], str(k[5]), str(k[6]))):
    if key not in long_ or key[3] < 65536 or key[4] != 'blocking':
        continue
    (n1, r1), (n2, r2) = short[key], long_[key]
    if n1 == n2 or not r1 or not r2:
        continue
    t1, t2 = n1 / r1, n2 / r2
    b = (t2 - t1) / (n2 - n1)
    a = t1 - n1 * b
    name = key[0] + (f" {key[1]}" if key[1] else "") + (f" {key[5]}" if key[5] else "") + (f" batched {key[6]}" if key[6] else "")
    print(f"{key[2]:11} {key[3]:>8} {name:40} {n1:>5} msgs {r1:9.0f}/s  {n2:>5} msgs {r2:9.0f}/s  steady {b * 1e6:7.1f} us/msg  start-up {a * 1e6:7.0f} us")
