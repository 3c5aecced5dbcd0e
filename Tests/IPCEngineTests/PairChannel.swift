import CIPCShims
import Foundation
import Glibc
import IPCCore
import IPCEngine
import Synchronization
import SystemPackage

/// An in-process ``EngineChannel`` over one end of a stream socketpair, with a framing of its
/// own (kind u8, msgid u32, correlation u64, payload length u32, all big-endian, then the
/// payload), so the engine is tested without any of the transports. The test drives the other
/// end with ``PairPeer``.
final class PairChannel: EngineChannel, @unchecked Sendable {
    // @unchecked: the read buffer is touched on the event loop's thread only (EngineChannel).
    static let headerLength = 17
    static let maximumPayloadLength = 1 << 20

    let descriptor: FileDescriptor
    private var buffer: [UInt8] = []
    /// Whether several frames go in one `send` (``write(_:from:)-(ArraySlice<Frame>,_)``);
    /// otherwise the channel keeps ``EngineChannel``'s default, a frame a call.
    let gathers: Bool
    /// ``EngineChannel/heldWriteLimit``: what sends on the loop's thread may hold back (0: none).
    let held: Int
    /// What the gathering writes did, for the tests to look at.
    struct Gathering {
        /// Every write call that sent something, of one frame or several.
        var writes = 0
        /// Calls given more than one frame, and the most frames one was given.
        var calls = 0
        var mostFrames = 0
        /// Calls that stopped inside a frame other than the first (a frame torn across calls).
        var tornInside = 0
        /// Calls that began inside their first frame (resuming a torn frame).
        var resumed = 0
    }
    let gathering = Mutex(Gathering())

    init(fd: CInt, gathers: Bool = false, held: Int = 0) {
        descriptor = FileDescriptor(rawValue: fd)
        self.gathers = gathers
        self.held = held
    }

    func readAvailable() throws -> Int? {
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        let count = recv(descriptor.rawValue, &chunk, chunk.count, CInt(MSG_DONTWAIT))
        if count < 0 {
            if errno == EAGAIN || errno == EINTR { return nil }
            if errno == ECONNRESET { return 0 }
            throw IPCError(code: .transportFailure, message: "recv failed: errno \(errno)")
        }
        buffer += chunk[0..<count]
        return count
    }

    func nextFrame() throws -> Frame? {
        guard buffer.count >= Self.headerLength else { return nil }
        guard let kind = Frame.Kind(rawValue: buffer[0]) else {
            throw IPCError(code: .malformedFrame, message: "unknown kind \(buffer[0])")
        }
        let msgid = buffer[1..<5].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        let correlation = buffer[5..<13].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        let length = Int(buffer[13..<17].reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
        guard length <= Self.maximumPayloadLength else {
            throw IPCError(code: .frameTooLarge, message: "a payload of \(length) bytes")
        }
        guard buffer.count >= Self.headerLength + length else { return nil }
        let payload = Array(buffer[Self.headerLength..<(Self.headerLength + length)])
        buffer.removeFirst(Self.headerLength + length)
        return Frame(kind: kind, msgid: msgid, correlation: correlation, payload: payload)
    }

    /// Lends in place from the read buffer, as a stream transport's reassembler does.
    func nextFrame(lending lend: (FrameHeader, UnsafeRawBufferPointer) -> Bool) throws -> ReassembledFrame? {
        guard buffer.count >= Self.headerLength else { return nil }
        let length = Int(buffer[13..<17].reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
        guard length <= Self.maximumPayloadLength, buffer.count >= Self.headerLength + length, let kind = Frame.Kind(rawValue: buffer[0]) else {
            return try nextFrame().map { .owned($0) }
        }
        let header = FrameHeader(
            kind: kind, msgid: buffer[1..<5].reduce(UInt32(0)) { $0 << 8 | UInt32($1) },
            correlation: buffer[5..<13].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }, payloadLength: length
        )
        let taken = buffer.withUnsafeBytes { lend(header, UnsafeRawBufferPointer(rebasing: $0[Self.headerLength..<(Self.headerLength + length)])) }
        guard taken else { return try nextFrame().map { .owned($0) } }
        buffer.removeFirst(Self.headerLength + length)
        return .lent
    }

    var hasPartialFrame: Bool { !buffer.isEmpty }

    func finishReading() throws {
        if !buffer.isEmpty { throw IPCError(code: .truncatedFrame, message: "\(buffer.count) bytes of a frame at the end of the stream") }
    }

    func encodedLength(of frame: Frame) throws -> Int {
        guard frame.payload.count <= Self.maximumPayloadLength else {
            throw IPCError(code: .payloadTooLarge, message: "\(frame.payload.count) bytes")
        }
        return Self.headerLength + frame.payload.count
    }

    func write(_ frame: Frame, from offset: Int) throws -> Int {
        let bytes = Self.encode(frame)
        let count = bytes[offset...].withUnsafeBytes { send(descriptor.rawValue, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT | MSG_NOSIGNAL)) }
        if count > 0 {
            gathering.withLock { $0.writes += 1 }
        }
        if count >= 0 { return count }
        if errno == EAGAIN || errno == EINTR { return 0 }
        if errno == EPIPE || errno == ECONNRESET { throw IPCError(code: .peerInvalidated, message: "the peer closed") }
        throw IPCError(code: .transportFailure, message: "send failed: errno \(errno)")
    }

    var gathersWrites: Bool { gathers }
    var heldWriteLimit: Int { held }

    func write(_ frames: ArraySlice<Frame>, from offset: Int) throws -> Int {
        guard frames.count > 1 else { return try write(frames.first!, from: offset) }
        let encoded = frames.map(Self.encode)
        let bytes = encoded.flatMap { $0 }
        let count = bytes[offset...].withUnsafeBytes { send(descriptor.rawValue, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT | MSG_NOSIGNAL)) }
        if count < 0 {
            if errno == EAGAIN || errno == EINTR { return 0 }
            if errno == EPIPE || errno == ECONNRESET { throw IPCError(code: .peerInvalidated, message: "the peer closed") }
            throw IPCError(code: .transportFailure, message: "send failed: errno \(errno)")
        }
        // Where the call stopped: inside a frame after the first, or not.
        var end = offset + count
        var index = 0
        while index < encoded.count, end >= encoded[index].count {
            end -= encoded[index].count
            index += 1
        }
        let stoppedInside = index > 0 && index < encoded.count && end > 0
        gathering.withLock {
            if count > 0 { $0.writes += 1 }
            $0.calls += 1
            $0.mostFrames = max($0.mostFrames, frames.count)
            if stoppedInside { $0.tornInside += 1 }
            if offset > 0 { $0.resumed += 1 }
        }
        return count
    }

    func shutdown() {
        _ = Glibc.shutdown(descriptor.rawValue, CInt(SHUT_RDWR))
    }

    func close() {
        _ = Glibc.close(descriptor.rawValue)
    }

    static func encode(_ frame: Frame) -> [UInt8] {
        var bytes: [UInt8] = [frame.kind.rawValue]
        withUnsafeBytes(of: frame.msgid.bigEndian) { bytes += $0 }
        withUnsafeBytes(of: frame.correlation.bigEndian) { bytes += $0 }
        withUnsafeBytes(of: UInt32(frame.payload.count).bigEndian) { bytes += $0 }
        return bytes + frame.payload
    }
}

/// The test's end of a ``PairChannel``: blocking writes and reads on the test's own thread.
final class PairPeer: @unchecked Sendable {
    // @unchecked: used by one test thread at a time.
    let fd: CInt
    private var buffer: [UInt8] = []

    init(fd: CInt) {
        self.fd = fd
    }

    /// A connected pair: the engine's end as a channel, and the peer's end.
    static func make(sendBuffer: Int? = nil, gathers: Bool = false, held: Int = 0) throws -> (PairChannel, PairPeer) {
        var fds: [CInt] = [0, 0]
        guard socketpair(AF_UNIX, CInt(SOCK_STREAM.rawValue) | CInt(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else {
            throw IPCError(code: .transportFailure, message: "socketpair failed: errno \(errno)")
        }
        if var size = sendBuffer.map(CInt.init) {
            for fd in fds {
                setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<CInt>.size))
                setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<CInt>.size))
            }
        }
        return (PairChannel(fd: fds[0], gathers: gathers, held: held), PairPeer(fd: fds[1]))
    }

    func send(_ frame: Frame) {
        sendRaw(PairChannel.encode(frame))
    }

    func sendRaw(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let count = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, CInt(MSG_NOSIGNAL)) }
            guard count > 0 else { return }
            offset += count
        }
    }

    /// The next frame, waiting at most `seconds`; `nil` at the end of the stream or on timeout.
    func readFrame(seconds: Double = 60) -> Frame? {
        let deadline = Double(monotonicNanoseconds()) / 1e9 + seconds
        while true {
            if buffer.count >= PairChannel.headerLength {
                let length = Int(buffer[13..<17].reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
                if buffer.count >= PairChannel.headerLength + length {
                    let frame = Frame(
                        kind: Frame.Kind(rawValue: buffer[0])!,
                        msgid: buffer[1..<5].reduce(UInt32(0)) { $0 << 8 | UInt32($1) },
                        correlation: buffer[5..<13].reduce(UInt64(0)) { $0 << 8 | UInt64($1) },
                        payload: Array(buffer[PairChannel.headerLength..<(PairChannel.headerLength + length)])
                    )
                    buffer.removeFirst(PairChannel.headerLength + length)
                    return frame
                }
            }
            let left = deadline - Double(monotonicNanoseconds()) / 1e9
            guard left > 0 else { return nil }
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, CInt(left * 1000) + 1) > 0 else { continue }
            var chunk = [UInt8](repeating: 0, count: 64 * 1024)
            let count = recv(fd, &chunk, chunk.count, 0)
            guard count > 0 else { return nil }
            buffer += chunk[0..<count]
        }
    }

    func close() {
        _ = Glibc.close(fd)
    }

    /// Ends the socket for both directions, whoever else holds it: a child process another
    /// test spawns at that moment holds a copy of every descriptor until its exec closes them
    /// (close-on-exec), and a `close` alone leaves the socket open that long.
    func shutdown() {
        _ = Glibc.shutdown(fd, CInt(SHUT_RDWR))
    }
}

func monotonicNanoseconds() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}

/// Runs `body` on a thread of its own (a peer's side of a test, which blocks).
func onThread(_ body: @escaping @Sendable () -> Void) {
    Thread.detachNewThread(body)
}

/// Runs a blocking `body` on a thread of its own and waits for its result without blocking a
/// thread of Swift's pool (tests run in parallel on a pool as small as the core count).
func blocking<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread.detachNewThread { continuation.resume(returning: body()) }
    }
}

/// An idle connection's channel: an eventfd that nobody signals, one descriptor per connection
/// (so that 10,000 of them fit the descriptor limit). It never reads or writes anything.
final class IdleChannel: EngineChannel, @unchecked Sendable {
    // @unchecked: immutable.
    let descriptor: FileDescriptor

    init() throws {
        let fd = eventfd(0, CInt(EFD_CLOEXEC) | CInt(EFD_NONBLOCK))
        guard fd >= 0 else { throw IPCError(code: .transportFailure, message: "eventfd failed: errno \(errno)") }
        descriptor = FileDescriptor(rawValue: fd)
    }

    func readAvailable() throws -> Int? { nil }
    func nextFrame() throws -> Frame? { nil }
    var hasPartialFrame: Bool { false }
    func finishReading() throws {}
    func encodedLength(of frame: Frame) throws -> Int { frame.payload.count }
    func write(_ frame: Frame, from offset: Int) throws -> Int {
        throw IPCError(code: .unsupportedOperation, message: "an idle channel carries nothing")
    }
    func shutdown() {}
    func close() { _ = Glibc.close(descriptor.rawValue) }
}

/// A channel that forwards to another but lends nothing of its own: the engine gets
/// `EngineChannel`'s default `nextFrame(lending:)`, as a third-party channel without it does.
final class NonLendingChannel: EngineChannel, @unchecked Sendable {
    // @unchecked: forwards to a channel with EngineChannel's own thread rules.
    private let base: PairChannel

    init(_ base: PairChannel) { self.base = base }

    var descriptor: FileDescriptor { base.descriptor }
    func readAvailable() throws -> Int? { try base.readAvailable() }
    func nextFrame() throws -> Frame? { try base.nextFrame() }
    var hasPartialFrame: Bool { base.hasPartialFrame }
    func finishReading() throws { try base.finishReading() }
    func encodedLength(of frame: Frame) throws -> Int { try base.encodedLength(of: frame) }
    func write(_ frame: Frame, from offset: Int) throws -> Int { try base.write(frame, from: offset) }
    func shutdown() { base.shutdown() }
    func close() { base.close() }
}
