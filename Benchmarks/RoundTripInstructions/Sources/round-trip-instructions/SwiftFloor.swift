// The Swift floor: the least a Swift program does for the same round trip, to tell the engine's
// own instructions from what any async Swift client must spend (Scripts/instructions.sh, the
// "floor:" rows; docs/ENGINE.md, "What it costs").
//
// - `FloorClient`: an `async` request on a task executor of its own (`FloorLoop`), as the engine's client
//   makes it, with nothing else: one thread that runs the executor's jobs and waits in
//   `epoll_wait` for the socket (and for an eventfd that other threads ring when they enqueue),
//   one request outstanding, no request table, no timeouts, no write queue. A request writes its
//   frame (one `send` of a copy when small, as the engine does), suspends on a continuation, and is resumed by the loop
//   once the reply frame is read; the reply is a new `[UInt8]`, as `request` returns. With
//   `cancellable`, the await is also inside a cancellation handler, as a request that can be
//   cancelled must be (`_unsafeInheritExecutor_withTaskCancellationHandler`, as the engine's
//   request table: no switch to an isolation on the way in and out).
// - `runFloorServer`: a synchronous epoll echo server, the engine's on-loop handler without the
//   engine: it waits in `epoll_wait`, reads a request frame and writes its reply. With
//   `handingOff`, the default async handler without the engine: the loop hands each request to
//   one kept task on a serving thread of its own (a task executor that sleeps in a blocking
//   eventfd read), which calls an async handler closure and writes the reply; the C floor that
//   does the same is `unix-stream+epoll+handoff`.
//
// Both speak binary framing (docs/WIRE-FORMAT.md, section 2), so each can face the engine's
// side: the floor client the engine's server, the engine's client the floor server.
//
// With `ROUND_TRIP_SPIN` set (``floorSpins``), both spin instead of waiting, as
// `floor:unix-stream+spin` does: the client's loop, with no job to run, tries a `recv` that does
// not wait (`MSG_DONTWAIT`) again and again; the server does the same for requests. Neither ever
// sleeps (the pair runs only while it is measured, one process on each core).
import CFloorSystem
import Foundation
import Glibc
import Synchronization

/// Binary framing's 20-byte header (docs/WIRE-FORMAT.md, 2.1).
struct FloorHeader {
    static let count = 20
    var kind: UInt8
    var msgid: UInt32
    var correlation: UInt64
    var length: UInt32

    func write(to bytes: UnsafeMutableRawBufferPointer) {
        bytes[0] = 0x49
        bytes[1] = 0x50
        bytes[2] = 1
        bytes[3] = kind
        bytes.storeBytes(of: msgid.bigEndian, toByteOffset: 4, as: UInt32.self)
        bytes.storeBytes(of: correlation.bigEndian, toByteOffset: 8, as: UInt64.self)
        bytes.storeBytes(of: length.bigEndian, toByteOffset: 16, as: UInt32.self)
    }

    /// The header at the start of `bytes`, or `nil` if it is not a version-1 header of a known kind.
    init?(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count >= Self.count, bytes[0] == 0x49, bytes[1] == 0x50, bytes[2] == 1, (1...4).contains(bytes[3]) else { return nil }
        kind = bytes[3]
        msgid = UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self))
        correlation = UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
        length = UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: 16, as: UInt32.self))
    }

    init(kind: UInt8, msgid: UInt32, correlation: UInt64, length: UInt32) {
        self.kind = kind
        self.msgid = msgid
        self.correlation = correlation
        self.length = length
    }
}

struct FloorError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
    static func errno(_ call: String) -> FloorError { FloorError("\(call) failed: errno \(Glibc.errno)") }
}

/// A `sockaddr_un` for `path`.
/// - Throws: if the path does not fit.
func floorAddress(_ path: String) throws -> sockaddr_un {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { throw FloorError("socket path too long (\(bytes.count) bytes): \(path)") }
    withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
    return address
}

/// A stream socket connected to the unix-socket endpoint at `path`. A server may have made its
/// socket file before it listens (the engine's binds, then listens): a refused or missing
/// socket is tried again for up to 30 s.
func floorConnect(path: String) throws -> CInt {
    var address = try floorAddress(path)
    var waited = 0
    while true {
        let fd = socket(AF_UNIX, CInt(SOCK_STREAM.rawValue) | CInt(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw FloorError.errno("socket") }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        if result == 0 { return fd }
        let error = errno
        close(fd)
        guard error == ECONNREFUSED || error == ENOENT || error == EINTR, waited < 30_000 else {
            throw FloorError("connect to \(path) failed: errno \(error)")
        }
        usleep(1000)
        waited += 1
    }
}

/// Reads exactly `bytes.count` bytes from blocking `fd`; `false` at the end of the stream.
func floorReadFully(_ fd: CInt, _ bytes: UnsafeMutableRawBufferPointer) throws -> Bool {
    var done = 0
    while done < bytes.count {
        let got = read(fd, bytes.baseAddress! + done, bytes.count - done)
        if got == 0 { return false }
        if got < 0 {
            if errno == EINTR { continue }
            throw FloorError.errno("read")
        }
        done += got
    }
    return true
}

/// The largest frame (header and payload) written from one contiguous copy with one `send`, as
/// the engine's unix-socket channel (`UnixSocketChannel.coalescedFrameLimit`) and the C stream
/// floors (`NF_COALESCED_LIMIT`) write it: on Linux a `sendmsg` or `writev` costs the kernel more
/// for every segment (docs/ENGINE.md, "Sending").
let floorCoalescedLimit = 3_584

/// A writer's buffer of ``floorCoalescedLimit`` bytes, for one thread at a time.
func makeFloorScratch() -> UnsafeMutableRawBufferPointer {
    UnsafeMutableRawBufferPointer.allocate(byteCount: floorCoalescedLimit, alignment: 16)
}

/// Writes a frame whole: a small one copied into `scratch` with one `send`, a larger one as
/// header and payload with one `writev` and then whatever it left.
func floorWrite(_ fd: CInt, header: FloorHeader, payload: UnsafeRawBufferPointer, scratch: UnsafeMutableRawBufferPointer) throws {
    let total = FloorHeader.count + payload.count
    header.write(to: scratch)
    if total <= scratch.count {
        if payload.count > 0 { UnsafeMutableRawBufferPointer(rebasing: scratch[FloorHeader.count...]).copyMemory(from: payload) }
        var done = 0
        while done < total {
            let got = send(fd, scratch.baseAddress! + done, total - done, CInt(MSG_NOSIGNAL))
            if got < 0 {
                if errno == EINTR { continue }
                throw FloorError.errno("send")
            }
            done += got
        }
        return
    }
    let head = UnsafeMutableRawBufferPointer(rebasing: scratch[..<FloorHeader.count])
    var vectors = (
        iovec(iov_base: head.baseAddress, iov_len: head.count),
        iovec(iov_base: UnsafeMutableRawPointer(mutating: payload.baseAddress), iov_len: payload.count)
    )
    let wrote = withUnsafeMutableBytes(of: &vectors) { writev(fd, $0.baseAddress!.assumingMemoryBound(to: iovec.self), 2) }
    guard wrote >= 0 else { throw FloorError.errno("writev") }
    var done = wrote
    // A short write: the rest, byte-exact.
    while done < total {
        let got = done < head.count
            ? write(fd, head.baseAddress! + done, head.count - done)
            : write(fd, payload.baseAddress! + (done - head.count), total - done)
        if got < 0 {
            if errno == EINTR { continue }
            throw FloorError.errno("write")
        }
        done += got
    }
}

/// Whether the floor's two sides spin (`ROUND_TRIP_SPIN` set) instead of waiting in `epoll_wait`.
let floorSpins = getenv("ROUND_TRIP_SPIN") != nil

/// A task executor on one thread that waits in `epoll_wait`: it runs the jobs of the tasks that
/// prefer it and hands the events of every descriptor it watches to ``run(_:)``'s handler. A
/// thread that enqueues a job while the loop sleeps rings an eventfd the loop watches too.
final class FloorLoop: TaskExecutor, @unchecked Sendable {
    // @unchecked: `jobs` is behind a Mutex and `sleeping`, `stopped` are atomics; `draining` is
    // the loop's thread's only.
    private let epoll: CInt
    private let wake: CInt
    private let jobs = Mutex<[UnownedJob]>([])
    private let sleeping = Atomic<Bool>(false)
    private let stopped = Atomic<Bool>(false)
    private var draining: [UnownedJob] = []

    init() throws {
        epoll = epoll_create1(CInt(EPOLL_CLOEXEC))
        wake = eventfd(0, CInt(EFD_CLOEXEC))
        guard epoll >= 0, wake >= 0 else {
            let error = FloorError.errno("epoll_create1 or eventfd")
            for descriptor in [epoll, wake] where descriptor >= 0 { close(descriptor) }
            throw error
        }
        try watch(wake, for: EPOLLIN.rawValue, adding: true)
    }

    /// Watches `descriptor` for `events` (epoll's bits), adding it or changing what it is watched for.
    func watch(_ descriptor: CInt, for events: UInt32, adding: Bool) throws {
        var event = epoll_event()
        event.events = events
        event.data.fd = descriptor
        guard epoll_ctl(epoll, adding ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, descriptor, &event) == 0 else { throw FloorError.errno("epoll_ctl") }
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        jobs.withLock { $0.append(job) }
        if sleeping.exchange(false, ordering: .sequentiallyConsistent) { ring() }
    }

    private func ring() {
        var one: UInt64 = 1
        _ = Glibc.write(wake, &one, 8)
    }

    func stop() {
        stopped.store(true, ordering: .sequentiallyConsistent)
        ring()
    }

    /// Runs jobs, and gives `handle` each event of a watched descriptor, until ``stop()``; call
    /// on the thread that is to be the loop's. With `spinning`, never waits: a round with no job
    /// calls `poll` instead, which reads without waiting.
    func run(spinning poll: (() throws -> Void)? = nil, _ handle: (epoll_event) throws -> Void) throws {
        var events = (epoll_event(), epoll_event())
        while !stopped.load(ordering: .sequentiallyConsistent) {
            if let poll {
                jobs.withLock { swap(&$0, &draining) }
                if draining.isEmpty {
                    try poll()
                    floor_pause()
                    continue
                }
                for job in draining { job.runSynchronously(on: asUnownedTaskExecutor()) }
                draining.removeAll(keepingCapacity: true)
                continue
            }
            jobs.withLock { swap(&$0, &draining) }
            if !draining.isEmpty {
                for job in draining { job.runSynchronously(on: asUnownedTaskExecutor()) }
                draining.removeAll(keepingCapacity: true)
                continue
            }
            sleeping.store(true, ordering: .sequentiallyConsistent)
            // A job enqueued before `sleeping` was set rings nobody: look once more.
            if jobs.withLock({ !$0.isEmpty }) {
                sleeping.store(false, ordering: .sequentiallyConsistent)
                continue
            }
            let count = withUnsafeMutableBytes(of: &events) { epoll_wait(epoll, $0.baseAddress!.assumingMemoryBound(to: epoll_event.self), 2, -1) }
            sleeping.store(false, ordering: .sequentiallyConsistent)
            if count < 0 {
                if errno == EINTR { continue }
                throw FloorError.errno("epoll_wait")
            }
            for index in 0..<Int(count) {
                let event = withUnsafeBytes(of: &events) { $0.load(fromByteOffset: index * MemoryLayout<epoll_event>.stride, as: epoll_event.self) }
                if event.data.fd == wake {
                    var value: UInt64 = 0
                    _ = read(wake, &value, 8)
                } else {
                    try handle(event)
                }
            }
        }
    }

    deinit {
        close(epoll)
        close(wake)
    }
}

/// The minimal async client: requests from a task on a ``FloorLoop`` of its own, which reads the replies.
final class FloorClient: @unchecked Sendable {
    // @unchecked: every field but `loop` is touched on the loop's thread only (the task runs there).
    let loop: FloorLoop
    private let fd: CInt
    private var waiting: UnsafeContinuation<[UInt8], any Error>?
    private var waitingCorrelation: UInt64 = 0
    private var buffer: [UInt8]
    private var buffered = 0
    private let scratch = makeFloorScratch()

    init(path: String, maximumPayload: Int) throws {
        do {
            loop = try FloorLoop()
            fd = try floorConnect(path: path)
        } catch {
            scratch.deallocate()
            throw error
        }
        buffer = [UInt8](repeating: 0, count: FloorHeader.count + maximumPayload)
        try loop.watch(fd, for: EPOLLIN.rawValue, adding: true)
    }

    /// Runs the loop on the calling thread until ``FloorLoop/stop()``; spinning with
    /// ``floorSpins``.
    func run() throws {
        try loop.run(spinning: floorSpins ? { try self.readReply() } : nil) { _ in try readReply() }
    }

    /// Reads what the socket has (without waiting when spinning); a whole reply frame resumes
    /// the waiting request.
    private func readReply() throws {
        let got = buffer.withUnsafeMutableBytes { bytes in
            floorSpins ? recv(fd, bytes.baseAddress! + buffered, bytes.count - buffered, CInt(MSG_DONTWAIT)) : read(fd, bytes.baseAddress! + buffered, bytes.count - buffered)
        }
        guard got > 0 else {
            let error = errno
            if got < 0, error == EINTR || error == EAGAIN { return }
            throw fail(got == 0 ? FloorError("the server closed the connection") : FloorError("read failed: errno \(error)"))
        }
        buffered += got
        guard buffered >= FloorHeader.count else { return }
        let header = buffer.withUnsafeBytes { FloorHeader(UnsafeRawBufferPointer(rebasing: $0[..<FloorHeader.count])) }
        guard let header, header.kind == 3, Int(header.length) <= buffer.count - FloorHeader.count else {
            throw fail(FloorError("not a reply frame this client can hold"))
        }
        let total = FloorHeader.count + Int(header.length)
        guard buffered >= total else { return }
        guard buffered == total, let continuation = waiting, header.correlation == waitingCorrelation else {
            throw fail(FloorError("a reply nobody waits for (correlation \(header.correlation))"))
        }
        waiting = nil
        buffered = 0
        continuation.resume(returning: Array(buffer[FloorHeader.count..<total]))
    }

    /// Ends the waiting request with `error` (so its task does not wait for good) and returns it.
    private func fail(_ error: FloorError) -> FloorError {
        waiting?.resume(throwing: error)
        waiting = nil
        return error
    }

    /// Sends a request and waits for its reply; the task must run on ``loop``.
    func request(_ payload: [UInt8], msgid: UInt32, correlation: UInt64) async throws -> [UInt8] {
        try payload.withUnsafeBytes {
            try floorWrite(fd, header: FloorHeader(kind: 2, msgid: msgid, correlation: correlation, length: UInt32($0.count)), payload: $0, scratch: scratch)
        }
        return try await withUnsafeThrowingContinuation { continuation in
            waiting = continuation
            waitingCorrelation = correlation
        }
    }

    /// ``request(_:msgid:correlation:)`` inside a cancellation handler, as a request that can be
    /// cancelled awaits. (Nothing cancels here: what is counted is the handler's record.) The
    /// handler is the one the engine's `RequestTable` uses, without `withTaskCancellationHandler`'s
    /// isolation parameter and the two executor lookups it costs (558 instructions a round trip).
    func cancellableRequest(_ payload: [UInt8], msgid: UInt32, correlation: UInt64, cancelled: borrowing Atomic<Bool>) async throws -> [UInt8] {
        try await _unsafeInheritExecutor_withTaskCancellationHandler {
            try await request(payload, msgid: msgid, correlation: correlation)
        } onCancel: {
            cancelled.store(true, ordering: .relaxed)
        }
    }

    deinit {
        close(fd)
        scratch.deallocate()
    }
}

/// Makes `count` round trips of `size` bytes from a task on a ``FloorClient``'s loop, the
/// loop running on the calling thread.
func runFloorClient(path: String, count: Int, size: Int, cancellable: Bool) throws {
    let client = try FloorClient(path: path, maximumPayload: size)
    let failure = Mutex<(any Error)?>(nil)
    let cancelled = Atomic<Bool>(false)
    let payload = [UInt8](repeating: 0xA5, count: size)
    Task(executorPreference: client.loop) {
        var times = RoundTripTimes(count: count)
        do {
            for index in 0..<count {
                let start = RoundTripTimes.now()
                let correlation = UInt64(index + 1)
                let reply = cancellable
                    ? try await client.cancellableRequest(payload, msgid: 1, correlation: correlation, cancelled: cancelled)
                    : try await client.request(payload, msgid: 1, correlation: correlation)
                times.record(since: start)
                guard reply.count == size else { throw FloorError("the echo of \(size) bytes came back with \(reply.count)") }
            }
            times.report()
        } catch {
            failure.withLock { $0 = error }
        }
        client.loop.stop()
    }
    try client.run()
    if let error = failure.withLock({ $0 }) { throw error }
}

/// A serving thread: runs the jobs of the tasks that prefer it, and sleeps in a blocking read of
/// an eventfd that ``enqueue(_:)`` rings when it finds it asleep.
final class FloorServingThread: TaskExecutor, @unchecked Sendable {
    // @unchecked: `jobs` is behind a Mutex, `sleeping` and `stopped` are atomics, `draining` is
    // the serving thread's only.
    private let jobs = Mutex<[UnownedJob]>([])
    private let sleeping = Atomic<Bool>(false)
    private let stopped = Atomic<Bool>(false)
    private let wake: CInt
    private var draining: [UnownedJob] = []
    /// What the serving task failed with, if it did.
    let failure = Mutex<(any Error)?>(nil)
    /// Set when ``run()`` has returned.
    let finished = Atomic<Bool>(false)

    init() throws {
        wake = eventfd(0, CInt(EFD_CLOEXEC))
        guard wake >= 0 else { throw FloorError.errno("eventfd") }
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        jobs.withLock { $0.append(job) }
        if sleeping.exchange(false, ordering: .sequentiallyConsistent) { ring() }
    }

    private func ring() {
        var one: UInt64 = 1
        _ = Glibc.write(wake, &one, 8)
    }

    func stop() {
        stopped.store(true, ordering: .sequentiallyConsistent)
        ring()
    }

    /// Runs jobs until ``stop()``; call on the thread that is to serve.
    func run() {
        while !stopped.load(ordering: .sequentiallyConsistent) {
            jobs.withLock { swap(&$0, &draining) }
            if !draining.isEmpty {
                for job in draining { job.runSynchronously(on: asUnownedTaskExecutor()) }
                draining.removeAll(keepingCapacity: true)
                continue
            }
            sleeping.store(true, ordering: .sequentiallyConsistent)
            if jobs.withLock({ !$0.isEmpty }) || stopped.load(ordering: .sequentiallyConsistent) {
                sleeping.store(false, ordering: .sequentiallyConsistent)
                continue
            }
            var value: UInt64 = 0
            _ = read(wake, &value, 8)
        }
        finished.store(true, ordering: .sequentiallyConsistent)
    }

    deinit { close(wake) }
}

/// A request handed from the loop to the serving task.
struct FloorRequest: Sendable {
    var msgid: UInt32
    var correlation: UInt64
    var payload: [UInt8]
}

/// Requests from the loop to the serving task: each goes to the task if it waits, else waits
/// for it; `nil` ends the task.
final class FloorMailbox: @unchecked Sendable {
    private struct State {
        var requests: [FloorRequest?] = []
        var waiting: UnsafeContinuation<FloorRequest?, Never>?
    }
    // @unchecked: everything is behind the Mutex.
    private let state = Mutex(State())

    func post(_ request: FloorRequest?) {
        let waiting: UnsafeContinuation<FloorRequest?, Never>? = state.withLock { state in
            if let waiting = state.waiting {
                state.waiting = nil
                return waiting
            }
            state.requests.append(request)
            return nil
        }
        waiting?.resume(returning: request)
    }

    func next() async -> FloorRequest? {
        await withUnsafeContinuation { continuation in
            let ready: FloorRequest?? = state.withLock { state in
                if !state.requests.isEmpty { return .some(state.requests.removeFirst()) }
                state.waiting = continuation
                return .none
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}

/// Serves one client at `path` until it goes: echoes on the loop (synchronous), or, with
/// `handingOff`, from a kept task on a serving thread through an async handler closure.
func runFloorServer(path: String, handingOff: Bool) throws {
    let fd = try floorAccept(path: path)
    defer { close(fd) }
    let epoll = try floorEpoll(watching: fd)
    defer { close(epoll) }
    var buffer = [UInt8](repeating: 0, count: FloorHeader.count + (1 << 20))
    var buffered = 0
    // The loop's writes' (the serving task has its own).
    let scratch = makeFloorScratch()
    defer { scratch.deallocate() }
    // The hand-off: a serving thread, and one task on it that answers every request.
    let mailbox = FloorMailbox()
    let serving = handingOff ? try FloorServingThread() : nil
    if let serving {
        let handler: @Sendable (UInt32, [UInt8]) async throws -> [UInt8] = { _, payload in payload }
        Task(executorPreference: serving) {
            let scratch = makeFloorScratch()
            defer { scratch.deallocate() }
            do {
                while let request = await mailbox.next() {
                    let reply = try await handler(request.msgid, request.payload)
                    try reply.withUnsafeBytes {
                        try floorWrite(fd, header: FloorHeader(kind: 3, msgid: request.msgid, correlation: request.correlation, length: UInt32($0.count)), payload: $0, scratch: scratch)
                    }
                }
            } catch {
                serving.failure.withLock { $0 = error }
            }
            serving.stop()
        }
        Thread { serving.run() }.start()
    }
    // At the client's end: the task is told to finish, and what it failed with is this server's.
    defer {
        if let serving {
            mailbox.post(nil)
            while !serving.finished.load(ordering: .sequentiallyConsistent) { usleep(1000) }
        }
    }
    while true {
        if !floorSpins {
            var ready = epoll_event()
            let count = epoll_wait(epoll, &ready, 1, -1)
            if count < 0 {
                if errno == EINTR { continue }
                throw FloorError.errno("epoll_wait")
            }
        }
        let got = buffer.withUnsafeMutableBytes { bytes in
            floorSpins ? recv(fd, bytes.baseAddress! + buffered, bytes.count - buffered, CInt(MSG_DONTWAIT)) : read(fd, bytes.baseAddress! + buffered, bytes.count - buffered)
        }
        if got == 0 {
            if let serving {
                mailbox.post(nil)
                while !serving.finished.load(ordering: .sequentiallyConsistent) { usleep(1000) }
                if let error = serving.failure.withLock({ $0 }) { throw error }
            }
            return
        }
        if got < 0 {
            if errno == EINTR || errno == EAGAIN {
                if floorSpins { floor_pause() }
                continue
            }
            throw FloorError.errno("read")
        }
        buffered += got
        // Every whole request in the buffer, answered in order.
        var start = 0
        try buffer.withUnsafeBytes { bytes in
            while buffered - start >= FloorHeader.count {
                guard let header = FloorHeader(UnsafeRawBufferPointer(rebasing: bytes[start..<(start + FloorHeader.count)])), header.kind == 2,
                      Int(header.length) <= bytes.count - FloorHeader.count else { throw FloorError("not a request frame this server can hold") }
                let total = FloorHeader.count + Int(header.length)
                guard buffered - start >= total else { break }
                let payload = UnsafeRawBufferPointer(rebasing: bytes[(start + FloorHeader.count)..<(start + total)])
                if handingOff {
                    mailbox.post(FloorRequest(msgid: header.msgid, correlation: header.correlation, payload: Array(payload)))
                } else {
                    let reply = FloorHeader(kind: 3, msgid: header.msgid, correlation: header.correlation, length: header.length)
                    try floorWrite(fd, header: reply, payload: payload, scratch: scratch)
                }
                start += total
            }
        }
        if start > 0 {
            buffer.withUnsafeMutableBytes { $0.baseAddress!.copyMemory(from: $0.baseAddress! + start, byteCount: buffered - start) }
            buffered -= start
        }
    }
}

/// Each round trip's time, kept only when the environment sets `ROUND_TRIP_TIMES` (a timed run
/// outside valgrind; the counted runs read no clock). `report()` prints the median and the 99th
/// percentile on standard output.
struct RoundTripTimes {
    static let enabled = getenv("ROUND_TRIP_TIMES") != nil
    private var times: [UInt64] = []

    init(count: Int) {
        if Self.enabled { times.reserveCapacity(count) }
    }

    static func now() -> UInt64 {
        guard enabled else { return 0 }
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    mutating func record(since start: UInt64) {
        if Self.enabled { times.append(Self.now() - start) }
    }

    func report() {
        guard Self.enabled, !times.isEmpty else { return }
        let sorted = times.sorted()
        print("round trips \(sorted.count) p50 \(sorted[sorted.count / 2]) ns p99 \(sorted[sorted.count * 99 / 100]) ns")
    }
}
