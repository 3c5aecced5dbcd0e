import IPCCore
public import IPCEngine
import IPCFraming
import IPCSystem
import SystemPackage

/// One `AF_UNIX` stream connection, on either side: an ``EngineConnection`` over a
/// ``UnixSocketChannel``. The event loop reads it; sends write on the caller's thread when the
/// kernel takes the frame at once.
public typealias UnixSocketConnection = EngineConnection

/// What the engine needs of one `AF_UNIX` stream socket: non-blocking reads into a frame
/// reassembler, and gathering writes of header and payload.
final class UnixSocketChannel: EngineChannel, @unchecked Sendable {
    // @unchecked: the reassembler and `polled` are used on the event loop's thread only, and the header
    // buffer by one writer at a time (EngineChannel's contract); everything else is immutable.
    // For the same reasons the two variables go without dynamic exclusivity checks.

    let descriptor: FileDescriptor
    private let encoding: Encoding
    private let reassembler: any FrameReassembling
    /// The HTTP encoder's header for the frame being written, encoded again into the same
    /// storage each time (``write(_:from:)`` runs on one thread at a time).
    @exclusivity(unchecked) private var headerBuffer: [UInt8] = []

    /// Each framing's encoder by its concrete type, so no call goes through an existential (an
    /// existential encoder's generic `withEncodedHeader` instantiates type metadata at run time on
    /// every call, twice a frame). The binary header is built by value; an HTTP header is encoded
    /// into ``headerBuffer``, and its length computed without encoding it.
    private enum Encoding {
        case binary(BinaryFrameEncoder)
        case http(HTTPFrameEncoder)
    }

    init(fd: FileDescriptor, framing: Framing, maximumPayloadLength: Int) {
        descriptor = fd
        switch framing {
        case .binary: encoding = .binary(BinaryFrameEncoder(maximumPayloadLength: maximumPayloadLength))
        case .http: encoding = .http(HTTPFrameEncoder(maximumPayloadLength: maximumPayloadLength))
        case .llbsd: encoding = .http(HTTPFrameEncoder(maximumPayloadLength: maximumPayloadLength, llbsdCompatible: true))
        }
        reassembler = framing.makeReassembler(maximumPayloadLength: maximumPayloadLength)
    }

    func readAvailable() throws -> Int? {
        try polled.take { try readNow() }
    }

    /// A non-blocking read into the reassembler: the count, 0 at the end, `nil` if nothing was there.
    private func readNow() throws -> Int? {
        let fd = descriptor
        let count = try reassembler.receive { buffer in try UnixSocket.readIfReady(fd, into: buffer) ?? -1 }
        return count < 0 ? nil : count
    }

    /// What ``pollWhileSpinning()`` read, for the next ``readAvailable()``.
    @exclusivity(unchecked) private var polled = PolledRead()

    func startPollingWhileSpinning() -> Bool { true }

    /// Reads as ``readAvailable()`` does and keeps the outcome (the count, or the error) for
    /// it: when a message arrives, one `recv` finds it, as a spinning C reader's does.
    func pollWhileSpinning() -> Bool {
        polled.poll { try readNow() }
    }

    func nextFrame() throws -> Frame? {
        try reassembler.nextFrame()
    }

    func nextFrame(lending lend: (FrameHeader, UnsafeRawBufferPointer) -> Bool) throws -> ReassembledFrame? {
        try reassembler.nextFrame(lending: lend)
    }

    var hasPartialFrame: Bool { reassembler.bufferedByteCount > 0 }

    func finishReading() throws {
        try reassembler.finish()
    }

    func encodedLength(of frame: Frame) throws -> Int {
        switch encoding {
        case .binary(let encoder):
            _ = try encoder.headerBytes(FrameHeader(frame))
            return BinaryFrameHeaderBytes.count + frame.payload.count
        case .http(let encoder):
            return try encoder.encodedHeaderLength(FrameHeader(frame)) + frame.payload.count
        }
    }

    func write(_ frame: Frame, from offset: Int) throws -> Int {
        let fd = descriptor
        switch encoding {
        case .binary(let encoder):
            var header = try encoder.headerBytes(FrameHeader(frame))
            return try withUnsafeBytes(of: &header.storage) { raw in
                try frame.payload.withUnsafeBytes { payload in
                    try UnixSocket.writeIfReady(fd, header: UnsafeRawBufferPointer(rebasing: raw[..<BinaryFrameHeaderBytes.count]), payload: payload, from: offset)
                }
            }
        case .http(let encoder):
            headerBuffer.removeAll(keepingCapacity: true)
            try encoder.encodeHeader(FrameHeader(frame), into: &headerBuffer)
            return try headerBuffer.withUnsafeBytes { header in
                try frame.payload.withUnsafeBytes { payload in
                    try UnixSocket.writeIfReady(fd, header: header, payload: payload, from: offset)
                }
            }
        }
    }

    var gathersWrites: Bool { true }

    /// The frames one after another in one gathering `sendmsg`: each frame's header and payload
    /// are two of its segments, the headers encoded into one buffer first.
    func write(_ frames: ArraySlice<Frame>, from offset: Int) throws -> Int {
        guard frames.count > 1 else { return try frames.first.map { try write($0, from: offset) } ?? 0 }
        let fd = descriptor
        let count = frames.count
        return try withUnsafeTemporaryAllocation(of: UnsafeRawBufferPointer.self, capacity: 2 * count) { segments in
            switch encoding {
            case .binary(let encoder):
                let size = BinaryFrameHeaderBytes.count
                return try withUnsafeTemporaryAllocation(byteCount: size * count, alignment: 8) { headers in
                    for (index, frame) in frames.enumerated() {
                        let header = try encoder.headerBytes(FrameHeader(frame))
                        withUnsafeBytes(of: header.storage) { raw in
                            UnsafeMutableRawBufferPointer(rebasing: headers[(index * size)...]).copyMemory(from: UnsafeRawBufferPointer(rebasing: raw[..<size]))
                        }
                        segments[2 * index] = UnsafeRawBufferPointer(rebasing: headers[(index * size)..<((index + 1) * size)])
                    }
                    return try withPayloads(frames, frames.startIndex, into: segments) {
                        try UnixSocket.writeIfReady(fd, segments: UnsafeBufferPointer(segments), from: offset)
                    }
                }
            case .http(let encoder):
                headerBuffer.removeAll(keepingCapacity: true)
                var ends: [Int] = []
                ends.reserveCapacity(count)
                for frame in frames {
                    try encoder.encodeHeader(FrameHeader(frame), into: &headerBuffer)
                    ends.append(headerBuffer.count)
                }
                return try headerBuffer.withUnsafeBytes { headers in
                    var start = 0
                    for (index, end) in ends.enumerated() {
                        segments[2 * index] = UnsafeRawBufferPointer(rebasing: headers[start..<end])
                        start = end
                    }
                    return try withPayloads(frames, frames.startIndex, into: segments) {
                        try UnixSocket.writeIfReady(fd, segments: UnsafeBufferPointer(segments), from: offset)
                    }
                }
            }
        }
    }

    /// Puts each frame's payload after its header in `segments`, valid while `body` runs (one
    /// `withUnsafeBytes` a frame, nested).
    private func withPayloads<R>(
        _ frames: ArraySlice<Frame>, _ index: Int, into segments: UnsafeMutableBufferPointer<UnsafeRawBufferPointer>, _ body: () throws -> R
    ) throws -> R {
        guard index < frames.endIndex else { return try body() }
        return try frames[index].payload.withUnsafeBytes { payload in
            segments[2 * (index - frames.startIndex) + 1] = payload
            return try withPayloads(frames, index + 1, into: segments, body)
        }
    }

    func shutdown() {
        UnixSocket.shutdown(descriptor)
    }

    func close() {
        try? descriptor.close()
    }
}
