import json,sys,glob,os
base=sys.argv[1]
for f in sorted(glob.glob(f'{base}/*.json')) or sorted(glob.glob(f'{base}/*/results.json')):
    name=os.path.basename(f)[:-5] if not f.endswith('results.json') else os.path.basename(os.path.dirname(f))
    d=json.load(open(f))
    out=[]
    for size in (64,4096):
        rows={ (r['transport'],r.get('handler'),r.get('waitStrategy')): r for r in d['latency'] if r['payloadBytes']==size}
        def g(t,h,w): return rows.get((t,h,w),{}).get('p50')
        sp=g('message-port','on-loop','spin-then-block'); fs=g('floor:mqueue+spin',None,'spin-then-block')
        st=g('message-port','task','spin-then-block'); fh=g('floor:mqueue+spin+handoff',None,'spin-then-block')
        bl=g('message-port','on-loop','blocking'); fe=min(x for x in [g('floor:mqueue+epoll',None,'blocking'),g('floor:mqueue+poll',None,'blocking')] if x)
        bt=g('message-port','task','blocking'); feh=g('floor:mqueue+epoll+handoff',None,'blocking')
        out.append(f"{size}B spin on-loop {sp:.0f}/{fs:.0f}={sp/fs:.2f} task {st:.0f}/{fh:.0f}={st/fh:.2f} | block on-loop {bl:.0f}/{fe:.0f}={bl/fe:.2f} task {bt:.0f}/{feh:.0f}={bt/feh:.2f}")
    print(name, ' || '.join(out))
