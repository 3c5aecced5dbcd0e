import json,statistics as st,sys
d0=sys.argv[1]; rounds=int(sys.argv[2]) if len(sys.argv)>2 else 8
samework={'unix-socket':'floor:unix-stream+epoll','message-port':'floor:mqueue+epoll','notify':'floor:eventfd+epoll','file-presenter':'floor:journal'}
res={}
for kind in ['base','new','tol']:
    for r in range(1,rounds+1):
        d=json.load(open(f"{d0}/{kind}-{r}.json")); rows=d['latency']
        f={(x['transport'],x['payloadBytes']):x for x in rows if x['transport'].startswith('floor:')}
        for x in rows:
            t=x['transport']
            if t.startswith('floor:'): continue
            sw=f[(samework[t],x['payloadBytes'])]
            ho=f.get(('floor:unix-stream+epoll+handoff',x['payloadBytes']))
            key=(t,x.get('framing') or '-',x['payloadBytes'],kind if kind!='new' else ('new-'+(x.get('handler') or '?')))
            cs=(x.get('localContextSwitchesPerRoundTrip') or 0)+(x.get('peerContextSwitchesPerRoundTrip') or 0)
            res.setdefault(key,[]).append((x['p50']/1000, x['p50']/sw['p50'], cs, x['p99']/1000))
print("| transport | size | b583bef p50 (÷ same-work floor) | final, on-loop handler | final, async handler on the loop executor | final, async handler (default) |")
print("|---|---|---|---|---|---|")
for t in ['unix-socket','notify','message-port','file-presenter']:
    for fr in (['binary','http'] if t=='unix-socket' else ['-']):
        for size in [64,4096]:
            cells=[]
            for k in ['base','new-on-loop','tol','new-task']:
                v=res.get((t,fr,size,k))
                if not v: cells.append('-'); continue
                cells.append(f"{st.median([a[0] for a in v]):.1f} µs ({st.median([a[1] for a in v]):.2f}×, {st.median([a[2] for a in v]):.1f} cs)")
            name=t+(' '+fr if fr!='-' else '')
            print(f"| {name} | {'64 B' if size==64 else '4 KiB'} | "+" | ".join(cells)+" |")
