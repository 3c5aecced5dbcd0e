#!/usr/bin/env bash
# Fails if an async function, initializer, closure or computed property calls a known blocking
# primitive. A blocking call in an async body holds one of Swift's few cooperative threads (one
# per core: on this two-core machine, half the pool) until it returns; on the engine's event
# loop executor it stalls every connection of the process. Blocking work belongs on a thread of
# its own (Thread.detachNewThread, PosixThread.detach, a DispatchQueue) or behind an await.
#
# Primitives: usleep, sleep, nanosleep (free functions; Task.sleep suspends, so it is fine),
# Thread.sleep, mq_send, mq_receive, mq_timedsend, mq_timedreceive, pthread_join, the C read
# and recv (a free call: not after `.` other than `Glibc.`, nor `func`/`case`), CIPCShims'
# direct system calls of the same (ipc_sys_read, ipc_sys_recv, ipc_sys_epoll_wait,
# ipc_sys_mq_timedsend, ipc_sys_mq_timedreceive), and `x.wait(`
# where the file declares x a DispatchSemaphore or x's name contains "semaphore".
# Async bodies: a func, init or `get` accessor marked async; a closure whose signature says
# `async ... in`, that is bound to a type declared async (`let h: Handler = {`, with Handler a
# typealias in Sources), that awaits, or that is given to Task, Task.detached, addTask or a
# with...TaskGroup. A closure nested in an async body counts as in it (it mostly runs there),
# except one given to Thread.detachNewThread, Thread, PosixThread.detach, pthread_create or
# DispatchQueue...async, or to an async func seen handing an @escaping synchronous closure
# parameter to one of those (runOnThread-style helpers). A nested sync func is a sync body: the
# check does not follow calls, nor know a closure stored and called later on another thread.
# No Swift parser: strings and comments are blanked, then braces are matched.
#
# Escape hatch: `// blocking-call-check: allowed (reason)` on the call's line or the line above.
# Allowed calls are listed with their reasons on every run, so that they stay visible.
#
# Usage: check-blocking-calls.sh [root]   (root defaults to the package; the self-test in
# Scripts/test.sh points it at a planted tree to show the check can fail)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac
root=${1:-"$(dirname "$0")/.."}
cd "$root"

exec python3 - <<'PY'
import bisect, os, re, sys

FREE = re.compile(r'\b(usleep|sleep|nanosleep|mq_timedsend|mq_timedreceive|mq_send|mq_receive|pthread_join|read|recv|ipc_sys_(?:read|recv|epoll_wait|mq_timedsend|mq_timedreceive))\s*\(')
NOT_FREE = re.compile(r'(?:(?<!\bGlibc)(?<!\bDarwin)(?<!\bMusl)\.|\b(?:func|case)\s+)$')  # a method, or a declaration
THREAD_SLEEP = re.compile(r'(?<![\w.])(?:Foundation\.)?Thread\.sleep\s*\(')
WAIT = re.compile(r'(?<![\w.])(?:self\.)?(\w+)\s*\.wait\s*\(')
SEMAPHORE = re.compile(r'\b(?:let|var)\s+(\w+)\s*(?::\s*DispatchSemaphore\b|=\s*DispatchSemaphore\s*\()')
MARKER = re.compile(r'blocking-call-check:\s*allowed\s*\((.*)\)')
DECL = re.compile(r'(?<![\w.])(?:func\s+([^\s(<]+)|(init)[?!]?|(subscript))\s*(?:<[^{]*?>)?\s*\(')
EFFECTS = re.compile(r'\s*((?:(?:async|throws|rethrows|reasync)\b(?:\s*\([^)]*\))?\s*)*)(.*)$', re.S)
ESCAPING_SYNC = re.compile(r'@escaping\b(?:\s*@\w+)*\s*\([^()]*\)\s*(?:throws\s*)?->')
THREAD = re.compile(r'(?:^|\.)(?:Thread\.detachNewThread|PosixThread\.detach|Thread|pthread_create)$|^DispatchQueue\b.*\.async(?:After)?$')
TASK = re.compile(r'(?:^|\.)(?:Task|Task\.detached|Task\.immediate|addTask|addTaskUnlessCancelled|with(?:Throwing)?(?:Discarding)?TaskGroup)$')
PAIRS = {')': '(', '>': '<', ']': '['}
TOKENS = [re.compile(r'//|/\*|#*"'), re.compile(r'[()]|#*"'), re.compile(r'\\|"|\n')]  # in code, interpolation, string

def lex(src):
    """Blanks strings and comments (newlines kept, so offsets and lines hold); returns the code and each line's comment."""
    out, notes, stack, i = list(src), {}, [], 0  # stack: open strings [hashes, multiline] and interpolations [depth]
    def blank(a, b, quote=None):
        out[a:b] = re.sub(r'[^\n]', ' ', src[a:b])
        if quote is not None: out[quote] = '"'  # a string keeps its outer quotes: `"   "`
    while (m := TOKENS[len(stack[-1]) if stack else 0].search(src, i)):
        if stack: blank(i, m.start())
        start, i, token, top = m.start(), m.end(), m.group(), stack[-1] if stack else None
        if token == '//':
            i = src.find('\n', i) % (len(src) + 1)
            notes[src.count('\n', 0, start) + 1] = src[start:i]; blank(start, i)
        elif token == '/*':
            depth = 1
            while depth and (c := re.compile(r'/\*|\*/').search(src, i)): depth += 1 if c.group() == '/*' else -1; i = c.end()
            i = len(src) if depth else i; blank(start, i)
        elif token.endswith('"') and (not top or len(top) == 1):
            multiline = src.startswith('""', i); i += 2 * multiline
            stack.append([token[:-1], multiline]); blank(start, i, None if top else start)
        elif token in '()' and top and len(top) == 1:
            top[0] += 1 if token == '(' else -1
            if top[0] == 0: stack.pop()
            blank(start, i)
        elif token == '\\':
            if src.startswith(top[0] + '(', i): stack.append([1]); i += len(top[0]) + 1
            elif src.startswith(top[0], i): i += len(top[0]) + 1
            blank(start, i)
        elif token == '"':
            close = ('""' if top[1] else '') + top[0]
            if not src.startswith(close, i): blank(start, i)
            else: i += len(close); stack.pop(); blank(start, i, None if stack else i - 1)
        elif not top[1]: stack.pop()  # a newline in a one-line string: unterminated, resynchronize
    return ''.join(out), notes

def open_of(h, k):
    """Index of the bracket opening the one that closes at h[k], or -1."""
    depth = 0
    for j in range(k, -1, -1):
        depth += (h[j] == h[k]) - (h[j] == PAIRS[h[k]])
        if depth == 0: return j
    return -1

def callee(h):
    """The expression a closure at the end of header h is given to: `Task`, `DispatchQueue.global.async`..."""
    h = h.rstrip()
    if h[-1:] in ('(', ':', ','):  # an argument: back to the unmatched (
        depth, j = 0, len(h) - 1
        while j >= 0 and not (h[j] == '(' and depth == 0):
            depth += (h[j] == ')') - (h[j] == '('); j -= 1
        h = h[:max(j, 0)].rstrip()
    j = len(h)
    while j > 0:
        if h[j - 1].isalnum() or h[j - 1] in '_.?!': j -= 1
        elif h[j - 1] in PAIRS and (k := open_of(h, j - 1)) >= 0: j = k
        else: break
    chain = h[j:]
    for pattern in (r'\([^()]*\)', r'<[^<>]*>', r'[?!]'):
        while re.search(pattern, chain): chain = re.sub(pattern, '', chain)
    return chain

def statement(h):
    """The statement a header ends with, continuation lines included."""
    lines = h.rstrip().split('\n'); k = len(lines) - 1
    while k > 0 and (re.match(r'\s*[.)\],&|?+*/=<>-]', lines[k]) or re.search(r'[,(\[&|=]\s*$', lines[k - 1])): k -= 1
    return ' '.join(lines[k:]).strip()

def is_block(h):  # a control-flow block runs in its function; anything else is its own body
    return bool(re.match(r'(?:if|guard|while|for|switch|repeat|do|catch|defer|else)\b', statement(h)))

def classify(code, p, header, stack, helpers, aliases, awaits):
    """What the brace at p opens: {kind: async, sync, thread or plain, name, header}."""
    h = header.rstrip()
    around = next((f['name'] for f in reversed(stack) if f['kind'] != 'plain'), None)
    within = f' in {around}' if around else ''
    frame = lambda kind, name, **more: dict(kind=kind, name=name, header=h, **more)
    accessor = re.fullmatch(r'\s*(?:(?:non)?mutating\s+)?(?:get|set|willSet|didSet|_read|_modify)\b([\w\s()]*)', h)
    if accessor and re.search(r'\basync\b', accessor.group(1)):
        names = re.findall(r'\b(?:var\s+(\w+)|(subscript))', stack[-1]['header'] if stack else '')
        return frame('async', f'{"".join(names[-1]) if names else "property"}.get')
    if accessor: return frame('sync', 'accessor')
    decls = list(DECL.finditer(h))
    if decls:
        m, depth = decls[-1], 0
        for close in range(m.end() - 1, len(h)):
            depth += (h[close] == '(') - (h[close] == ')')
            if depth == 0: break
        effects, tail = EFFECTS.match(h, close + 1).groups()
        if depth == 0 and (not tail or tail.startswith(('->', 'where'))) and not re.search(r'\b(?:var|let|func|init|case|struct|class|enum|protocol|extension|actor|typealias)\b', tail):
            name = f'func {m.group(1)}' if m.group(1) else m.group(2) or m.group(3)
            is_async = bool(re.search(r'\basync\b', effects))
            return frame('async' if is_async else 'sync', name, helper=is_async and bool(ESCAPING_SYNC.search(h, m.end(), close)), threads=False)
    target = callee(h)
    if THREAD.search(target) or target.split('.')[-1] in helpers: return frame('thread', f'{target} closure{within}')
    if TASK.search(target): return frame('async', f'{target} closure{within}')
    bound = re.search(r'\b(?:let|var)\s+(\w+)\s*(?::\s*([^=]+?))?\s*=\s*$', h)
    binding = re.findall(r'\b(?:let|var)\s+(\w+)', statement(h))
    name = f'{target + " " if target else ""}closure' + (f' ({binding[-1]})' if binding else '') + within
    typed = bound and bound.group(2) and (re.search(r'\basync\b', bound.group(2)) or set(re.findall(r'\w+', bound.group(2))) & aliases)
    signature = re.match(r'([^{}]*?)\bin\b', code[p + 1:p + 400])
    if typed or signature and re.search(r'\basync\b(?!\s+(?:let|var)\b)', signature.group(1)): return frame('async', name)
    if not is_block(h) and awaits(p): return frame('async', name)  # Swift makes a closure that awaits async
    return frame('plain', None)

def scan(path, code, notes, helpers, aliases, found_helpers, quiet=False):
    lines = [m.start() for m in re.finditer('\n', code)]
    semaphores = set(SEMAPHORE.findall(code))
    calls = [(m.start(), m.group(1)) for m in FREE.finditer(code) if not NOT_FREE.search(code, max(0, m.start() - 12), m.start())]
    calls += [(m.start(), 'Thread.sleep') for m in THREAD_SLEEP.finditer(code)]
    calls += [(m.start(1), f'{m.group(1)}.wait (DispatchSemaphore)') for m in WAIT.finditer(code) if m.group(1) in semaphores or 'semaphore' in m.group(1).lower()]
    calls.sort()
    braces, closing, opened, headers = [m.start() for m in re.finditer(r'[{}]', code)], {}, [], {}
    for k, b in enumerate(braces):
        if code[b] == '{':  # the text since the last brace, or further back to balance a `)` (closures in default arguments)
            j = k - 1
            while j >= 0 and code[braces[j] + 1:b].count('(') < code[braces[j] + 1:b].count(')'): j -= 1
            opened.append(b); headers[b] = code[(braces[j] if j >= 0 else -1) + 1:b]
        elif opened: closing[opened.pop()] = b
    def awaits(p):  # an await in the body, outside nested closures and declarations
        text, i = '', p + 1
        for q in sorted(q for q in headers if p < q < closing.get(p, len(code))):
            if q >= i and not is_block(headers[q]): text += code[i:q]; i = closing.get(q, len(code)) + 1
        return re.search(r'\bawait\b|\basync\s+let\b', text + code[i:closing.get(p, len(code))])
    violations, allowed, used, bodies, stack, pending = [], [], set(), 0, [], 0
    for brace in braces + [len(code)]:
        while pending < len(calls) and calls[pending][0] < brace:
            offset, primitive = calls[pending]; pending += 1
            context = next((f for f in reversed(stack) if f['kind'] != 'plain'), None)
            if not context or context['kind'] != 'async': continue
            line = bisect.bisect_left(lines, offset) + 1
            marker = next(((l, MARKER.search(notes[l])) for l in (line, line - 1) if l in notes and MARKER.search(notes[l])), None)
            if marker:
                used.add(marker[0]); allowed.append(f'{path}:{line}: {primitive} in async {context["name"]} allowed ({marker[1].group(1)})')
            else:
                violations.append(f'{path}:{line}: {primitive} called in async {context["name"]}')
        if brace == len(code): break
        if code[brace] == '{':
            frame = classify(code, brace, headers[brace], stack, helpers, aliases, awaits)
            bodies += frame['kind'] == 'async'
            if frame['kind'] == 'thread':  # an async func handing a closure parameter to a thread is a thread helper
                decl = next((f for f in reversed(stack) if 'threads' in f), None)
                if decl: decl['threads'] = True
            stack.append(frame)
        elif stack:
            frame = stack.pop()
            if frame.get('helper') and frame.get('threads'): found_helpers.add(frame['name'].split()[-1])
    for line in sorted(l for l in notes if not quiet and MARKER.search(notes[l]) and l not in used):
        print(f'{path}:{line}: note: this blocking-call-check marker silences nothing', file=sys.stderr)
    return violations, allowed, bodies

files = sorted(os.path.join(d, f) for d, _, fs in os.walk('Sources') for f in fs if f.endswith('.swift'))
lexed = {path: lex(open(path, encoding='utf-8', errors='replace').read()) for path in files}
# Closure types declared async (`typealias RequestHandler = ... async ...`) make a closure bound to them async.
aliases = {m.group(1) for code, _ in lexed.values() for m in re.finditer(r'\btypealias\s+(\w+)[^=\n]*=([^\n]*)', code) if re.search(r'\)\s*async\b', m.group(2))}
helpers, violations, allowed, bodies = set(), [], [], 0
for path, (code, notes) in lexed.items():  # a first pass finds the runOnThread-style helpers
    scan(path, code, notes, set(), aliases, helpers, quiet=True)
for path, (code, notes) in lexed.items():
    v, a, b = scan(path, code, notes, helpers, aliases, set())
    violations += v; allowed += a; bodies += b
for line in allowed: print(line)
for line in violations: print(line)
if violations:
    print(f'{len(violations)} blocking call(s) in async bodies ({len(allowed)} allowed): move them to a thread of their own, or await (--help)', file=sys.stderr)
    sys.exit(1)
print(f'no blocking call in an async body: {len(files)} files, {bodies} async bodies checked, {len(allowed)} allowed'
      + (f' (thread helpers: {", ".join(sorted(helpers))})' if helpers else ''))
PY
