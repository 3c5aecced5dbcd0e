import json,os,sys,statistics as st
directory=sys.argv[1] if len(sys.argv)>1 else os.path.dirname(os.path.abspath(__file__))
new_label=sys.argv[2] if len(sys.argv)>2 else '136d897'  # the commit the new-N.json runs measured
samework={'unix-socket':'floor:unix-stream+epoll','file-presenter':'floor:journal'}
res={}
rounds=sorted({int(n.split('-')[1].split('.')[0]) for n in os.listdir(directory) if n.startswith('base-') and n.endswith('.json')})
for kind in ['base','new']:
    for r in rounds:
        d=json.load(open(f"{directory}/{kind}-{r}.json")); rows=d['latency']
        f={(x['transport'],x['payloadBytes']):x for x in rows if x['transport'].startswith('floor:')}
        for x in rows:
            t=x['transport']
            if t not in samework or x.get('executor')=='global' or x.get('waitStrategy')=='spin-then-block': continue
            h={'task':'async'}.get(x.get('handler'),x.get('handler') or 'async')
            sw=f.get((samework[t],x['payloadBytes']))
            if not sw: continue
            key=(t,x.get('framing') or '-',h,x['payloadBytes'],kind)
            res.setdefault(key,[]).append((x['p50']/1000, x['p50']/sw['p50'], x['p99']/1000))
print(f"| transport | handler | size | 8aa36a6 p50 (÷ same-work floor) | {new_label} p50 (÷ same-work floor) | p99 base / new |")
print("|---|---|---|---|---|---|")
for t in ['unix-socket','file-presenter']:
    for fr in (['binary','http'] if t=='unix-socket' else ['-']):
        for h in ['async','on-loop']:
            for size in [64,4096]:
                cells=[]; p99=[]
                for k in ['base','new']:
                    v=res.get((t,fr,h,size,k))
                    if not v: cells.append('-'); p99.append('-'); continue
                    cells.append(f"{st.median([a[0] for a in v]):.1f} µs ({st.median([a[1] for a in v]):.2f}×, {min(a[1] for a in v):.2f}–{max(a[1] for a in v):.2f})")
                    p99.append(f"{st.median([a[2] for a in v]):.0f}")
                if cells==['-','-']: continue
                print(f"| {t+(' '+fr if fr!='-' else '')} | {h} | {'64 B' if size==64 else '4 KiB'} | "+" | ".join(cells)+f" | {p99[0]} / {p99[1]} µs |")
