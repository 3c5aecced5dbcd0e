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
    /// A frame of at most ``coalescedFrameLimit`` bytes is copied here whole and written with
    /// one `send`, made at its first such frame; nil until then. Used by one writer at a time,
    /// as ``headerBuffer`` is.
    @exclusivity(unchecked) private var coalesced: UnsafeMutableRawBufferPointer?

    /// The largest frame (header and payload) written from one contiguous copy instead of as a
    /// header and a payload segment. On this repository's VM (Linux 6.18), a `send` of one buffer
    /// cost 470–850 ns less per 64-byte message than a `sendmsg` of the same bytes in two
    /// segments, and still less for frames up to 3.7 KB; from 4 KiB on, where the kernel puts part
    /// of the data in pages, the two cost the same (docs/ENGINE.md, "Sending";
    /// Benchmarks/SendSegments). Below that, the copy costs far less than it saves.
    static let coalescedFrameLimit = 3_584

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
            // The length check alone: the header is encoded once, when the frame is written.
            return try encoder.encodedHeaderLength(FrameHeader(frame)) + frame.payload.count
        case .http(let encoder):
            return try encoder.encodedHeaderLength(FrameHeader(frame)) + frame.payload.count
        }
    }

    func write(_ frame: Frame, from offset: Int) throws -> Int {
        switch encoding {
        case .binary(let encoder):
            var header = try encoder.headerBytes(FrameHeader(frame))
            return try withUnsafeBytes(of: &header.storage) { raw in
                try write(header: UnsafeRawBufferPointer(rebasing: raw[..<BinaryFrameHeaderBytes.count]), payload: frame.payload, from: offset)
            }
        case .http(let encoder):
            headerBuffer.removeAll(keepingCapacity: true)
            try encoder.encodeHeader(FrameHeader(frame), into: &headerBuffer)
            return try headerBuffer.withUnsafeBytes { header in
                try write(header: header, payload: frame.payload, from: offset)
            }
        }
    }

    /// Writes what the kernel takes now of `header` then `payload`, from byte `offset` of the
    /// two: a small frame begun now as one contiguous copy (one `send`), anything else as two
    /// segments (the rest of a frame begun before is the same bytes either way).
    @inline(__always)
    private func write(header: UnsafeRawBufferPointer, payload: [UInt8], from offset: Int) throws -> Int {
        let total = header.count + payload.count
        if offset == 0, total <= Self.coalescedFrameLimit {
            let buffer = coalesced ?? makeCoalescedBuffer()
            buffer.copyMemory(from: header)
            payload.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: buffer[header.count...]).copyMemory(from: $0) }
            return try UnixSocket.writeIfReady(descriptor, bytes: UnsafeRawBufferPointer(rebasing: buffer[..<total]))
        }
        return try payload.withUnsafeBytes { payload in
            try UnixSocket.writeIfReady(descriptor, header: header, payload: payload, from: offset)
        }
    }

    private func makeCoalescedBuffer() -> UnsafeMutableRawBufferPointer {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Self.coalescedFrameLimit, alignment: 16)
        coalesced = buffer
        return buffer
    }

    deinit {
        coalesced?.deallocate()
    }

    var gathersWrites: Bool { true }

    /// A frame is its header, then its payload, on a stream socket: the rest of a large one can
    /// go to the kernel whole, either way (docs/ENGINE.md, "Large frames in the kernel's hands").
    var kernelFinishesWrites: Bool { true }

    func kernelReadSpace(minimum: Int) -> UnsafeMutableRawBufferPointer? {
        // Not over bytes a spinning poll already read (a spinning connection does not hand
        // transfers to the kernel; this is the check that it never reads around one).
        guard !polled.isHolding else { return nil }
        return reassembler.spaceForRestOfFrame(minimum: minimum)
    }

    func kernelReadEnded(_ count: Int) {
        reassembler.received(count)
    }

    func withEncodedHeader<R>(of frame: Frame, _ body: (UnsafeRawBufferPointer) throws -> R) throws -> R {
        switch encoding {
        case .binary(let encoder):
            var header = try encoder.headerBytes(FrameHeader(frame))
            return try withUnsafeBytes(of: &header.storage) { raw in
                try body(UnsafeRawBufferPointer(rebasing: raw[..<BinaryFrameHeaderBytes.count]))
            }
        case .http(let encoder):
            headerBuffer.removeAll(keepingCapacity: true)
            try encoder.encodeHeader(FrameHeader(frame), into: &headerBuffer)
            return try headerBuffer.withUnsafeBytes { try body($0) }
        }
    }

    /// ``coalescedFrameLimit``: small frames held together up to it go as one copy and one
    /// `send` (a system call each traded for a copy each); larger frames as one gathering
    /// `sendmsg` of their segments.
    var heldWriteLimit: Int { Self.coalescedFrameLimit }

    /// The frames one after another: copied whole into one buffer and written with one `send`
    /// when they are begun now and come to at most ``coalescedFrameLimit`` bytes together (a
    /// `sendmsg` costs the kernel more for every segment), else one gathering `sendmsg` whose
    /// segments are each frame's header and payload, the headers encoded into one buffer first.
    func write(_ frames: ArraySlice<Frame>, from offset: Int) throws -> Int {
        guard frames.count > 1 else { return try frames.first.map { try write($0, from: offset) } ?? 0 }
        let fd = descriptor
        let count = frames.count
        if offset == 0, case .binary(let encoder) = encoding {
            let size = BinaryFrameHeaderBytes.count
            var total = 0
            for frame in frames { total += size + frame.payload.count }
            if total <= Self.coalescedFrameLimit {
                let buffer = coalesced ?? makeCoalescedBuffer()
                var end = 0
                for frame in frames {
                    var header = try encoder.headerBytes(FrameHeader(frame))
                    withUnsafeBytes(of: &header.storage) { UnsafeMutableRawBufferPointer(rebasing: buffer[end...]).copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[..<size])) }
                    end += size
                    frame.payload.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: buffer[end...]).copyMemory(from: $0) }
                    end += frame.payload.count
                }
                return try UnixSocket.writeIfReady(fd, bytes: UnsafeRawBufferPointer(rebasing: buffer[..<end]))
            }
        }
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
                var total = headerBuffer.count
                for frame in frames { total += frame.payload.count }
                return try headerBuffer.withUnsafeBytes { headers in
                    if offset == 0, total <= Self.coalescedFrameLimit {
                        let buffer = coalesced ?? makeCoalescedBuffer()
                        var (start, at) = (0, 0)
                        for (frame, end) in zip(frames, ends) {
                            UnsafeMutableRawBufferPointer(rebasing: buffer[at...]).copyMemory(from: UnsafeRawBufferPointer(rebasing: headers[start..<end]))
                            at += end - start
                            start = end
                            frame.payload.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: buffer[at...]).copyMemory(from: $0) }
                            at += frame.payload.count
                        }
                        return try UnixSocket.writeIfReady(fd, bytes: UnsafeRawBufferPointer(rebasing: buffer[..<at]))
                    }
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
