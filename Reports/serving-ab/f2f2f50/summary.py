import json,os,statistics as st
directory=os.path.dirname(os.path.abspath(__file__))
samework={'unix-socket':'floor:unix-stream+epoll','message-port':'floor:mqueue+epoll','notify':'floor:eventfd+epoll','file-presenter':'floor:journal'}
res={}
for kind in ['base','new']:
    for r in range(1,5):
        d=json.load(open(f"{directory}/{kind}-{r}.json")); rows=d['latency']
        f={(x['transport'],x['payloadBytes']):x for x in rows if x['transport'].startswith('floor:')}
        for x in rows:
            t=x['transport']
            if t.startswith('floor:') or t not in samework: continue
            h=x.get('handler') or 'on-loop'
            if kind=='new' and h!='on-loop': continue
            sw=f[(samework[t],x['payloadBytes'])]
            key=(t,x.get('framing') or '-',x['payloadBytes'],kind)
            res.setdefault(key,[]).append((x['p50']/1000, x['p50']/sw['p50']))
print("| transport | size | b583bef p50 (÷ same-work floor) | f2f2f50, on-loop handler |")
print("|---|---|---|---|")
for t in ['unix-socket','notify','message-port','file-presenter']:
    for fr in (['binary','http'] if t=='unix-socket' else ['-']):
        for size in [64,4096]:
            cells=[]
            for k in ['base','new']:
                v=res.get((t,fr,size,k))
                if not v: cells.append('-'); continue
                cells.append(f"{st.median([a[0] for a in v]):.1f} µs ({st.median([a[1] for a in v]):.2f}×, range {min(a[1] for a in v):.2f}–{max(a[1] for a in v):.2f})")
            print(f"| {t+(' '+fr if fr!='-' else '')} | {'64 B' if size==64 else '4 KiB'} | "+" | ".join(cells)+" |")
