# Prints the tables of README.md from the result files in this folder.
import json, statistics as st, sys, os
here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__)
groups = {'unix-stream': ['unix-stream', 'unix-stream+epoll', 'unix-stream+io_uring'],
          'mqueue': ['mqueue', 'mqueue+epoll', 'mqueue+poll'],
          'futex': ['futex', 'eventfd+epoll', 'eventfd+io_uring']}
rows = {}
for i in (1, 2, 3):
    for r in json.load(open(f'{here}/latency-{i}.json'))['latency']:
        rows.setdefault((r['transport'][6:], r['placement'], r['payloadBytes']), []).append(r['p50'] / 1000)
print('| mechanism | same core 64 B | same core 4 KiB | split cores 64 B | split cores 4 KiB |')
print('|---|---|---|---|---|')
for group, names in groups.items():
    for name in names:
        cells = []
        for placement in ('same-core', 'split-cores'):
            for size in (64, 4096):
                v = rows[(name, placement, size)]
                base = rows[(names[1], placement, size)]
                ratio = '' if name == names[1] else f' ({min(a / b for a, b in zip(v, base)):.2f}–{max(a / b for a, b in zip(v, base)):.2f}×)'
                cells.append(f'{min(v):.1f}–{max(v):.1f} µs{ratio}')
        print(f'| {name} | ' + ' | '.join(cells) + ' |')
print()
d = json.load(open(f'{here}/stream.json'))
s = {(r['transport'], r.get('handler'), r['placement'], r['payloadBytes']): r['messagesPerSecond'] for r in d['throughput'] if r.get('executor') in (None, 'preferred') and r['waitStrategy'] == 'blocking'}
print('| stream, messages/s | placement | 64 B | 4 KiB | 64 KiB |')
print('|---|---|---|---|---|')
for name, handler in [('floor:unix-stream', None), ('floor:unix-stream+epoll', None), ('floor:unix-stream+io_uring', None), ('unix-socket', 'on-loop'), ('unix-socket', 'task')]:
    for placement in ('same-core', 'split-cores'):
        cells = [f"{s[(name, handler, placement, size)] / 1000:.0f} k" for size in (64, 4096, 65536)]
        print(f"| {name}{' (' + handler + ')' if handler else ''} | {placement} | " + ' | '.join(cells) + ' |')
