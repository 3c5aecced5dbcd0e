#!/usr/bin/env python3
"""A foreign client of ipcbench, in Python with its standard library only, written by an author
who read README.md and docs/*.md and nothing else (not Sources/, Tests/ or Benchmarks/): a check
that the documents are enough to build a compatible peer, and that the program does what they
say. It speaks the binary, HTTP and llbsd framings over unix sockets to `ipcbench peer`, the
notify transport's rendezvous, store and rings, the notify.center table and the wormhole's files.
Where a document was found imprecise or wrong, the document was corrected and the expectation
here follows it (WIRE-FORMAT sections 1.1-1.3: a failure with correlation 0 ends a connection on
either side; `ipcbench peer` allows payloads up to 1 GiB); NOTE lines are behaviours the
documents leave open, reported and not checked.

Usage: python3 Tests/Interop/independent-client.py [--ipcbench PATH] [--work DIR]
                                                    [--only binary,stall,http,llbsd,misc,refusal,wormhole,notify,ntfy]

Starts its own `ipcbench peer` servers in private group directories under a new temporary folder
(or --work), runs every check, prints PASS/FAIL/NOTE lines and a summary, stops the servers and
exits 1 if a check failed. About 25 s. `.ci/run` runs it against the release build.
"""
import argparse, ctypes, ctypes.util, mmap, os, select, shutil, socket, struct, subprocess, sys, tempfile, time

IPCBENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".build", "release", "ipcbench")
WORK = None                             # set in main(): a new temporary folder, or --work
MAX_PAYLOAD = 64 * 1024 * 1024          # ConnectionOptions.maximumPayloadLength default (WIRE 1.3)
PEER_MAX = 1 << 30                      # `ipcbench peer`'s maximum (WIRE 1.3, HARNESS.md)
MAX_HEADER = 16384                      # maximumHeaderLength default (WIRE 3.2)

RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append((name, bool(ok), detail))
    print(("PASS " if ok else "FAIL ") + name + (("  -- " + detail) if detail else ""), flush=True)
    return ok


def note(name, detail):
    RESULTS.append((name, None, detail))
    print("NOTE " + name + "  -- " + detail, flush=True)


# ---------------------------------------------------------------------------------------------
# peers
class Peer:
    def __init__(self, group, endpoint, framing="binary", transport="unix-socket", extra=()):
        self.group, self.endpoint = group, endpoint
        if os.path.exists(group):
            subprocess.run(["rm", "-rf", group])
        args = [IPCBENCH, "peer", "--group", group, "--endpoint", endpoint,
                "--framing", framing, "--transport", transport, *extra]
        self.errpath = group + ".stderr"
        self.err = open(self.errpath, "wb")
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        line = self.p.stdout.readline().decode()
        if not line.startswith("READY"):
            raise RuntimeError("peer did not start: %r %s" % (line, open(self.errpath).read()))
        self.pid = int(line.split()[1])

    @property
    def sock_path(self):
        return os.path.join(self.group, self.endpoint + ".sock")

    def stderr_text(self):
        return open(self.errpath, "rb").read().decode(errors="replace")

    def stop(self):
        if self.p.poll() is None:
            self.p.stdin.close()          # "exits when its standard input closes"
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.err.close()


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def recv_exact(s, n, timeout=10.0):
    buf = bytearray()
    deadline = time.monotonic() + timeout
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("got %d of %d bytes" % (len(buf), n))
        s.settimeout(left)
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("EOF after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return bytes(buf)


def read_until_close(s, timeout=3.0):
    """Returns (bytes received, how): how is 'eof', 'reset' or 'open' (still open at timeout)."""
    buf = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(buf), "open"
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return bytes(buf), "open"
        except ConnectionResetError:
            return bytes(buf), "reset"
        if not chunk:
            return bytes(buf), "eof"
        buf += chunk


def nothing_arrives(s, timeout=0.3):
    r, _, _ = select.select([s], [], [], timeout)
    return not r


# ---------------------------------------------------------------------------------------------
# binary framing (WIRE-FORMAT section 2)
MESSAGE, REQUEST, REPLY, FAILURE = 1, 2, 3, 4


def bin_encode(kind, msgid, corr, payload=b""):
    return b"IP\x01" + bytes([kind]) + struct.pack(">IQI", msgid, corr, len(payload)) + payload


def bin_read(s, timeout=10.0, maximum=MAX_PAYLOAD):
    h = recv_exact(s, 20, timeout)
    assert h[0:2] == b"IP", "bad magic %r" % h[0:2]
    assert h[2] == 1, "bad version %d" % h[2]
    assert h[3] in (1, 2, 3, 4), "bad kind %d" % h[3]
    msgid, corr, n = struct.unpack(">IQI", h[4:20])
    assert n <= maximum, "frameTooLarge %d" % n
    return h[3], msgid, corr, recv_exact(s, n, timeout), h


# ---------------------------------------------------------------------------------------------
# HTTP framing (WIRE-FORMAT section 3)
TCHAR = set(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def http_encode(kind, msgid, corr, payload=b""):
    n = len(payload)
    if kind in (MESSAGE, REQUEST):
        k = "message" if kind == MESSAGE else "request"
        head = "POST /ipc HTTP/1.1\r\nHost: ipcbench\r\nContent-Length: %d\r\nIPC-Kind: %s\r\n" % (n, k)
    elif kind == REPLY:
        head = "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nIPC-Kind: reply\r\n" % n
    else:
        head = "HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\nIPC-Kind: failure\r\n" % n
    head += "IPC-Msgid: %d\r\nIPC-Correlation: %d\r\n\r\n" % (msgid, corr)
    return head.encode() + payload


class HTTPError(Exception):
    pass


def http_read(s, timeout=10.0, llbsd=False):
    """Decode one message per WIRE-FORMAT 3.2-3.4 (3.7 with llbsd). Returns
    (kind, msgid, corr, payload, raw_head)."""
    head = bytearray()
    deadline = time.monotonic() + timeout
    while not head.endswith(b"\r\n\r\n"):
        if len(head) >= MAX_HEADER:
            raise HTTPError("frameTooLarge: header block")
        head += recv_exact(s, 1, max(0.01, deadline - time.monotonic()))
    raw = bytes(head)
    lines = raw[:-4].split(b"\r\n")
    for ln in lines:
        if b"\n" in ln or b"\r" in ln:
            raise HTTPError("malformedFrame: bare CR/LF")
        if any((c < 0x20 and c != 9) or c == 0x7F for c in ln):
            raise HTTPError("malformedFrame: control byte")
    start, fields = lines[0], lines[1:]
    is_response = start.startswith(b"HTTP/")
    status = None
    if is_response:
        if not (start[:9] == b"HTTP/1.1 " and start[9:12].isdigit() and start[12:13] == b" "):
            raise HTTPError("malformedFrame: status line %r" % start)
        status = int(start[9:12])
        if not 100 <= status <= 599:
            raise HTTPError("malformedFrame: status")
        if status < 200:
            raise HTTPError("unsupportedFraming: 1xx")
    else:
        parts = start.split(b" ")
        if len(parts) != 3 or parts[2] != b"HTTP/1.1" or not parts[0] or not set(parts[0]) <= TCHAR:
            raise HTTPError("malformedFrame: request line %r" % start)
    seen = {}
    for f in fields:
        if f[:1] in (b" ", b"\t"):
            raise HTTPError("malformedFrame: obs-fold")
        name, colon, value = f.partition(b":")
        if not colon or not name or not set(name) <= TCHAR:
            raise HTTPError("malformedFrame: field %r" % f)
        lname = name.lower()
        value = value.strip(b" \t")
        if lname == b"transfer-encoding":
            raise HTTPError("unsupportedFraming: Transfer-Encoding")
        if lname in (b"content-length", b"ipc-kind", b"ipc-msgid", b"ipc-correlation"):
            if lname in seen:
                raise HTTPError("malformedFrame: repeated %r" % name)
            seen[lname] = value
    cl = seen.get(b"content-length")
    if cl is None:
        if is_response:
            raise HTTPError("malformedFrame: response without Content-Length")
        n = 0
    else:
        if not cl.isdigit():
            raise HTTPError("malformedFrame: Content-Length %r" % cl)
        n = int(cl)
        if n > MAX_PAYLOAD:
            raise HTTPError("frameTooLarge")
    kinds = {b"message": MESSAGE, b"request": REQUEST, b"reply": REPLY, b"failure": FAILURE}
    k = seen.get(b"ipc-kind")
    if k is not None and k not in kinds:
        raise HTTPError("malformedFrame: IPC-Kind %r" % k)
    if is_response:
        if k is None and llbsd:
            if not 200 <= status <= 299:
                raise HTTPError("malformedFrame: llbsd non-2xx")
            kind = MESSAGE
        else:
            kind = REPLY if status < 300 else FAILURE
            if k is not None and kinds[k] != kind:
                raise HTTPError("malformedFrame: IPC-Kind vs status")
    else:
        kind = kinds[k] if k is not None else REQUEST
        if kind not in (MESSAGE, REQUEST):
            raise HTTPError("malformedFrame: IPC-Kind on request")

    def num(key, lim):
        v = seen.get(key)
        if v is None:
            return 0
        if not v.isdigit() or int(v) > lim:
            raise HTTPError("malformedFrame: %r" % key)
        return int(v)
    msgid = num(b"ipc-msgid", 2**32 - 1)
    corr = num(b"ipc-correlation", 2**64 - 1)
    payload = recv_exact(s, n, max(0.01, deadline - time.monotonic()))
    return kind, msgid, corr, payload, raw


def head_of(kind, msgid, corr, n):
    """What WIRE 3.1 says an ipcbench sender writes, exactly, for an n-byte payload."""
    full = http_encode(kind, msgid, corr, bytes(n))
    return full[:len(full) - n]


# ---------------------------------------------------------------------------------------------
SIZES = [0, 1, 64, 4096, 1 << 20]


def pattern(n, seed=0):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def expect_closed(name, s, timeout=3.0, allow_bytes=False):
    data, how = read_until_close(s, timeout)
    ok = how in ("eof", "reset") and (allow_bytes or not data)
    check(name, ok, "server %s, %d bytes back%s" % (
        {"eof": "closed (EOF)", "reset": "reset the connection", "open": "kept the connection OPEN"}[how],
        len(data), (": " + data[:120].hex(" ")) if data else ""))
    return data, how


def fresh(peer):
    return connect(peer.sock_path)


def test_binary(peer):
    print("\n== binary framing (WIRE 2), unix-socket", flush=True)
    st = os.stat(peer.sock_path)
    check("bin: socket G/name.sock is mode 0600", (st.st_mode & 0o777) == 0o600, oct(st.st_mode & 0o777))
    check("bin: lock file G/name.lock exists", os.path.exists(os.path.join(peer.group, peer.endpoint + ".lock")))
    check("bin: group dir mode 0700", (os.stat(peer.group).st_mode & 0o777) == 0o700, oct(os.stat(peer.group).st_mode & 0o777))
    s = fresh(peer)
    check("bin: no greeting/handshake bytes from the listener after connect", nothing_arrives(s, 0.5))

    # 2.3 example, exact bytes
    req = bytes.fromhex("4950010200000007000000000000002a0000000568656c6c6f")
    check("bin: 2.3 example request encodes identically", bin_encode(REQUEST, 7, 42, b"hello") == req)
    s.sendall(req)
    k, m, c, p, h = bin_read(s)
    check("bin: 2.3 example echoed (msgid 7 'other msgid echoed')", (k, m, c, p) == (REPLY, 7, 42, b"hello"),
          (h + p).hex(" "))

    # sizes, msgid 1 = echo, various correlation ids including high bits
    corr = 0x0000000100000001
    for n in SIZES:
        corr += 0x100000001
        pl = pattern(n, n)
        s.sendall(bin_encode(REQUEST, 1, corr, pl))
        k, m, c, p, h = bin_read(s, 30)
        check("bin: echo %d B: kind=reply msgid=1 corr same payload same" % n,
              k == REPLY and m == 1 and c == corr and p == pl, "kind=%d msgid=%d corr=%#x len=%d" % (k, m, c, len(p)))
    # extreme field values
    s.sendall(bin_encode(REQUEST, 1, 2**64 - 1, b"x"))
    k, m, c, p, _ = bin_read(s)
    check("bin: correlation 2^64-1 accepted and echoed", (k, c, p) == (REPLY, 2**64 - 1, b"x"), "corr=%#x" % c)
    s.sendall(bin_encode(REQUEST, 0xFFFFFFFE, 5, b"y"))
    k, m, c, p, _ = bin_read(s)
    check("bin: msgid 0xFFFFFFFE ('any other msgid is echoed')", (k, m, c, p) == (REPLY, 0xFFFFFFFE, 5, b"y"), "kind=%d msgid=%#x" % (k, m))

    # failure: msgid 3
    s.sendall(bin_encode(REQUEST, 3, 77, b"boom"))
    k, m, c, p, h = bin_read(s)
    ok = k == FAILURE and m == 3 and c == 77
    try:
        txt = p.decode("utf-8")
    except UnicodeDecodeError:
        txt, ok = None, False
    check("bin: msgid 3 -> failure frame, same msgid/corr, UTF-8 payload", ok, "kind=%d payload=%r" % (k, txt))

    # pipelining: several requests in one write; by-correlation matching
    batch = b"".join(bin_encode(REQUEST, 1, 1000 + i, bytes([i]) * i) for i in range(10))
    s.sendall(batch)
    got = [bin_read(s) for _ in range(10)]
    check("bin: 10 pipelined requests in one write all answered (arrival order with concurrency 1)",
          [g[2] for g in got] == [1000 + i for i in range(10)] and all(g[3] == bytes([i]) * i for i, g in enumerate(got)),
          str([g[2] for g in got]))

    # correlation 0 request (a sender MUST NOT use it): WIRE 1.1, "a request with correlation id 0
    # is served, and its answer carries correlation id 0"
    s.sendall(bin_encode(REQUEST, 1, 0, b"zero"))
    try:
        k, m, c, p, _ = bin_read(s, 2)
        check("bin: a request with correlation 0 is served, its answer with correlation 0 (WIRE 1.1)",
              (k, c, p) == (REPLY, 0, b"zero"), "kind=%d corr=%d payload=%r" % (k, c, p))
    except (TimeoutError, EOFError) as e:
        check("bin: a request with correlation 0 is served, its answer with correlation 0 (WIRE 1.1)", False, "no answer: %s" % e)

    # one-way message: peer echoes with its msgid; must not be answered with a reply
    s.sendall(bin_encode(MESSAGE, 4242, 0, b"oneway"))
    k, m, c, p, _ = bin_read(s)
    check("bin: one-way message echoed as a one-way message (kind 1, corr 0, same msgid)",
          (k, m, c, p) == (MESSAGE, 4242, 0, b"oneway"), "kind=%d msgid=%d corr=%d" % (k, m, c))
    # message with nonzero correlation
    s.sendall(bin_encode(MESSAGE, 4243, 99, b"mc"))
    try:
        k, m, c, p, _ = bin_read(s, 2)
        check("bin: a one-way message with correlation 99 is delivered as any message (WIRE 1.1): echoed",
              (k, m, c, p) == (MESSAGE, 4243, 0, b"mc"), "kind=%d msgid=%d corr=%d" % (k, m, c))
    except Exception as e:
        check("bin: a one-way message with correlation 99 is delivered as any message (WIRE 1.1): echoed", False, "no echo / closed: %r" % e)
    # unmatched reply / failure sent to the server: WIRE 1.1 "discarded. It is not a protocol error."
    for label, stray in (("reply corr 123456", bin_encode(REPLY, 1, 123456, b"stray")),
                         ("failure corr 123457", bin_encode(FAILURE, 1, 123457, b"stray"))):
        t = fresh(peer)
        t.sendall(stray + bin_encode(REQUEST, 1, 55, b"after"))
        try:
            k, m, c, p, _ = bin_read(t, 3)
            check("bin: unmatched %s sent to the listener is discarded; next request answered" % label,
                  (k, c, p) == (REPLY, 55, b"after"), "kind=%d corr=%d" % (k, c))
        except Exception as e:
            data, how = read_until_close(t, 1)
            check("bin: unmatched %s sent to the listener is discarded; next request answered" % label, False,
                  "%r; connection %s" % (e, how))
        t.close()
    # WIRE 1.1, Refusal: "An ipcbench receiver takes any failure with correlation id 0 this way,
    # on either side of a connection": the listener ends the connection without answering.
    t = fresh(peer)
    t.sendall(bin_encode(FAILURE, 0, 0, b"stray refusal") + bin_encode(REQUEST, 1, 56, b"after"))
    data, how = read_until_close(t, 3)
    check("bin: a failure with correlation 0 sent to the listener ends the connection, nothing answered (WIRE 1.1)",
          how == "eof" and data == b"", "connection %s, %d bytes back" % (how, len(data)))
    t.close()
    s.close()
    s = fresh(peer)
    # delayed echo (msgid 4) and out-of-order answers with concurrency 1
    s.sendall(bin_encode(REQUEST, 4, 600, struct.pack(">I", 300) + b"slow") + bin_encode(REQUEST, 1, 601, b"fast"))
    a = bin_read(s); b = bin_read(s)
    check("bin: delayed echo (msgid 4, 300 ms) then echo: both answered, in arrival order (concurrency 1)",
          (a[2], b[2]) == (600, 601) and a[3] == struct.pack(">I", 300) + b"slow", "order %d,%d" % (a[2], b[2]))
    s.sendall(bin_encode(REQUEST, 5, 700))
    k, m, c, p, _ = bin_read(s)
    check("bin: msgid 5 -> 8-byte big-endian count", k == REPLY and len(p) == 8, "payload=%s" % p.hex())
    s.close()

    # exactly at the maximum (64 MiB) is accepted
    s = fresh(peer)
    big = bytes(MAX_PAYLOAD)
    s.sendall(bin_encode(REQUEST, 1, 9, big))
    try:
        k, m, c, p, _ = bin_read(s, 120)
        check("bin: payload of exactly 64 MiB (the default maximum) accepted and echoed", k == REPLY and p == big, "len=%d" % len(p))
    except Exception as e:
        check("bin: payload of exactly 64 MiB accepted", False, repr(e))
    s.close()
    del big

    # ---- error behaviour (WIRE 1.2, 2.2): server closes, writes nothing, no error frame
    cases = [
        ("bad magic, first byte only (detected at byte 0)", b"\x00"),
        ("bad magic, second byte (detected at byte 1)", b"I\x00"),
        ("version 2 (detected at byte 2)", b"IP\x02"),
        ("unknown kind 5 (detected at byte 3)", b"IP\x01\x05"),
        ("unknown kind 0", b"IP\x01\x00"),
        ("hostile length 0xFFFFFFFF, header only", b"IP\x01\x02" + struct.pack(">IQI", 1, 1, 0xFFFFFFFF)),
        ("length 1 GiB + 1 (the peer's maximum + 1), header only", b"IP\x01\x02" + struct.pack(">IQI", 1, 1, PEER_MAX + 1)),
        ("length 1 GiB + 1 on a one-way message", b"IP\x01\x01" + struct.pack(">IQI", 1, 0, PEER_MAX + 1)),
    ]
    for name, data in cases:
        s = fresh(peer)
        s.sendall(data)
        expect_closed("bin err: %s -> close, no error frame" % name, s)
        s.close()
    # over max with payload bytes actually following
    s = fresh(peer)
    s.sendall(b"IP\x01\x02" + struct.pack(">IQI", 1, 1, PEER_MAX + 1))
    t0 = time.monotonic()
    sent = 0
    try:
        s.settimeout(5)
        while sent < MAX_PAYLOAD:
            sent += s.send(bytes(min(1 << 20, MAX_PAYLOAD - sent)))
    except (BrokenPipeError, ConnectionResetError, socket.timeout) as e:
        pass
    check("bin err: a request announcing 1 GiB + 1: the server stops reading before the payload (we could not push 64 MiB of it)",
          sent < MAX_PAYLOAD, "sent %d payload bytes before the close (%.2fs)" % (sent, time.monotonic() - t0))
    s.close()
    # a valid request, then garbage in the same write: is the request answered before the close?
    s = fresh(peer)
    s.sendall(bin_encode(REQUEST, 1, 31, b"before") + b"XXXX")
    data, how = read_until_close(s, 3)
    note("bin err: valid request followed by garbage in one write",
         "server %s; %d bytes back %s" % (how, len(data), data[:40].hex(" ")))
    s.close()
    # pending request then garbage -> close (the stalled request is failed on the server side)
    s = fresh(peer)
    s.sendall(bin_encode(REQUEST, 2, 32, b"stall"))
    time.sleep(0.2)
    s.sendall(b"\xff")
    expect_closed("bin err: pending (stalled) request then a bad byte -> close, nothing sent", s)
    s.close()
    # truncated frame then close (shutdown write): nothing comes back; server survives
    for cut in (1, 10, 19, 20, 24):
        s = fresh(peer)
        fr = bin_encode(REQUEST, 1, 33, b"hello")
        s.sendall(fr[:cut])
        s.shutdown(socket.SHUT_WR)
        expect_closed("bin err: truncated after %d of %d bytes then EOF -> close, no answer" % (cut, len(fr)), s)
        s.close()
    # a clean EOF at a frame boundary after a request: is the request still answered?
    s = fresh(peer)
    s.sendall(bin_encode(REQUEST, 1, 34, b"last"))
    s.shutdown(socket.SHUT_WR)
    data, how = read_until_close(s, 3)
    note("bin: request then clean EOF (half-close) -> is the request still answered? (WIRE 1.2: it may not be; reported, not checked)",
          "answered=%s; server %s, %d bytes" % (data == bin_encode(REPLY, 1, 34, b"last"), how, len(data)))
    s.close()
    # server still serves
    s = fresh(peer)
    s.sendall(bin_encode(REQUEST, 1, 35, b"alive"))
    check("bin: server still serves after all the hostile clients", bin_read(s)[3] == b"alive")
    s.close()


def test_stall(group):
    print("\n== stalled frame timeout (SECURITY: stalledFrameTimeout)", flush=True)
    peer = Peer(group, "stall", extra=["--stalled-frame-seconds", "2"])
    try:
        s = fresh(peer)
        s.sendall(b"IP\x01\x02\x00")
        t0 = time.monotonic()
        data, how = read_until_close(s, 6)
        dt = time.monotonic() - t0
        check("stall: half a header then silence -> dropped after ~2 s (--stalled-frame-seconds 2)",
              how != "open" and 1.5 < dt < 4.5 and not data, "%s after %.2f s, %d bytes" % (how, dt, len(data)))
        s = fresh(peer)
        t0 = time.monotonic()
        data, how = read_until_close(s, 4)
        check("stall: an idle connection is never timed out", how == "open", how)
        s.close()
        s = fresh(peer)
        s.sendall(bin_encode(REQUEST, 1, 1, b"12345")[:22])
        t0 = time.monotonic()
        data, how = read_until_close(s, 6)
        dt = time.monotonic() - t0
        check("stall: header + part of payload then silence -> dropped after ~2 s", how != "open" and 1.5 < dt < 4.5,
              "%s after %.2f s" % (how, dt))
    finally:
        peer.stop()


def test_http(peer):
    print("\n== HTTP framing (WIRE 3), unix-socket", flush=True)
    s = fresh(peer)
    # 3.6 example
    ex = (b"POST /ipc HTTP/1.1\r\nHost: ipcbench\r\nContent-Length: 5\r\nIPC-Kind: request\r\n"
          b"IPC-Msgid: 7\r\nIPC-Correlation: 42\r\n\r\nhello")
    check("http: 3.6 example: header block is 111 bytes, frame 116", len(ex) - 5 == 111 and len(ex) == 116,
          "head %d, frame %d" % (len(ex) - 5, len(ex)))
    check("http: our encoder gives the 3.6 example", http_encode(REQUEST, 7, 42, b"hello") == ex)
    s.sendall(ex)
    k, m, c, p, raw = http_read(s)
    want = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nIPC-Kind: reply\r\nIPC-Msgid: 7\r\nIPC-Correlation: 42\r\n\r\n"
    check("http: reply head exactly as 3.1 (fields, order, nothing else)", raw == want, repr(raw))
    ok_reply_example = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nIPC-Kind: reply\r\nIPC-Msgid: 7\r\nIPC-Correlation: 42\r\n\r\n"
    check("http: 3.6 reply example header block is 90 bytes", len(ok_reply_example) == 90, "%d" % len(ok_reply_example))
    corr = 10
    for n in SIZES:
        corr += 1
        pl = pattern(n, 3)
        s.sendall(http_encode(REQUEST, 1, corr, pl))
        k, m, c, p, raw = http_read(s, 30)
        check("http: echo %d B: 200, reply, msgid/corr echoed, exact head" % n,
              (k, m, c) == (REPLY, 1, corr) and p == pl and raw == head_of(REPLY, 1, corr, n),
              repr(raw[:120]))
    # failure
    s.sendall(http_encode(REQUEST, 3, 99, b"x"))
    k, m, c, p, raw = http_read(s)
    check("http: msgid 3 -> 'HTTP/1.1 500 Internal Server Error' + IPC-Kind: failure",
          k == FAILURE and raw.startswith(b"HTTP/1.1 500 Internal Server Error\r\n") and b"IPC-Kind: failure\r\n" in raw
          and (m, c) == (3, 99), repr(raw))
    # stock client: no IPC fields, no Host
    s.sendall(b"POST /echo HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
    k, m, c, p, raw = http_read(s)
    check("http: stock request without IPC-* or Host -> reply, msgid 0, corr 0",
          (k, m, c, p) == (REPLY, 0, 0, b"hello"), repr(raw))
    # request without Content-Length has empty body
    s.sendall(b"GET / HTTP/1.1\r\nIPC-Msgid: 1\r\nIPC-Correlation: 5\r\n\r\n")
    k, m, c, p, raw = http_read(s)
    check("http: request without Content-Length = empty body", (k, c, p) == (REPLY, 5, b""), repr(raw))
    # case-insensitive names, leading zeros, OWS, obs-text in values, ignored fields
    s.sendall(b"PUT /x?y HTTP/1.1\r\ncontent-LENGTH:\t 003 \t\r\nipc-msgid:1\r\nIPC-CORRELATION: 0006\r\n"
              b"X-Obs: caf\xc3\xa9\x80\r\nConnection: close\r\nTransfer-Encodingx: y\r\n\r\nabc")
    try:
        k, m, c, p, raw = http_read(s)
        check("http: case-insensitive names, leading zeros, OWS/HTAB, obs-text value, 'Connection: close' ignored",
              (k, m, c, p) == (REPLY, 1, 6, b"abc"), repr(raw))
    except Exception as e:
        check("http: case-insensitive names etc.", False, repr(e))
    # Expect: 100-continue: no interim response
    s.sendall(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\nIPC-Correlation: 8\r\n\r\n")
    check("http: Expect: 100-continue -> no '100 Continue' sent", nothing_arrives(s, 0.5))
    s.sendall(b"hi")
    k, m, c, p, raw = http_read(s)
    check("http: ... body then answered", (c, p) == (8, b"hi"))
    # one-way message: echoed back as an HTTP *request* with IPC-Kind: message
    s.sendall(http_encode(MESSAGE, 4242, 0, b"oneway"))
    k, m, c, p, raw = http_read(s)
    check("http: one-way message echoed as 'POST /ipc' request with IPC-Kind: message, exact 3.1 head",
          (k, m, c, p) == (MESSAGE, 4242, 0, b"oneway") and raw == head_of(MESSAGE, 4242, 0, 6), repr(raw))
    # a response sent to the server with corr 0 (unmatched): discarded
    s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" + http_encode(REQUEST, 1, 12, b"z"))
    try:
        k, m, c, p, raw = http_read(s, 3)
        check("http: unmatched 200 response to the server discarded; connection keeps serving", (c, p) == (12, b"z"))
    except Exception as e:
        check("http: unmatched 200 response discarded", False, repr(e))
    # exactly 16384-byte header block accepted
    base = b"POST / HTTP/1.1\r\nIPC-Correlation: 13\r\nX-Pad: "
    pad = MAX_HEADER - len(base) - 4
    blk = base + b"a" * pad + b"\r\n\r\n"
    assert len(blk) == MAX_HEADER
    s.sendall(blk)
    try:
        k, m, c, p, raw = http_read(s, 3)
        check("http: header block of exactly 16384 bytes accepted", c == 13)
    except Exception as e:
        check("http: header block of exactly 16384 bytes accepted", False, repr(e))
    # exactly 64 MiB body accepted? (Content-Length = maximum)
    s.close()

    # ---- refused inputs (3.6 table and rules): close, no 400, nothing written
    bad = [
        ("duplicate Content-Length (same value)", b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n", None),
        ("Transfer-Encoding: chunked", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n", None),
        ("NUL in field value", b"POST / HTTP/1.1\r\nX-Note: a\x00", None),
        ("bare LF ending the request line", b"POST / HTTP/1.1\n", None),
        ("CR not followed by LF", b"POST / HTTP/1.1\rX", None),
        ("obs-fold (line starts with SP)", b"POST / HTTP/1.1\r\nX-Long: a\r\n b", None),
        ("HTTP/1.0 request line", b"POST / HTTP/1.0\r\n", None),
        ("http/1.1 lower-case version", b"POST / http/1.1\r\n", None),
        ("response without Content-Length", b"HTTP/1.1 200 OK\r\nIPC-Kind: reply\r\n\r\n", None),
        ("Content-Length 4294967295 (max 64 MiB)", b"POST / HTTP/1.1\r\nContent-Length: 4294967295\r\n", None),
        ("Content-Length 1 GiB + 1 (the peer's maximum + 1)", b"POST / HTTP/1.1\r\nContent-Length: 1073741825\r\n", None),
        ("Content-Length above Int64", b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n", None),
        ("Content-Length '5, 5'", b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n", None),
        ("Content-Length '+5'", b"POST / HTTP/1.1\r\nContent-Length: +5\r\n", None),
        ("Content-Length empty", b"POST / HTTP/1.1\r\nContent-Length: \r\n", None),
        ("whitespace before the colon", b"POST / HTTP/1.1\r\nContent-Length : 5\r\n", None),
        ("field line without colon", b"POST / HTTP/1.1\r\nNoColon\r\n", None),
        ("empty line before the start line", b"\r\nPOST / HTTP/1.1\r\n", None),
        ("double SP in request line", b"POST  / HTTP/1.1\r\n", None),
        ("request target with 0x80", b"POST /\x80 HTTP/1.1\r\n", None),
        ("1xx status", b"HTTP/1.1 100 Continue\r\n\r\n", None),
        ("status 600", b"HTTP/1.1 600 X\r\nContent-Length: 0\r\n\r\n", None),
        ("status line without SP after code", b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", None),
        ("IPC-Kind: reply on a request", b"POST / HTTP/1.1\r\nIPC-Kind: reply\r\n\r\n", None),
        ("IPC-Kind: Request (upper case)", b"POST / HTTP/1.1\r\nIPC-Kind: Request\r\n\r\n", None),
        ("IPC-Kind: failure on a 200 response", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nIPC-Kind: failure\r\n\r\n", None),
        ("IPC-Msgid 4294967296", b"POST / HTTP/1.1\r\nIPC-Msgid: 4294967296\r\n", None),
        ("IPC-Correlation 2^64", b"POST / HTTP/1.1\r\nIPC-Correlation: 18446744073709551616\r\n", None),
        ("IPC-Msgid repeated", b"POST / HTTP/1.1\r\nIPC-Msgid: 1\r\nIPC-Msgid: 1\r\n", None),
        ("DEL (0x7F) in a value", b"POST / HTTP/1.1\r\nX: a\x7f", None),
        ("16384 bytes without the end of the header block", b"POST / HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_HEADER - 24), None),
    ]
    for name, data, _ in bad:
        s = fresh(peer)
        s.sendall(data)     # note: most inputs stop right at the detecting byte (no more bytes follow)
        expect_closed("http err: %s -> close without 400 / any bytes" % name, s)
        s.close()
    # 1xx interim status tested with a byte count: 16383 bytes without end must NOT close yet
    s = fresh(peer)
    s.sendall(b"POST / HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_HEADER - 25 - 1))
    check("http: 16383 header bytes without the end -> still open (limit not reached)", nothing_arrives(s, 0.5)
          and read_until_close(s, 0.3)[1] == "open")
    s.close()
    # truncated then close
    for cut in (5, 40, 111, 113):
        s = fresh(peer)
        s.sendall(ex[:cut])
        s.shutdown(socket.SHUT_WR)
        expect_closed("http err: truncated after %d of 116 bytes then EOF -> close, nothing back" % cut, s)
        s.close()
    # a 500 response without IPC-Correlation (a failure with correlation 0) sent to the listener:
    # WIRE 1.1, it ends the connection on either side
    s = fresh(peer)
    s.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 1\r\n\r\nx" + http_encode(REQUEST, 1, 14, b"q"))
    data, how = read_until_close(s, 3)
    check("http: a 500 response with correlation 0 sent to the listener ends the connection, nothing answered (WIRE 1.1)",
          how == "eof" and data == b"", "connection %s, %d bytes back" % (how, len(data)))
    s.close()
    # curl, as documented
    try:
        out = subprocess.run(["curl", "-s", "--max-time", "5", "--unix-socket", peer.sock_path, "--data-binary", "hello",
                              "http://localhost/echo"], capture_output=True, timeout=10)
        check("http: curl --unix-socket ... --data-binary hello prints hello (HARNESS.md)", out.stdout == b"hello",
              "rc=%d out=%r" % (out.returncode, out.stdout))
        out = subprocess.run(["curl", "-s", "-i", "--max-time", "5", "--unix-socket", peer.sock_path, "-d", "hello",
                              "http://localhost/echo"], capture_output=True, timeout=10)
        check("http: curl -d hello -i shows 200 with IPC-* fields", out.stdout.startswith(b"HTTP/1.1 200 OK"), repr(out.stdout[:200]))
        t0 = time.monotonic()
        big = os.path.join(WORK, "big.bin")
        with open(big, "wb") as f:
            f.write(pattern(2 << 20))
        out = subprocess.run(["curl", "-s", "--max-time", "10", "--unix-socket", peer.sock_path, "--data-binary", "@" + big,
                              "http://localhost/echo", "-o", big + ".out"], capture_output=True, timeout=20)
        dt = time.monotonic() - t0
        check("http: curl 2 MiB upload (Expect: 100-continue) succeeds after curl's ~1 s wait",
              out.returncode == 0 and open(big + ".out", "rb").read() == pattern(2 << 20), "rc=%d %.2fs" % (out.returncode, dt))
        out = subprocess.run(["curl", "-s", "--max-time", "5", "--unix-socket", peer.sock_path, "-T", "-",
                              "http://localhost/echo"], input=b"chunked", capture_output=True, timeout=10)
        check("http: curl -T - (chunked) refused: connection closed, no response", out.returncode != 0 and out.stdout == b"",
              "rc=%d out=%r" % (out.returncode, out.stdout))
    except FileNotFoundError:
        note("http: curl", "curl not installed")


def test_llbsd(peer):
    print("\n== llbsd framing (WIRE 3.7)", flush=True)
    s = fresh(peer)
    s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    k, m, c, p, raw = http_read(s, 3, llbsd=True)
    want = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nIPC-Msgid: 0\r\nIPC-Correlation: 0\r\n\r\n"
    check("llbsd: LLBSD message in -> echoed message as 200 + Content-Length + IPC-Msgid + IPC-Correlation, no IPC-Kind",
          raw == want and p == b"hello", repr(raw))
    s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nIPC-Msgid: 9\r\nIPC-Correlation: 3\r\n\r\nab")
    k, m, c, p, raw = http_read(s, 3, llbsd=True)
    check("llbsd: message with IPC-Msgid 9 decoded (peer echoes a message with its msgid, correlation 0)",
          (k, m, p) == (MESSAGE, 9, b"ab"), repr(raw))
    s.sendall(http_encode(REQUEST, 1, 5, b"rq"))
    k, m, c, p, raw = http_read(s, 3, llbsd=True)
    check("llbsd: request/reply as in 3.1", (k, m, c, p) == (REPLY, 1, 5, b"rq") and raw == head_of(REPLY, 1, 5, 2), repr(raw))
    s.close()
    s = fresh(peer)
    s.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    expect_closed("llbsd err: non-2xx response without IPC-Kind -> malformedFrame (close)", s)
    s.close()


def test_misc(work):
    print("\n== group directory rules (TRANSPORTS 'Endpoints', SECURITY)", flush=True)
    g = os.path.join(work, "g-open")
    subprocess.run(["rm", "-rf", g]); os.mkdir(g); os.chmod(g, 0o770)
    p = subprocess.run([IPCBENCH, "peer", "--group", g, "--endpoint", "e"], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=10)
    check("group dir writable by its group -> listener refuses (invalidEndpoint)", p.returncode != 0 and b"READY" not in p.stdout,
          "rc=%d stderr=%r" % (p.returncode, p.stderr.decode(errors="replace").strip()[:200]))
    os.chmod(g, 0o755)
    peer = Peer(g + "-ok", "e")
    try:
        os.chmod(peer.group, 0o1777)
        s = fresh(peer)
        s.sendall(bin_encode(REQUEST, 1, 1, b"ok"))
        note("group dir made 0o1777 under a live listener",
             "a raw connect still works and is served (the dir check is the *client library's*): %r" % (bin_read(s)[3],))
        s.close()
        os.chmod(peer.group, 0o700)
        # second listener on a live endpoint
        p = subprocess.run([IPCBENCH, "peer", "--group", peer.group, "--endpoint", "e"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=10)
        check("second listener on a live endpoint refused (endpointInUse)", p.returncode != 0,
              "rc=%d stderr=%r" % (p.returncode, p.stderr.decode(errors="replace").strip()[:200]))
        lock = open(os.path.join(peer.group, "e.lock")).read()
        check("lock file holds the listener's pid", lock.strip() == str(peer.pid), "lock text %r, pid %d" % (lock, peer.pid))
    finally:
        peer.stop()


def test_refusal(work):
    """WIRE-FORMAT 1.1 "Refusal", against `ipcbench peer --refuse-clients` (HARNESS.md). Added by the
    project after the independent author's checks, from the same two documents."""
    print("\n== a listener's refusal (WIRE 1.1, `peer --refuse-clients`)", flush=True)
    text = b"accessDenied: the listener's accept filter refused this process"
    for framing in ("binary", "http"):
        peer = Peer(os.path.join(work, "g-refuse-" + framing), "e", framing=framing, extra=("--refuse-clients",))
        try:
            # A client that sends nothing reads the frame, then the end of the stream; one that
            # sends a request may find the socket closed already (EPIPE), or its unread bytes
            # turn that end into a reset (ECONNRESET: the listener closes without reading them,
            # WIRE 1.1), and still reads the frame first.
            for sends in (False, True):
                name = "%s: a refused client%s reads one failure, msgid 0, correlation 0, then the stream's end" % (
                    framing, " that sent a request" if sends else "")
                s = connect(peer.sock_path)
                if sends:
                    try:
                        s.sendall(bin_encode(REQUEST, 1, 1, b"hi") if framing == "binary" else http_encode(REQUEST, 1, 1, b"hi"))
                    except (BrokenPipeError, ConnectionResetError):
                        pass                  # the listener had refused and closed already
                try:
                    kind, msgid, corr, payload, _ = bin_read(s) if framing == "binary" else http_read(s)
                    rest, how = read_until_close(s)
                    check(name, (kind, msgid, corr, payload, rest) == (FAILURE, 0, 0, text, b"") and how in (("eof", "reset") if sends else ("eof",)),
                          "kind %d msgid %d corr %d payload %r, then %r (%s)" % (kind, msgid, corr, payload, rest[:60], how))
                except Exception as e:
                    check(name, False, repr(e))
                s.close()
            check("%s: the refusing listener lives on" % framing, peer.p.poll() is None, "exit %r" % peer.p.poll())
        finally:
            peer.stop()
    p = subprocess.run([IPCBENCH, "peer", "--group", os.path.join(work, "g-refuse-client"), "--endpoint", "e", "--role", "client",
                        "--refuse-clients"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
    check("--refuse-clients with --role client is a usage error", p.returncode != 0 and b"READY" not in p.stdout,
          "rc=%d stderr=%r" % (p.returncode, p.stderr.decode(errors="replace").strip()[:200]))
    test_full_listener(work)


def test_full_listener(work):
    """WIRE-FORMAT 1.1 "Refusal" by a full listener, against `ipcbench peer --maximum-connections 1`
    (HARNESS.md). Added by the project, from the same two documents."""
    print("\n== a full listener's refusal (WIRE 1.1, `peer --maximum-connections 1`)", flush=True)
    peer = Peer(os.path.join(work, "g-full"), "e", extra=("--maximum-connections", "1"))

    def echoes(s, corr):
        s.sendall(bin_encode(REQUEST, 1, corr, b"kept"))
        k, m, c, p, _ = bin_read(s)
        return (k, m, c, p) == (REPLY, 1, corr, b"kept")

    try:
        kept = connect(peer.sock_path)
        check("full: the first client is served", echoes(kept, 1))
        extra = connect(peer.sock_path)
        try:
            kind, msgid, corr, payload, _ = bin_read(extra)
            rest, how = read_until_close(extra)
            check("full: a second client reads one failure, correlation 0, whose text begins endpointNotFound:, then the stream's end",
                  (kind, msgid, corr, rest, how) == (FAILURE, 0, 0, b"", "eof") and payload.startswith(b"endpointNotFound:"),
                  "kind %d msgid %d corr %d payload %r, then %r (%s)" % (kind, msgid, corr, payload, rest[:60], how))
        except Exception as e:
            check("full: a second client reads the full listener's refusal", False, repr(e))
        extra.close()
        check("full: the first client is still served", echoes(kept, 2))
        kept.close()
        # The listener sees the first client go in its own time: connect again until admitted.
        admitted, deadline = False, time.monotonic() + 10
        while not admitted and time.monotonic() < deadline:
            s = connect(peer.sock_path)
            try:
                admitted = echoes(s, 3)
            except Exception:
                pass
            s.close()
            if not admitted:
                time.sleep(0.05)
        check("full: a client is admitted again once the first has gone (within 10 s)", admitted)
    finally:
        peer.stop()


# ---------------------------------------------------------------------------------------------
# wormhole files (TRANSPORTS.md "Wormhole")
def fnv1a64(b):
    h = 0xcbf29ce484222325
    for x in b:
        h ^= x
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def fnv1a32(b):
    h = 0x811c9dc5
    for x in b:
        h ^= x
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def wormhole_encode(payload, hash_over="payload"):
    head = b"IPWH" + b"\x01" + b"\x00\x00\x00" + struct.pack(">Q", len(payload))
    covered = payload if hash_over == "payload" else head + payload
    return head + payload + struct.pack(">Q", fnv1a64(covered))


def wormhole_write(group, ident, data):
    d = os.path.join(group, "wormhole")
    os.makedirs(d, mode=0o700, exist_ok=True)
    tmp = os.path.join(d, ".%s.tmp%d" % (ident, os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, data); os.fsync(fd); os.close(fd)
    os.rename(tmp, os.path.join(d, ident + ".message"))


def test_wormhole(work):
    print("\n== wormhole files (TRANSPORTS 'Wormhole')", flush=True)
    g = os.path.join(work, "g-worm")
    subprocess.run(["rm", "-rf", g])
    r = subprocess.run([IPCBENCH, "wormhole", "--group", g, "--pass", "com.t.status=ready"], capture_output=True)
    path = os.path.join(g, "wormhole", "com.t.status.message")
    raw = open(path, "rb").read()
    print("   file written by ipcbench:", raw.hex(" "))
    hdr_ok = raw[:4] == b"IPWH" and raw[4] == 1 and raw[5:8] == b"\0\0\0" and struct.unpack(">Q", raw[8:16])[0] == 5
    check("wormhole: ipcbench's file has the 16-byte header (IPWH, 1, 0 0 0, BE u64 length)", hdr_ok, raw[:16].hex(" "))
    tail = struct.unpack(">Q", raw[-8:])[0]
    which = "payload" if tail == fnv1a64(raw[16:-8]) else "header+payload" if tail == fnv1a64(raw[:-8]) else "neither"
    check("wormhole: trailing FNV-1a 64 hash (BE) -- computed over the payload alone?", which == "payload",
          "hash matches: %s" % which)
    check("wormhole: file mode 0600, directory 0700", (os.stat(path).st_mode & 0o777) == 0o600 and
          (os.stat(os.path.dirname(path)).st_mode & 0o777) == 0o700,
          "%o %o" % (os.stat(path).st_mode & 0o777, os.stat(os.path.dirname(path)).st_mode & 0o777))
    # Python writes, ipcbench reads
    for ident, text in (("com.t.py", "from python ✓"), ("com.t.empty", "")):
        wormhole_write(g, ident, wormhole_encode(text.encode(), "payload" if which != "header+payload" else "hp"))
        r = subprocess.run([IPCBENCH, "wormhole", "--group", g, "--read", ident], capture_output=True)
        check("wormhole: ipcbench --read reads a Python-written message (%d B)" % len(text.encode()),
              r.returncode == 0 and r.stdout.decode().rstrip("\n") == text, "rc=%d out=%r err=%r" % (r.returncode, r.stdout, r.stderr[:200]))
    # tampered: bad hash
    bad = bytearray(wormhole_encode(b"tamper")); bad[-1] ^= 1
    wormhole_write(g, "com.t.bad", bytes(bad))
    r = subprocess.run([IPCBENCH, "wormhole", "--group", g, "--read", "com.t.bad"], capture_output=True)
    check("wormhole: wrong hash -> typed error, no message", r.returncode != 0 or b"tamper" not in r.stdout,
          "rc=%d out=%r err=%r" % (r.returncode, r.stdout, r.stderr.decode(errors="replace").strip()[:200]))
    # listener sees a Python-passed message only if Python also posts the notification
    lst = subprocess.Popen([IPCBENCH, "wormhole", "--group", g, "--listen", "com.t.live", "--timeout", "5"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = lst.stdout.readline()
    wormhole_write(g, "com.t.live", wormhole_encode(b"live!"))
    posted = notify_post(g, "wormhole.com.t.live")
    try:
        out, err = lst.communicate(timeout=8)
    except subprocess.TimeoutExpired:
        lst.kill(); out, err = lst.communicate()
    check("wormhole: ipcbench --listen sees a message Python wrote + posted 'wormhole.<id>' in G/notify.center",
          lst.returncode == 0 and b"live!" in out, "ready=%r post=%s rc=%s out=%r err=%r" % (line, posted, lst.returncode, out, err[:200]))


# ---------------------------------------------------------------------------------------------
# notify.center (WIRE 6, last part)
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
SYS_futex = 202  # x86_64
FUTEX_WAKE = 1


def center_open(group):
    path = os.path.join(group, "notify.center")
    fd = os.open(path, os.O_RDWR)
    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, size)
    return fd, mm, size


def center_find(mm, name, claim=False, fd=None):
    nb = name.encode()
    tag = fnv1a32(nb)
    for i in range(1024):
        slot = (tag + i) % 1024
        off = 64 + slot * 128
        t = struct.unpack_from("<I", mm, off)[0]
        if t == 0:
            if not claim:
                return None
            import fcntl
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if struct.unpack_from("<I", mm, off)[0] != 0:
                    continue
                mm[off + 16] = len(nb)
                mm[off + 17:off + 17 + len(nb)] = nb
                struct.pack_into("<I", mm, off, tag)    # stored last
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return off
        n = mm[off + 16]
        if t == tag and bytes(mm[off + 17:off + 17 + n]) == nb:
            return off
    return None


def notify_post(group, name):
    """Post: counter word := (count+1) & 0x7FFFFFFF, flag clear; FUTEX_WAKE if the flag was set.
    Python has no CAS; a plain read-modify-write (racy, good enough for a test)."""
    try:
        fd, mm, size = center_open(group)
    except FileNotFoundError:
        return "no notify.center"
    off = center_find(mm, name, claim=True, fd=fd)
    if off is None:
        return "slot not found"
    old = struct.unpack_from("<I", mm, off + 4)[0]
    new = ((old & 0x7FFFFFFF) + 1) & 0x7FFFFFFF
    struct.pack_into("<I", mm, off + 4, new)
    woke = None
    if old & 0x80000000:
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mm, off + 4))
        woke = libc.syscall(SYS_futex, ctypes.c_void_p(addr), FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)
    return "old=%#x new=%#x woke=%s" % (old, new, woke)


def test_notify(work):
    print("\n== notify.center (WIRE 6) with ipcbench notifyutil", flush=True)
    g = os.path.join(work, "g-notify")
    subprocess.run(["rm", "-rf", g])
    r = subprocess.run([IPCBENCH, "notifyutil", "--group", g, "--set", "com.t.level=18446744073709551615",
                        "--set", "com.t.small=258"], capture_output=True)
    fd, mm, size = center_open(g)
    check("notify: G/notify.center is 64 + 1024*128 bytes", size == 64 + 1024 * 128, "size %d" % size)
    magic_le, magic_be = struct.unpack_from("<I", mm, 0)[0], struct.unpack_from(">I", mm, 0)[0]
    check("notify: header magic 0x4E435452 ('NCTR') -- byte order?", 0x4E435452 in (magic_le, magic_be),
          "first 16 bytes %s; as LE %#x, as BE %#x" % (bytes(mm[0:16]).hex(" "), magic_le, magic_be))
    off = center_find(mm, "com.t.small")
    if check("notify: slot for com.t.small found by FNV-1a 32 linear probing from tag mod 1024", off is not None):
        print("   slot:", bytes(mm[off:off + 32]).hex(" "))
        st_le = struct.unpack_from("<Q", mm, off + 8)[0]
        check("notify: state u64 at slot+8 (little-endian, as the store) = 258", st_le == 258, "LE %d BE %d" % (st_le, struct.unpack_from(">Q", mm, off + 8)[0]))
    # Python sets state, ipcbench reads
    off = center_find(mm, "com.t.level")
    if off is not None:
        struct.pack_into("<Q", mm, off + 8, 12345)
        r = subprocess.run([IPCBENCH, "notifyutil", "--group", g, "--get", "com.t.level"], capture_output=True)
        check("notify: state written by Python read by notifyutil --get", b"12345" in r.stdout, repr(r.stdout + r.stderr))
    # ipcbench waits, Python posts (a name Python claims itself)
    w = subprocess.Popen([IPCBENCH, "notifyutil", "--group", g, "--wait", "com.t.py-posted", "--timeout", "5"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ready = w.stdout.readline()
    time.sleep(0.2)
    res = notify_post(g, "com.t.py-posted")
    try:
        out, err = w.communicate(timeout=8)
    except subprocess.TimeoutExpired:
        w.kill(); out, err = w.communicate()
    check("notify: notifyutil --wait wakes on a Python post (counter+1, FUTEX_WAKE if bit 31 set)", w.returncode == 0,
          "ready=%r post: %s rc=%s out=%r err=%r" % (ready, res, w.returncode, out, err[:200]))
    # ipcbench posts, Python sees the counter move
    off = center_find(mm, "com.t.py-posted")
    before = struct.unpack_from("<I", mm, off + 4)[0]
    subprocess.run([IPCBENCH, "notifyutil", "--group", g, "--post", "com.t.py-posted", "--count", "3"], capture_output=True)
    after = struct.unpack_from("<I", mm, off + 4)[0]
    check("notify: notifyutil --post --count 3 moves the counter by 3", ((after & 0x7FFFFFFF) - (before & 0x7FFFFFFF)) % (1 << 31) == 3,
          "before %#x after %#x" % (before, after))
    mm.close(); os.close(fd)


# ---------------------------------------------------------------------------------------------
# notify transport (WIRE 6): memfd store + eventfd bells, handed over the rendezvous socket
import fcntl


class NotifyClient:
    HDR = 4096

    def __init__(self, group, endpoint, C=65536, hello=None, seal=True, fds=None):
        self.C = C
        size = self.HDR + 2 * C
        self.memfd = os.memfd_create("py-notify", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        os.ftruncate(self.memfd, size)
        if seal:
            fcntl.fcntl(self.memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        self.mm = mmap.mmap(self.memfd, size)
        mm = self.mm
        struct.pack_into("<IIIII", mm, 4, 3, os.getpid(), 0, 0, C)     # version, client pid, server pid, state, C
        for base in (64, 128):
            struct.pack_into("<QQII", mm, base, 0, 0, 1, 0)             # reader waiting = 1 (creator initialises)
        struct.pack_into("<I", mm, 0, 0x4E544659)                       # magic last
        self.server_bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.client_bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.path.join(group, endpoint + ".rendezvous"))
        hello = hello if hello is not None else struct.pack("<IIII", 0x4E544659, 3, C, 0)
        socket.send_fds(s, [hello], fds if fds is not None else [self.memfd, self.server_bell, self.client_bell])
        st = recv_exact(s, 4, 7)
        self.status = struct.unpack("<I", st)[0]
        s.close()
        os.close(self.memfd)
        self.epoll = select.epoll()
        self.epoll.register(self.client_bell, select.EPOLLIN | select.EPOLLET)
        self.rbuf = bytearray()

    # ring helpers: c2s at 64 / data 4096, s2c at 128 / data 4096 + C
    def _ring(self, which):
        return (64, self.HDR) if which == "c2s" else (128, self.HDR + self.C)

    def ring(self, fd):
        try:
            os.eventfd_write(fd, 1)
        except BlockingIOError:
            pass

    def state(self):
        return struct.unpack_from("<I", self.mm, 16)[0]

    def server_pid(self):
        return struct.unpack_from("<I", self.mm, 12)[0]

    def wait(self, timeout):
        self.epoll.poll(timeout)

    def write(self, data, timeout=10):
        base, dbase = self._ring("c2s")
        C, mm = self.C, self.mm
        deadline = time.monotonic() + timeout
        pos = 0
        while pos < len(data):
            w, r = struct.unpack_from("<QQ", mm, base)
            room = C - (w - r)
            need = len(data) - pos
            if len(data) <= C and room < len(data):       # whole or not at all
                n = 0
            else:
                n = min(room, need)
            if n == 0:
                struct.pack_into("<I", mm, base + 20, 1)    # writer waiting
                w, r = struct.unpack_from("<QQ", mm, base)
                if C - (w - r) < min(len(data), C) and C - (w - r) == 0 or (len(data) <= C and C - (w - r) < len(data)):
                    if time.monotonic() > deadline:
                        raise TimeoutError("sendTimeout")
                    self.wait(0.05)
                continue
            i = w % C
            first = min(n, C - i)
            mm[dbase + i:dbase + i + first] = data[pos:pos + first]
            if n > first:
                mm[dbase:dbase + n - first] = data[pos + first:pos + n]
            struct.pack_into("<Q", mm, base, w + n)         # publish (x86: stores are ordered)
            pos += n
            rw = struct.unpack_from("<I", mm, base + 16)[0]
            struct.pack_into("<I", mm, base + 16, 0)
            if rw:
                self.ring(self.server_bell)
            else:
                self.ring(self.server_bell)    # Python has no SC fence: ring anyway (harmless extra wake-up)

    def _pull(self):
        base, dbase = self._ring("s2c")
        C, mm = self.C, self.mm
        w, r = struct.unpack_from("<QQ", mm, base)
        if w < r or w - r > C:
            raise RuntimeError("malformedFrame: ring indexes w=%d r=%d" % (w, r))
        n = w - r
        if n:
            i = r % C
            first = min(n, C - i)
            self.rbuf += mm[dbase + i:dbase + i + first]
            if n > first:
                self.rbuf += mm[dbase:dbase + n - first]
            struct.pack_into("<Q", mm, base + 8, w)
            ww = struct.unpack_from("<I", mm, base + 20)[0]
            struct.pack_into("<I", mm, base + 20, 0)
            if ww:
                self.ring(self.server_bell)
        return n

    def read_frame(self, timeout=10):
        base, _ = self._ring("s2c")
        deadline = time.monotonic() + timeout
        while True:
            if len(self.rbuf) >= 20:
                n = struct.unpack(">I", self.rbuf[16:20])[0]
                if len(self.rbuf) >= 20 + n:
                    h = bytes(self.rbuf[:20]); p = bytes(self.rbuf[20:20 + n]); del self.rbuf[:20 + n]
                    assert h[:3] == b"IP\x01" and h[3] in (1, 2, 3, 4), h.hex()
                    m, c, _n = struct.unpack(">IQI", h[4:20])
                    return h[3], m, c, p
            if self._pull():
                continue
            if self.state() != 0:
                raise EOFError("peer closed the store (state %d)" % self.state())
            struct.pack_into("<I", self.mm, base + 16, 1)   # reader waiting
            if self._pull():
                continue
            if time.monotonic() > deadline:
                raise TimeoutError("receiveTimeout")
            self.wait(0.05)

    def close(self):
        struct.pack_into("<I", self.mm, 16, 2)
        self.ring(self.server_bell)


def test_notify_transport(work):
    print("\n== notify transport (WIRE 6) from Python", flush=True)
    peer = Peer(os.path.join(work, "g-ntfy"), "echo", transport="notify")
    try:
        rv = os.path.join(peer.group, "echo.rendezvous")
        check("ntfy: rendezvous socket G/echo.rendezvous, mode 0600", os.path.exists(rv) and (os.stat(rv).st_mode & 0o777) == 0o600,
              str(sorted(os.listdir(peer.group))))
        nc = NotifyClient(peer.group, "echo")
        check("ntfy: hello answered 1 (accepted)", nc.status == 1, "status %d" % nc.status)
        check("ntfy: server wrote its pid at offset 12", nc.server_pid() == peer.pid, "%d vs %d" % (nc.server_pid(), peer.pid))
        corr = 100
        for n in SIZES:
            corr += 1
            pl = pattern(n, 5)
            nc.write(bin_encode(REQUEST, 1, corr, pl))
            k, m, c, p = nc.read_frame(30)
            check("ntfy: echo %d B through the rings (C=64 KiB)" % n, (k, m, c, p) == (REPLY, 1, corr, pl),
                  "kind=%d corr=%d len=%d" % (k, c, len(p)))
        nc.write(bin_encode(MESSAGE, 77, 0, b"one-way"))
        k, m, c, p = nc.read_frame()
        check("ntfy: one-way message echoed", (k, m, c, p) == (MESSAGE, 77, 0, b"one-way"))
        nc.close()
        time.sleep(0.3)
        # bad hello: wrong version -> status 3
        for label, kw in (("version 2 in hello", dict(hello=struct.pack("<IIII", 0x4E544659, 2, 65536, 0))),
                          ("unsealed memfd", dict(seal=False)),
                          ("C = 2048 (< 4096)", dict(C=2048))):
            try:
                bad = NotifyClient(peer.group, "echo", **kw)
                check("ntfy: %s -> answered 3" % label, bad.status == 3, "status %d" % bad.status)
            except Exception as e:
                check("ntfy: %s -> answered 3" % label, False, repr(e))
        # garbage frame in the ring -> connection ends (state 2 from the server)
        g2 = NotifyClient(peer.group, "echo")
        g2.write(b"XXXXXXXXXXXXXXXXXXXXXXXX")
        t0 = time.monotonic()
        while g2.state() == 0 and time.monotonic() - t0 < 3:
            g2.wait(0.05)
        check("ntfy: garbage in the ring -> server ends the connection (state 2)", g2.state() != 0, "state %d" % g2.state())
        nc2 = NotifyClient(peer.group, "echo")
        nc2.write(bin_encode(REQUEST, 1, 5, b"still"))
        check("ntfy: server still serves", nc2.read_frame()[3] == b"still")
        nc2.close()
    finally:
        peer.stop()
        err = peer.stderr_text().strip()
        if err:
            print("   peer stderr:", err[:500])


# ---------------------------------------------------------------------------------------------
def main():
    global IPCBENCH
    ap = argparse.ArgumentParser()
    ap.add_argument("--ipcbench", default=IPCBENCH)
    ap.add_argument("--work", default=None, help="folder for the peers' group directories (default: a new temporary one, removed at the end)")
    ap.add_argument("--only", default="binary,stall,http,llbsd,misc,refusal,wormhole,notify,ntfy")
    a = ap.parse_args()
    global WORK
    IPCBENCH = a.ipcbench
    if not os.access(IPCBENCH, os.X_OK):
        print("independent-client.py: no executable ipcbench at %s (build it: swift build -c release --product ipcbench)" % IPCBENCH, file=sys.stderr)
        return 66
    only = set(a.only.split(","))
    WORK = a.work or tempfile.mkdtemp(prefix="ipcbench-interop-")
    os.makedirs(WORK, exist_ok=True)
    peers = []
    try:
        if "binary" in only:
            p = Peer(os.path.join(WORK, "g-bin"), "echo"); peers.append(p)
            test_binary(p)
        if "stall" in only:
            test_stall(os.path.join(WORK, "g-stall"))
        if "http" in only:
            p = Peer(os.path.join(WORK, "g-http"), "echo", framing="http"); peers.append(p)
            test_http(p)
        if "llbsd" in only:
            p = Peer(os.path.join(WORK, "g-llbsd"), "echo", framing="llbsd"); peers.append(p)
            test_llbsd(p)
        if "misc" in only:
            test_misc(WORK)
        if "refusal" in only:
            test_refusal(WORK)
        if "notify" in only:
            test_notify(WORK)
        if "wormhole" in only:
            test_wormhole(WORK)
        if "ntfy" in only:
            test_notify_transport(WORK)
    finally:
        for p in peers:
            alive = p.p.poll() is None
            try:
                p.stop()
            except Exception as e:
                print("stop:", e)
            err = p.stderr_text().strip()
            print("\n-- peer %s (%s) alive at end: %s; stderr (%d lines):" % (p.endpoint, p.group, alive, len(err.splitlines())))
            for ln in err.splitlines()[:60]:
                print("   " + ln)
    npass = sum(1 for r in RESULTS if r[1] is True)
    nfail = sum(1 for r in RESULTS if r[1] is False)
    print("\nSUMMARY: %d passed, %d failed, %d notes" % (npass, nfail, sum(1 for r in RESULTS if r[1] is None)))
    for r in RESULTS:
        if r[1] is False:
            print("  FAIL", r[0], "--", r[2])
    if not a.work:
        shutil.rmtree(WORK, ignore_errors=True)
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
