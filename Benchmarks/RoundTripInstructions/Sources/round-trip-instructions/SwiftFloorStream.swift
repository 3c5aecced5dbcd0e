// The Swift floor of the one-way stream: the least a Swift program does for the engine's stream
// (`client … stream` against `serve … sink`), to tell what the engine spends at each wake-up from
// what any async Swift sender spends (docs/ENGINE.md, "Where the large streams' time goes").
//
// - `runFloorStreamClient`: a task on a task executor of its own (`FloorLoop`: one thread
//   waiting in `epoll_wait`, as `FloorClient`'s) sends each message with one `writev` of header
//   and payload on a non-blocking socket; when the socket is full it asks epoll for room and
//   suspends on a continuation until the loop sees it. Then one request, whose reply is the number of messages
//   the server took, as the engine's stream client checks it. No write queue, no held batches,
//   no timeouts.
// - `runFloorSink`: a synchronous epoll loop that reads as much as the socket has into one buffer
//   and counts the messages whole in it (binary framing, checked as the engine's decoder checks a
//   header), the engine's borrowing handler without the engine; it answers the request with the
//   count (8 bytes, big-endian).
//
// Both speak the engine's frames, so each side can face the engine's other side.
import CFloorSystem
import Foundation
import Glibc
import Synchronization

/// The stream's sending side: a task on a ``FloorLoop`` of its own, which wakes it when the
/// socket has room and reads the reply.
final class FloorStreamClient: @unchecked Sendable {
    // @unchecked: every field but `loop` is touched on the loop's thread only (the task runs there).
    let loop: FloorLoop
    private let fd: CInt
    /// The send waiting for room, and the request waiting for its reply.
    private var waitingForRoom: UnsafeContinuation<Void, any Error>?
    private var waitingForReply: UnsafeContinuation<UInt64, any Error>?
    private var reply = [UInt8](repeating: 0, count: FloorHeader.count + 8)
    private var replied = 0

    init(path: String) throws {
        loop = try FloorLoop()
        fd = try floorConnect(path: path)
        // Thrown from here on, the deinitializer closes the socket.
        guard fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0 else { throw FloorError.errno("fcntl") }
        try loop.watch(fd, for: EPOLLIN.rawValue, adding: true)
    }

    /// Runs the loop on the calling thread until ``FloorLoop/stop()``: wakes the sender when the
    /// socket has room, and reads the reply.
    func run() throws {
        try loop.run { event in
            if event.events & EPOLLOUT.rawValue != 0, let waiting = waitingForRoom {
                waitingForRoom = nil
                try loop.watch(fd, for: EPOLLIN.rawValue, adding: false)
                waiting.resume()
            }
            if event.events & (EPOLLIN.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue) != 0 { try readReply() }
        }
    }

    /// Reads the reply to the final request; a whole one resumes it.
    private func readReply() throws {
        let got = reply.withUnsafeMutableBytes { read(fd, $0.baseAddress! + replied, $0.count - replied) }
        guard got > 0 else {
            let error = errno
            if got < 0, error == EINTR || error == EAGAIN { return }
            throw fail(got == 0 ? FloorError("the server closed the connection") : FloorError("read failed: errno \(error)"))
        }
        replied += got
        guard replied == reply.count else { return }
        let header = reply.withUnsafeBytes { FloorHeader(UnsafeRawBufferPointer(rebasing: $0[..<FloorHeader.count])) }
        guard let header, header.kind == 3, header.length == 8, let waiting = waitingForReply else {
            throw fail(FloorError("not the reply this client waits for"))
        }
        waitingForReply = nil
        waiting.resume(returning: reply.withUnsafeBytes { UInt64(bigEndian: $0.loadUnaligned(fromByteOffset: FloorHeader.count, as: UInt64.self)) })
    }

    /// Ends whatever waits with `error` (so its task does not wait for good) and returns it.
    private func fail(_ error: FloorError) -> FloorError {
        waitingForRoom?.resume(throwing: error)
        waitingForReply?.resume(throwing: error)
        waitingForRoom = nil
        waitingForReply = nil
        return error
    }

    /// Writes one frame whole: one `writev` of header and payload, then, each time the socket is
    /// full, a wait for room and the rest. The task must run on ``loop``.
    func send(_ header: FloorHeader, _ payload: [UInt8]) async throws {
        var head = (UInt64(0), UInt64(0), UInt32(0))
        withUnsafeMutableBytes(of: &head) { header.write(to: $0) }
        let total = FloorHeader.count + payload.count
        var done = 0
        while done < total {
            // What is left of the header (perhaps nothing), then what is left of the payload.
            let (inHeader, inPayload) = (min(done, FloorHeader.count), max(0, done - FloorHeader.count))
            let wrote = withUnsafeMutableBytes(of: &head) { head in
                payload.withUnsafeBytes { payload in
                    var vectors = (
                        iovec(iov_base: head.baseAddress! + inHeader, iov_len: FloorHeader.count - inHeader),
                        iovec(iov_base: UnsafeMutableRawPointer(mutating: payload.baseAddress.map { $0 + inPayload }), iov_len: payload.count - inPayload)
                    )
                    return withUnsafeMutableBytes(of: &vectors) { writev(fd, $0.baseAddress!.assumingMemoryBound(to: iovec.self), 2) }
                }
            }
            if wrote >= 0 {
                done += wrote
                continue
            }
            let error = errno
            if error == EINTR { continue }
            guard error == EAGAIN else { throw FloorError("writev failed: errno \(error)") }
            try loop.watch(fd, for: EPOLLIN.rawValue | EPOLLOUT.rawValue, adding: false)
            try await withUnsafeThrowingContinuation { waitingForRoom = $0 }
        }
    }

    /// Sends the request that ends the stream and waits for the server's count.
    func requestCount() async throws -> UInt64 {
        try await send(FloorHeader(kind: 2, msgid: 1, correlation: 1, length: 0), [])
        return try await withUnsafeThrowingContinuation { waitingForReply = $0 }
    }

    deinit { close(fd) }
}

/// Sends `count` one-way messages of `size` bytes (msgid `streamMessage`) from a task on a
/// ``FloorStreamClient``'s loop, the loop running on the calling thread, then checks the
/// server's count. With `ROUND_TRIP_TIMES` set, prints the time from the first send to the reply.
func runFloorStreamClient(path: String, count: Int, size: Int) throws {
    let client = try FloorStreamClient(path: path)
    let failure = Mutex<(any Error)?>(nil)
    let payload = [UInt8](repeating: 0x5A, count: size)
    Task(executorPreference: client.loop) {
        do {
            let start = RoundTripTimes.now()
            let header = FloorHeader(kind: 1, msgid: streamMessage, correlation: 0, length: UInt32(size))
            for _ in 0..<count { try await client.send(header, payload) }
            let taken = try await client.requestCount()
            if RoundTripTimes.enabled { print("stream \(count) messages \(RoundTripTimes.now() - start) ns") }
            guard taken == UInt64(count) else { throw FloorError("the server took \(taken) messages of \(count)") }
        } catch {
            failure.withLock { $0 = error }
        }
        client.loop.stop()
    }
    try client.run()
    if let error = failure.withLock({ $0 }) { throw error }
}

/// Takes one client's stream at `path` until it goes: counts its one-way messages whole in the
/// read buffer and answers each request with the count so far.
func runFloorSink(path: String) throws {
    let fd = try floorAccept(path: path)
    defer { close(fd) }
    let epoll = try floorEpoll(watching: fd)
    defer { close(epoll) }
    // 1 MiB read through from front to back, a frame's first part moved to the front only when
    // the rest of it would not fit, as the engine's lending reassembler; but a frame of 256 KiB or
    // more is read alone into a buffer of its size (no read past its end, so nothing to move:
    // C's `stream-cost --frames`), where the engine's buffer grows to four such frames.
    var buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
    defer { buffer.deallocate() }
    let scratch = makeFloorScratch()
    defer { scratch.deallocate() }
    var (start, end) = (0, 0)
    var taken: UInt64 = 0
    /// The bytes of the frame at `start`: its header's, until the header is here.
    var needed = FloorHeader.count
    let alone = 256 << 10
    while true {
        var ready = epoll_event()
        let count = epoll_wait(epoll, &ready, 1, -1)
        if count < 0 {
            if errno == EINTR { continue }
            throw FloorError.errno("epoll_wait")
        }
        let room = needed >= alone ? min(buffer.count - end, needed - (end - start)) : buffer.count - end
        let got = read(fd, buffer.baseAddress! + end, room)
        if got == 0 { return }
        if got < 0 {
            if errno == EINTR || errno == EAGAIN { continue }
            throw FloorError.errno("read")
        }
        end += got
        while end - start >= FloorHeader.count {
            guard let header = FloorHeader(UnsafeRawBufferPointer(rebasing: buffer[start..<(start + FloorHeader.count)])), header.kind == 1 || header.kind == 2,
                  Int(header.length) <= 64 << 20 else { throw FloorError("not a frame this sink takes") }
            needed = FloorHeader.count + Int(header.length)
            guard end - start >= needed else { break }
            if header.kind == 1 {
                if header.msgid == streamMessage { taken += 1 }
            } else {
                try withUnsafeBytes(of: taken.bigEndian) { count in
                    try floorWrite(fd, header: FloorHeader(kind: 3, msgid: header.msgid, correlation: header.correlation, length: 8), payload: count, scratch: scratch)
                }
            }
            start += needed
            needed = FloorHeader.count
        }
        if start == end {
            (start, end) = (0, 0)
        } else if buffer.count - start < needed || buffer.count - end < min(needed - (end - start), 64 << 10) {
            // The rest of the frame will not fit behind it: a larger buffer, or its part to the front.
            let capacity = max(buffer.count, needed >= alone ? needed : 4 * needed)
            if capacity > buffer.count {
                let larger = UnsafeMutableRawBufferPointer.allocate(byteCount: capacity, alignment: 16)
                larger.baseAddress!.copyMemory(from: buffer.baseAddress! + start, byteCount: end - start)
                buffer.deallocate()
                buffer = larger
            } else {
                // Overlapping regions: copyMemory is memmove.
                buffer.baseAddress!.copyMemory(from: buffer.baseAddress! + start, byteCount: end - start)
            }
            (start, end) = (0, end - start)
        }
    }
}

/// An epoll instance watching `fd` for input.
func floorEpoll(watching fd: CInt) throws -> CInt {
    let epoll = epoll_create1(CInt(EPOLL_CLOEXEC))
    guard epoll >= 0 else { throw FloorError.errno("epoll_create1") }
    var event = epoll_event()
    event.events = EPOLLIN.rawValue
    event.data.fd = fd
    guard epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event) == 0 else {
        let error = FloorError.errno("epoll_ctl")
        close(epoll)
        throw error
    }
    return epoll
}

/// Listens at `path` (bound under a temporary name and renamed, so a client never finds a socket
/// that does not listen yet) and returns its first connection.
func floorAccept(path: String) throws -> CInt {
    let listener = socket(AF_UNIX, CInt(SOCK_STREAM.rawValue) | CInt(SOCK_CLOEXEC.rawValue), 0)
    guard listener >= 0 else { throw FloorError.errno("socket") }
    defer { close(listener) }
    let temporary = path + ".binding"
    _ = try floorAddress(path)
    var bindAddress = try floorAddress(temporary)
    let bound = withUnsafePointer(to: &bindAddress) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    guard bound == 0, listen(listener, 1) == 0, rename(temporary, path) == 0 else { throw FloorError.errno("bind, listen or rename") }
    defer { unlink(path) }
    let fd = accept(listener, nil, nil)
    guard fd >= 0 else { throw FloorError.errno("accept") }
    return fd
}
