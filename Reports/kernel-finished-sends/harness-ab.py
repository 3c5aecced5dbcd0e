import json,sys
base=sys.argv[1]
for r in (1,2,3):
  for v in ('io_uring','epoll'):
    d=json.load(open(f'{base}/{v}-{r}.json'))
    out=[]
    for p in ('same-core','split-cores'):
        eng=[x['messagesPerSecond'] for x in d['throughput'] if x['transport']=='unix-socket' and x['placement']==p and x.get('batch') is None and x.get('handler')=='task' and x.get('waitStrategy','blocking')=='blocking']
        fl=[(x['messagesPerSecond'],x['transport']) for x in d['throughput'] if x['transport'] in ('floor:unix-stream+epoll','floor:unix-stream+io_uring') and x['placement']==p and x.get('batch') is None]
        f=max(fl)[0] if fl else float('nan')
        out.append(f"{p}: engine {eng[0]:.0f} best-ev-floor {f:.0f} = {100*eng[0]/f:.0f}%")
    print(r, v, ' | '.join(out))
