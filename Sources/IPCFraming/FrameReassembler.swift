import IPCCore

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

    /// Call at end of stream.
    /// - Throws: ``IPCError/Code/truncatedFrame`` if the stream ended inside a frame.
    func finish() throws
}

/// Owns the receive buffer of one stream and runs a ``FrameDecoder`` over it.
///
/// The buffer grows only as bytes arrive, and to at most the header plus the decoder's
/// maximum payload: a header that announces more is refused before anything is allocated for it.
public final class FrameReassembler<Decoder: FrameDecoder>: FrameReassembling {
    private var decoder: Decoder
    private var storage: UnsafeMutableRawPointer
    private var capacity: Int
    private var readIndex = 0
    private var writeIndex = 0
    /// Total bytes the frame being assembled needs, when the decoder has said.
    private var pendingFrameLength = 0
    private var failure: IPCError?

    /// The free space offered to a reader when nothing larger is known to be needed.
    public static var chunkSize: Int { 64 * 1024 }

    /// The most room reserved for an announced payload before any of it has arrived.
    public static var upfrontReservation: Int { 1 << 20 }

    public init(decoder: Decoder) {
        self.decoder = decoder
        self.capacity = Self.chunkSize
        self.storage = .allocate(byteCount: Self.chunkSize, alignment: 16)
    }

    deinit {
        storage.deallocate()
    }

    public var bufferedByteCount: Int { writeIndex - readIndex }

    public func append(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0 else { return }
        reserveFreeSpace(bytes.count)
        (storage + writeIndex).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
        writeIndex += bytes.count
    }

    public func receive(_ read: (UnsafeMutableRawBufferPointer) throws -> Int) rethrows -> Int {
        // Offer room for the rest of the frame being assembled, so a large payload arrives in as
        // few reads as possible, and otherwise fill a buffer of one chunk so small frames batch up.
        // The room offered for an announced payload grows with the bytes that actually arrived
        // (up to `upfrontReservation` at once, then doubling), so a peer that announces a large
        // frame and sends little of it costs little memory.
        let stillNeeded = min(pendingFrameLength - bufferedByteCount, max(Self.upfrontReservation, bufferedByteCount))
        reserveFreeSpace(max(stillNeeded, Self.chunkSize - bufferedByteCount, 1))
        let count = try read(UnsafeMutableRawBufferPointer(start: storage + writeIndex, count: capacity - writeIndex))
        if count > 0 { writeIndex += count }
        return count
    }

    public func nextFrame() throws -> Frame? {
        if let failure { throw failure }
        guard writeIndex > readIndex else { return nil }
        let step: DecodeStep
        do {
            step = try decoder.decode(UnsafeRawBufferPointer(start: storage + readIndex, count: writeIndex - readIndex))
        } catch let error as IPCError {
            failure = error
            throw error
        }
        switch step {
        case .frame(let frame, let consumed):
            readIndex += consumed
            pendingFrameLength = 0
            if readIndex == writeIndex {
                readIndex = 0
                writeIndex = 0
                releaseOversizedStorage()
            }
            return frame
        case .needMoreBytes(let atLeast):
            pendingFrameLength = atLeast
            return nil
        }
    }

    public func finish() throws {
        if let failure { throw failure }
        if bufferedByteCount > 0 {
            let error = IPCError(
                code: .truncatedFrame,
                message: "stream ended \(bufferedByteCount) bytes into a frame" + (pendingFrameLength > 0 ? " of \(pendingFrameLength) bytes" : "")
            )
            failure = error
            throw error
        }
    }

    private func reserveFreeSpace(_ count: Int) {
        if capacity - writeIndex >= count { return }
        let unread = writeIndex - readIndex
        if readIndex > 0 {
            // Move the unread bytes to the front (regions may overlap; copyMemory is memmove).
            storage.copyMemory(from: storage + readIndex, byteCount: unread)
            readIndex = 0
            writeIndex = unread
            if capacity - writeIndex >= count { return }
        }
        let newCapacity = max(capacity * 2, unread + count)
        let newStorage = UnsafeMutableRawPointer.allocate(byteCount: newCapacity, alignment: 16)
        newStorage.copyMemory(from: storage, byteCount: unread)
        storage.deallocate()
        storage = newStorage
        capacity = newCapacity
    }

    /// After a large frame, return to the normal buffer size instead of holding its memory.
    private func releaseOversizedStorage() {
        guard capacity > 4 * Self.chunkSize else { return }
        storage.deallocate()
        storage = .allocate(byteCount: Self.chunkSize, alignment: 16)
        capacity = Self.chunkSize
    }
}
