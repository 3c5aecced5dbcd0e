public import IPCCore

/// Reassembles frames from a byte stream that arrives in arbitrary chunks.
///
/// The existential face of ``FrameReassembler``, so that a transport can pick its framing at run time.
public protocol FrameReassembling: AnyObject {
    /// Bytes received and not yet consumed by a frame.
    var bufferedByteCount: Int { get }

    /// Appends received bytes.
    func append(_ bytes: UnsafeRawBufferPointer)

    /// Lets `read` write received bytes straight into the buffer's free space (no copy), and
    /// returns what `read` returned. `read` must return how many bytes it wrote, or 0 at end of stream.
    func receive(_ read: (UnsafeMutableRawBufferPointer) throws -> Int) rethrows -> Int

    /// The next whole frame, or `nil` if the buffered bytes do not hold one yet.
    /// - Throws: the decoder's error (``IPCError/Code/malformedFrame``, ``IPCError/Code/frameTooLarge``,
    ///   ...). Errors are final: every later call throws the same error.
    func nextFrame() throws -> Frame?

    /// ``nextFrame()``, lending the frame's payload in place first: `lend` is given the frame's
    /// header and its payload, valid during the call only, and returns whether it took the
    /// frame. A frame taken is consumed (``ReassembledFrame/lent``); one not taken is returned
    /// with a payload of its own (``ReassembledFrame/owned(_:)``, one copy). `lend` must not
    /// call the reassembler.
    ///
    /// A reassembler asked this way once serves one-way messages from its own buffer from then
    /// on, whatever their size (it no longer gathers a large message's payload into an array of
    /// its own), and keeps a buffer of up to ``FrameReassembler/lendingRetainedCapacity`` bytes
    /// between large messages instead of allocating one for each.
    /// - Throws: as ``nextFrame()``.
    func nextFrame(lending lend: (FrameHeader, UnsafeRawBufferPointer) -> Bool) throws -> ReassembledFrame?

    /// Call at end of stream.
    /// - Throws: ``IPCError/Code/truncatedFrame`` if the stream ended inside a frame.
    func finish() throws

    /// Room for bytes the frame being assembled still needs for certain, at least `minimum` of
    /// them and never past the frame's end (its whole rest, once its header is read): for a
    /// reader that fills it whole, or stops short only where the stream ends, and then calls
    /// ``received(_:)`` (an io_uring receive with `MSG_WAITALL`). The room stays valid, and the
    /// reassembler must not be called, until then. `nil` if that is fewer than `minimum` bytes,
    /// or more than the memory bound for what has arrived allows.
    func spaceForRestOfFrame(minimum: Int) -> UnsafeMutableRawBufferPointer?

    /// `count` bytes were written into the room ``spaceForRestOfFrame(minimum:)`` gave, from its
    /// start.
    func received(_ count: Int)
}

extension FrameReassembling {
    /// No room: a reassembler that does not say otherwise is read the usual way only.
    public func spaceForRestOfFrame(minimum: Int) -> UnsafeMutableRawBufferPointer? { nil }
    public func received(_ count: Int) {}
}

/// Owns the receive buffer of one stream and runs a ``FrameDecoder`` over it.
///
/// The buffer grows only as bytes arrive, and to at most the header plus the decoder's
/// maximum payload: a header that announces more is refused before anything is allocated for it.
///
/// Large payloads are copied once: when the decoder offers ``FrameDecoder/decodeHeader(_:)`` and a
/// frame's header announces a payload of at least ``gatheringThreshold`` bytes that is not yet all
/// here, the reassembler allocates the frame's payload array and gathers the rest of the payload
/// straight into it (``receive(_:)`` lets the reader write into it, ``append(_:)`` copies into it),
/// instead of growing its buffer and copying the payload out of it afterwards.
public final class FrameReassembler<Decoder: FrameDecoder>: FrameReassembling {
    // Every stored property is private and no method holds an access to one across a call that
    // could re-enter the reassembler, so the dynamic exclusivity checks (a runtime call per
    // access, a tenth of a small frame's decoding) are left out.
    @exclusivity(unchecked) private var decoder: Decoder
    @exclusivity(unchecked) private var storage: UnsafeMutableRawPointer
    @exclusivity(unchecked) private var capacity: Int
    @exclusivity(unchecked) private var readIndex = 0
    @exclusivity(unchecked) private var writeIndex = 0
    /// Total bytes the frame being assembled needs, when the decoder has said.
    @exclusivity(unchecked) private var pendingFrameLength = 0
    @exclusivity(unchecked) private var failure: IPCError?
    /// Whether frames are lent in place (``nextFrame(lending:)`` was called).
    @exclusivity(unchecked) private var lends = false

    /// The frame whose payload is being gathered into its own array: its header, the header's
    /// length on the wire, the array (of the payload's length) and how much of it holds bytes.
    @exclusivity(unchecked) private var gatheringHeader: FrameHeader?
    @exclusivity(unchecked) private var gatheringHeaderLength = 0
    @exclusivity(unchecked) private var gatheringPayload: [UInt8] = []
    @exclusivity(unchecked) private var gatheringFilled = 0
    /// Frames gathered whole, with their length on the wire, oldest first; those from
    /// ``readyIndex`` on are not yet returned. They come before every buffered byte. The array
    /// keeps its capacity, so queueing a frame allocates nothing.
    @exclusivity(unchecked) private var ready: [(frame: Frame, wireLength: Int)] = []
    @exclusivity(unchecked) private var readyIndex = 0
    /// Bytes of ``ready`` frames and of the frame being gathered.
    @exclusivity(unchecked) private var heldByteCount = 0

    /// The free space offered to a reader when nothing larger is known to be needed.
    public static var chunkSize: Int { 64 * 1024 }

    /// The most room reserved for an announced payload before any of it has arrived.
    public static var upfrontReservation: Int { 1 << 20 }

    /// The smallest payload gathered straight into the frame's array rather than buffered first.
    public static var gatheringThreshold: Int { 16 * 1024 }

    /// The largest buffer a reassembler that lends payloads keeps between frames (one that does
    /// not returns to ``chunkSize`` after a frame that needed more).
    public static var lendingRetainedCapacity: Int { 4 << 20 }

    /// The buffer a reassembler that lends payloads grows to, rather than moving a partly read
    /// message to its front after each one (four of its messages, if that is more, up to
    /// ``lendingRetainedCapacity``).
    public static var lendingBatchCapacity: Int { 1 << 20 }

    /// How much of a large append is buffered first, to see the header of the frame it starts.
    private static var probeLength: Int { 4 * 1024 }

    public init(decoder: Decoder) {
        self.decoder = decoder
        self.capacity = Self.chunkSize
        self.storage = .allocate(byteCount: Self.chunkSize, alignment: 16)
    }

    deinit {
        storage.deallocate()
    }

    public var bufferedByteCount: Int { writeIndex - readIndex + heldByteCount }

    public func append(_ bytes: UnsafeRawBufferPointer) {
        var rest = bytes
        while rest.count > 0 {
            if gatheringHeader != nil {
                let count = min(rest.count, gatheringPayload.count - gatheringFilled)
                let offset = gatheringFilled
                gatheringPayload.withUnsafeMutableBytes { payload in
                    (payload.baseAddress! + offset).copyMemory(from: rest.baseAddress!, byteCount: count)
                }
                gatheredBytes(count)
                rest = UnsafeRawBufferPointer(rebasing: rest[count...])
                continue
            }
            if rest.count < Self.gatheringThreshold || failure != nil {
                copyIntoBuffer(rest)
                return
            }
            // Enough bytes to hold a large payload: buffer a little, and if it shows the header
            // of such a frame, gather the rest of its payload directly.
            let probe = min(rest.count, Self.probeLength)
            copyIntoBuffer(UnsafeRawBufferPointer(rebasing: rest[..<probe]))
            rest = UnsafeRawBufferPointer(rebasing: rest[probe...])
            if !startGathering() {
                copyIntoBuffer(rest)
                return
            }
        }
    }

    public func spaceForRestOfFrame(minimum: Int) -> UnsafeMutableRawBufferPointer? {
        guard failure == nil else { return nil }
        if gatheringHeader != nil {
            let rest = gatheringPayload.count - gatheringFilled
            guard rest >= minimum else { return nil }
            // The array's storage, which stays where it is while the reassembler holds the array
            // unchanged (nothing else runs on it until `received`); made unique first, so that
            // no copy of it is written to.
            let offset = gatheringFilled
            return gatheringPayload.withUnsafeMutableBytes { UnsafeMutableRawBufferPointer(rebasing: $0[offset...]) }
        }
        let unread = writeIndex - readIndex
        let rest = pendingFrameLength - unread
        guard pendingFrameLength > 0, rest >= minimum, rest <= boundedReservation(unread: unread) else { return nil }
        reserveFreeSpace(rest)
        return UnsafeMutableRawBufferPointer(start: storage + writeIndex, count: rest)
    }

    public func received(_ count: Int) {
        guard count > 0 else { return }
        if gatheringHeader != nil {
            gatheredBytes(count)
        } else {
            writeIndex += count
        }
    }

    public func receive(_ read: (UnsafeMutableRawBufferPointer) throws -> Int) rethrows -> Int {
        if gatheringHeader != nil {
            let offset = gatheringFilled
            let count = try gatheringPayload.withUnsafeMutableBytes { payload in
                try read(UnsafeMutableRawBufferPointer(rebasing: payload[offset...]))
            }
            if count > 0 { gatheredBytes(count) }
            return count
        }
        // Offer room for the rest of the frame being assembled, so a large payload arrives in as
        // few reads as possible, and otherwise fill a buffer of one chunk so small frames batch up.
        // The room offered for an announced payload grows with the bytes that actually arrived
        // (up to `upfrontReservation` at once, then doubling), so a peer that announces a large
        // frame and sends little of it costs little memory.
        let unread = writeIndex - readIndex
        reserveFreeSpace(max(boundedReservation(unread: unread), Self.chunkSize - unread, 1))
        let count = try read(UnsafeMutableRawBufferPointer(start: storage + writeIndex, count: capacity - writeIndex))
        if count > 0 { writeIndex += count }
        return count
    }

    public func nextFrame() throws -> Frame? {
        if readyIndex < ready.count {
            let (frame, wireLength) = ready[readyIndex]
            readyIndex += 1
            if readyIndex == ready.count {
                ready.removeAll(keepingCapacity: true)
                readyIndex = 0
            }
            heldByteCount -= wireLength
            return frame
        }
        if let failure { throw failure }
        guard gatheringHeader == nil, writeIndex > readIndex else { return nil }
        let step: DecodeStep
        do {
            step = try decoder.decode(UnsafeRawBufferPointer(start: storage + readIndex, count: writeIndex - readIndex))
        } catch {
            throw fail(error)
        }
        switch step {
        case .frame(let frame, let consumed):
            consume(consumed)
            return frame
        case .needMoreBytes(let atLeast):
            needMoreBytes(atLeast)
            if let failure { throw failure }
            return nil
        }
    }

    public func nextFrame(lending lend: (FrameHeader, UnsafeRawBufferPointer) -> Bool) throws -> ReassembledFrame? {
        lends = true
        if readyIndex < ready.count {
            // A frame gathered into its own array (a request or reply; messages are not gathered
            // once lending): lent from there.
            guard let frame = try nextFrame() else { return nil }
            let taken = frame.payload.withUnsafeBytes { lend(FrameHeader(frame), $0) }
            return taken ? .lent : .owned(frame)
        }
        if let failure { throw failure }
        guard gatheringHeader == nil, writeIndex > readIndex else { return nil }
        let bytes = UnsafeRawBufferPointer(start: storage + readIndex, count: writeIndex - readIndex)
        let step: InPlaceDecodeStep
        do {
            guard let inPlace = try decoder.decodeInPlace(bytes) else {
                return try nextFrame().map { .owned($0) }
            }
            step = inPlace
        } catch {
            throw fail(error)
        }
        switch step {
        case .frame(let header, let headerLength):
            let end = headerLength + header.payloadLength
            let payload = UnsafeRawBufferPointer(rebasing: bytes[headerLength..<end])
            let result: ReassembledFrame =
                lend(header, payload)
                ? .lent
                : .owned(Frame(kind: header.kind, msgid: header.msgid, correlation: header.correlation, payload: Array(payload)))
            consume(end)
            return result
        case .needMoreBytes(let atLeast):
            needMoreBytes(atLeast)
            if let failure { throw failure }
            return nil
        }
    }

    /// Records the decoder's error as the stream's, final: a decoder that keeps state may have
    /// read past the bytes it refused, so decoding on could make a frame of what follows them.
    /// An error of another type than ``IPCError`` (a decoder of the caller's own) becomes
    /// ``IPCError/Code/malformedFrame``.
    private func fail(_ error: any Error) -> IPCError {
        let failure = error as? IPCError ?? IPCError(code: .malformedFrame, message: "the frame decoder failed: \(error)")
        self.failure = failure
        return failure
    }

    /// The frame at the front of the buffer, `count` bytes, is decoded.
    @inline(__always)
    private func consume(_ count: Int) {
        readIndex += count
        pendingFrameLength = 0
        if readIndex == writeIndex {
            readIndex = 0
            writeIndex = 0
            releaseOversizedStorage()
        }
    }

    /// The decoder needs `atLeast` bytes for the frame at the front of the buffer.
    @inline(__always)
    private func needMoreBytes(_ atLeast: Int) {
        pendingFrameLength = atLeast
        if atLeast - (writeIndex - readIndex) >= Self.gatheringThreshold {
            _ = startGathering()
        }
    }

    public func finish() throws {
        if let failure { throw failure }
        if bufferedByteCount > 0 {
            let frameLength = gatheringHeader.map { gatheringHeaderLength + $0.payloadLength } ?? pendingFrameLength
            let error = IPCError(
                code: .truncatedFrame,
                message: "stream ended \(bufferedByteCount) bytes into a frame" + (frameLength > 0 ? " of \(frameLength) bytes" : "")
            )
            failure = error
            throw error
        }
    }

    /// If the buffer holds the whole header of a frame with a large payload, and not yet the
    /// whole payload, moves the payload bytes buffered so far into a new array of the payload's
    /// length and gathers the rest there. The buffer is then empty. Returns whether it started.
    private func startGathering() -> Bool {
        guard gatheringHeader == nil else { return false }
        let buffered = writeIndex - readIndex
        // The decoder makes the checks `decode` makes, and may keep how far it has read (an HTTP
        // head's scan): its error is this stream's, as `decode`'s would be.
        let decoded: (header: FrameHeader, headerLength: Int)?
        do {
            decoded = try decoder.decodeHeader(UnsafeRawBufferPointer(start: storage + readIndex, count: buffered))
        } catch {
            _ = fail(error)
            return false
        }
        guard let (header, headerLength) = decoded,
            header.payloadLength >= Self.gatheringThreshold, buffered < headerLength + header.payloadLength,
            // A message lent in place stays in the buffer.
            !(lends && header.kind == .message),
            // Memory follows what arrived: an array of at most `upfrontReservation` bytes, or of at
            // most twice the bytes already here.
            header.payloadLength <= Self.upfrontReservation || 2 * buffered >= headerLength + header.payloadLength
        else { return false }
        let prefix = buffered - headerLength
        let source = storage + readIndex + headerLength
        // Every byte of the array is written before the frame is returned: the bytes buffered so
        // far now, the rest as they arrive.
        // (Through ContiguousArray, whose storage is allocated by code specialized for UInt8 here,
        // and which becomes an Array without a copy: Array's own uninitialized initializer calls
        // into the runtime, which allocates a second time per call to look up generic metadata.)
        gatheringPayload = Array(ContiguousArray<UInt8>(unsafeUninitializedCapacity: header.payloadLength) { payload, count in
            UnsafeMutableRawPointer(payload.baseAddress!).copyMemory(from: source, byteCount: prefix)
            count = header.payloadLength
        })
        decoder.forgetFrame()
        gatheringHeader = header
        gatheringHeaderLength = headerLength
        gatheringFilled = prefix
        heldByteCount += buffered
        readIndex = 0
        writeIndex = 0
        pendingFrameLength = 0
        releaseOversizedStorage()
        return true
    }

    /// Records `count` more payload bytes gathered, and queues the frame once it is whole.
    private func gatheredBytes(_ count: Int) {
        gatheringFilled += count
        heldByteCount += count
        guard let header = gatheringHeader, gatheringFilled == gatheringPayload.count else { return }
        ready.append((Frame(kind: header.kind, msgid: header.msgid, correlation: header.correlation, payload: gatheringPayload), gatheringHeaderLength + gatheringFilled))
        gatheringPayload = []
        gatheringHeader = nil
        gatheringFilled = 0
    }

    private func copyIntoBuffer(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0 else { return }
        // Room for the rest of the frame being assembled too (within the bound), so the buffer
        // grows once for it.
        reserveFreeSpace(max(bytes.count, boundedReservation(unread: writeIndex - readIndex)))
        (storage + writeIndex).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
        writeIndex += bytes.count
    }

    /// The room to reserve for the rest of the frame being assembled: what it still needs, but
    /// at most `upfrontReservation` or the bytes already here, whichever is more.
    private func boundedReservation(unread: Int) -> Int {
        min(pendingFrameLength - unread, max(Self.upfrontReservation, unread))
    }

    private func reserveFreeSpace(_ count: Int) {
        if capacity - writeIndex >= count { return }
        let unread = writeIndex - readIndex
        // Moving the unread bytes to the front copies them once more. A reassembler that
        // lends payloads in place reads large messages into its buffer, where the next message's
        // first part is left behind after each one, so it grows its buffer (to a few messages, at
        // most `lendingRetainedCapacity`) rather than move every time; it then moves once per
        // buffer's worth of messages.
        // (Moving a few kilobytes costs less than a larger buffer's cache misses.)
        let batchCapacity = min(Self.lendingRetainedCapacity, max(Self.lendingBatchCapacity, 4 * pendingFrameLength))
        let batching = lends && unread >= Self.gatheringThreshold && capacity < batchCapacity
        if readIndex > 0, !batching {
            // Move the unread bytes to the front (regions may overlap; copyMemory is memmove).
            storage.copyMemory(from: storage + readIndex, byteCount: unread)
            readIndex = 0
            writeIndex = unread
            if capacity - writeIndex >= count { return }
        }
        let newCapacity = max(batching ? min(capacity * 2, batchCapacity) : capacity * 2, unread + count)
        let newStorage = UnsafeMutableRawPointer.allocate(byteCount: newCapacity, alignment: 16)
        newStorage.copyMemory(from: storage + readIndex, byteCount: unread)
        storage.deallocate()
        storage = newStorage
        capacity = newCapacity
        readIndex = 0
        writeIndex = unread
    }

    /// After a large frame, return to the normal buffer size instead of holding its memory (a
    /// reassembler that lends keeps up to ``lendingRetainedCapacity``, for the next large message).
    private func releaseOversizedStorage() {
        guard capacity > (lends ? Self.lendingRetainedCapacity : 4 * Self.chunkSize) else { return }
        storage.deallocate()
        storage = .allocate(byteCount: Self.chunkSize, alignment: 16)
        capacity = Self.chunkSize
    }
}
