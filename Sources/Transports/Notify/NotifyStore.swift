import CIPCShims
import Glibc
import IPCCore
import IPCSystem
import SystemPackage

/// The shared store of one connection: an anonymous memory file (`memfd`) that the client
/// creates, seals against shrinking and growing, and hands to the listener over the endpoint's
/// rendezvous socket; both processes map it. It holds one single-producer, single-consumer byte
/// ring per direction. Frames (the binary framing) are copied into a ring and published by
/// advancing its write index; the writer then rings the reader's doorbell (an eventfd) if the
/// reader said it is about to wait. See docs/WIRE-FORMAT.md, section 6, for the layout.
///
/// Why this avoids MMWormhole's defects: a message is never overwritten by a later one (the ring
/// holds every unread byte, and a writer waits for space); the reader takes everything published
/// however many rings coalesced, and advances its read index past each byte once, so nothing is
/// lost or delivered twice; a frame becomes visible only through the write index, which a writer
/// advances after copying the bytes, and a frame whose writer died before finishing is discarded
/// with the connection, so no reader acts on half a message.
///
/// Why a sealed memfd and not a file in the group directory: nobody can shrink a sealed memfd,
/// not even its creator, so a mapping of it can never fault with SIGBUS; and it has no name that
/// another process could open without a descriptor for it.
final class NotifyStore: @unchecked Sendable {
    // @unchecked: its fields point into a shared mapping that is read and written only through
    // atomics (indexes, flags) and by each ring's one writer and one reader.
    enum State: UInt32 {
        case open = 0, closed = 2
    }

    static let magic: UInt32 = 0x4E54_4659 // "NTFY"
    /// 3: a memfd handed over a rendezvous socket, and doorbells instead of futex counters.
    static let version: UInt32 = 3
    static let headerLength = 4096
    static let minimumRingCapacity = 4096
    static let maximumRingCapacity = 1 << 30

    let base: UnsafeMutableRawPointer
    let length: Int
    let clientToServer: Ring
    let serverToClient: Ring

    private var stateWord: UnsafeMutablePointer<UInt32> { word32(at: 16) }
    var state: State { State(rawValue: ipc_atomic_load_u32(stateWord)) ?? .closed }
    var ringCapacity: Int { Int(ipc_atomic_load_u32(word32(at: 20))) }

    /// Whether the store still carries its magic and version: the other process can write
    /// anything into it, and a reader checks this whenever its doorbell rings.
    var isIntact: Bool {
        ipc_atomic_load_u32(word32(at: 0)) == Self.magic && ipc_atomic_load_u32(word32(at: 4)) == Self.version
    }

    /// Creates a sealed store for a connecting client, its memfd named `label` (which shows in
    /// `/proc/<pid>/maps` as `/memfd:<label>`). Returns it and the memfd to hand over (the
    /// caller closes it once sent).
    /// - Throws: ``IPCError/Code/transportFailure``.
    static func create(ringCapacity: Int, label: String) throws -> (NotifyStore, memfd: CInt) {
        precondition(ringCapacity >= minimumRingCapacity && ringCapacity <= maximumRingCapacity)
        let fd = ipc_memfd_create_sealable(label)
        guard fd >= 0 else { throw IPCError.syscall("memfd_create", Errno(rawValue: errno)) }
        let length = headerLength + 2 * ringCapacity
        guard ftruncate(fd, off_t(length)) == 0, ipc_seal_size(fd) == 0 else {
            let error = Errno(rawValue: errno)
            try? FileDescriptor(rawValue: fd).close()
            throw IPCError.syscall("ftruncate/F_ADD_SEALS", error, context: "notify store")
        }
        do {
            let store = try NotifyStore(mapping: fd, length: length, ringCapacity: ringCapacity)
            ipc_atomic_store_u32(store.word32(at: 4), version)
            ipc_atomic_store_u32(store.word32(at: 8), UInt32(bitPattern: getpid()))
            ipc_atomic_store_u32(store.word32(at: 20), UInt32(ringCapacity))
            // Both readers start out waiting: the first frame each way rings its reader's bell.
            ipc_atomic_store_u32(store.clientToServer.readerWaiting, 1)
            ipc_atomic_store_u32(store.serverToClient.readerWaiting, 1)
            ipc_atomic_store_u32(store.word32(at: 0), magic)
            return (store, fd)
        } catch {
            try? FileDescriptor(rawValue: fd).close()
            throw error
        }
    }

    /// Maps a store a client handed over, after checking everything about it that the client
    /// could get wrong or lie about: a memfd sealed against shrinking and growing, exactly as
    /// long as its capacity says, with this version's magic.
    /// - Throws: ``IPCError/Code/malformedFrame`` for a descriptor that is not such a store.
    static func adopt(memfd fd: CInt, ringCapacity: Int) throws -> NotifyStore {
        guard ringCapacity >= minimumRingCapacity, ringCapacity <= maximumRingCapacity else {
            throw IPCError(code: .malformedFrame, message: "a notify store of \(ringCapacity) bytes per ring")
        }
        guard ipc_size_is_sealed(fd) == 1 else {
            throw IPCError(code: .malformedFrame, message: "the notify store handed over is not a memfd sealed against shrinking and growing")
        }
        var status = stat()
        let length = headerLength + 2 * ringCapacity
        guard fstat(fd, &status) == 0, status.st_mode & S_IFMT == S_IFREG, status.st_size == off_t(length) else {
            throw IPCError(code: .malformedFrame, message: "the notify store handed over is not \(length) bytes long")
        }
        let store = try NotifyStore(mapping: fd, length: length, ringCapacity: ringCapacity)
        guard store.isIntact, store.ringCapacity == ringCapacity else {
            throw IPCError(code: .malformedFrame, message: "the notify store handed over has no version \(version) header for \(ringCapacity)-byte rings")
        }
        return store
    }

    private init(mapping fd: CInt, length: Int, ringCapacity: Int) throws {
        guard let address = mmap(nil, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), address != MAP_FAILED else {
            throw IPCError.syscall("mmap", Errno(rawValue: errno), context: "notify store")
        }
        base = address
        self.length = length
        func ring(header: Int, data: Int) -> Ring {
            Ring(
                writeIndex: (address + header).assumingMemoryBound(to: UInt64.self),
                readIndex: (address + header + 8).assumingMemoryBound(to: UInt64.self),
                readerWaiting: (address + header + 16).assumingMemoryBound(to: UInt32.self),
                writerWaiting: (address + header + 20).assumingMemoryBound(to: UInt32.self),
                bytes: address + data,
                capacity: ringCapacity
            )
        }
        clientToServer = ring(header: 64, data: Self.headerLength)
        serverToClient = ring(header: 128, data: Self.headerLength + ringCapacity)
    }

    /// Whether ``unmap()`` ran (only the channel's `close`, once nothing uses the store).
    private var unmapped = false

    deinit {
        if !unmapped { munmap(base, length) }
    }

    /// Releases the mapping now rather than when the last reference goes: a connection object
    /// its user still holds must not keep the store's memory. Nothing may touch the store after.
    func unmap() {
        guard !unmapped else { return }
        unmapped = true
        munmap(base, length)
    }

    /// Whether the header and both rings' indexes are still what this side and a
    /// rule-following peer can make of them (the periodic check of an idle connection).
    var isSound: Bool {
        isIntact && clientToServer.indexesAreConsistent && serverToClient.indexesAreConsistent
    }

    private func word32(at offset: Int) -> UnsafeMutablePointer<UInt32> {
        (base + offset).assumingMemoryBound(to: UInt32.self)
    }

    /// The server records its pid once it has accepted the store.
    func recordServer() {
        ipc_atomic_store_u32(word32(at: 12), UInt32(bitPattern: getpid()))
    }

    /// Marks the connection closed (the goodbye); the caller then rings the other side's bell.
    func close() {
        ipc_atomic_store_u32(stateWord, State.closed.rawValue)
    }

    /// One direction. The writer advances `writeIndex`, and sets `writerWaiting` when the ring
    /// is full; the reader advances `readIndex`, and sets `readerWaiting` before it waits. Each
    /// side clears the other's flag (exchanging it for 0) after making the change that flag
    /// waits for, and rings the other's doorbell if it was set. Indexes count bytes since the
    /// start and never wrap; positions in the ring are taken modulo the capacity.
    struct Ring: @unchecked Sendable {
        // @unchecked: pointers into the shared mapping, used through atomics by one writer and one reader.
        let writeIndex: UnsafeMutablePointer<UInt64>
        let readIndex: UnsafeMutablePointer<UInt64>
        let readerWaiting: UnsafeMutablePointer<UInt32>
        let writerWaiting: UnsafeMutablePointer<UInt32>
        let bytes: UnsafeMutableRawPointer
        let capacity: Int
    }
}

extension NotifyStore.Ring {
    /// The published, unread bytes, after checking the indexes: the other process can write
    /// anything into them.
    /// - Throws: ``IPCError/Code/malformedFrame`` if they are impossible.
    private func indexes() throws -> (read: UInt64, write: UInt64) {
        let read = ipc_atomic_load_u64(readIndex)
        let write = ipc_atomic_load_u64(writeIndex)
        guard write >= read, write &- read <= UInt64(capacity) else {
            throw IPCError(code: .malformedFrame, message: "ring indexes are inconsistent (write \(write), read \(read), capacity \(capacity))")
        }
        return (read, write)
    }

    /// Copies what fits of `header` then `payload`, from byte `offset` of the two together,
    /// without waiting, and publishes it. Returns how many bytes it took (0 if the ring is full).
    /// - Throws: ``IPCError/Code/malformedFrame`` for impossible indexes, or a write index that
    ///   would overflow (indexes never wrap in a store's lifetime; one that would was forged).
    func write(header: UnsafeRawBufferPointer, payload: UnsafeRawBufferPointer, from offset: Int) throws -> Int {
        let total = header.count + payload.count
        let (read, write) = try indexes()
        let free = capacity - Int(write &- read)
        let count = min(free, total - offset)
        guard count > 0 else { return 0 }
        let (published, overflow) = write.addingReportingOverflow(UInt64(count))
        guard !overflow else {
            throw IPCError(code: .malformedFrame, message: "ring write index \(write) would overflow")
        }
        var position = Int(write % UInt64(capacity))
        var copied = 0
        while copied < count {
            // The next bytes come from the header until it is all in, then from the payload.
            let at = offset + copied
            let (source, start) = at < header.count ? (header, at) : (payload, at - header.count)
            let chunk = min(source.count - start, count - copied, capacity - position)
            (bytes + position).copyMemory(from: source.baseAddress! + start, byteCount: chunk)
            copied += chunk
            position = (position + chunk) % capacity
        }
        ipc_atomic_store_u64(writeIndex, published)
        return count
    }

    /// Copies published bytes into `buffer` and consumes them. Returns how many (0 if none).
    /// - Throws: ``IPCError/Code/malformedFrame`` if the indexes are impossible, before anything is read.
    func read(into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        let (read, write) = try indexes()
        let count = min(Int(write &- read), buffer.count)
        guard count > 0 else { return 0 }
        let position = Int(read % UInt64(capacity))
        let first = min(count, capacity - position)
        buffer.baseAddress!.copyMemory(from: bytes + position, byteCount: first)
        if first < count {
            (buffer.baseAddress! + first).copyMemory(from: bytes, byteCount: count - first)
        }
        // `count` is at most `write - read`, so this cannot overflow.
        ipc_atomic_store_u64(readIndex, read + UInt64(count))
        return count
    }

    var indexesAreConsistent: Bool { (try? indexes()) != nil }

    /// Whether published bytes are waiting to be read.
    var hasUnread: Bool {
        ipc_atomic_load_u64(writeIndex) != ipc_atomic_load_u64(readIndex)
    }

    /// Whether the ring has room for `count` more bytes.
    func hasRoom(for count: Int) -> Bool {
        let used = ipc_atomic_load_u64(writeIndex) &- ipc_atomic_load_u64(readIndex)
        return used <= UInt64(capacity) && UInt64(capacity) - used >= UInt64(count)
    }

    /// The reader is about to wait: asks the writer to ring. The caller then looks at
    /// ``hasUnread`` once more (the fence orders the flag before that look, as the writer's
    /// fence orders its publishing before its look at the flag).
    func readerWillWait() {
        _ = ipc_atomic_exchange_u32(readerWaiting, 1)
        ipc_atomic_fence()
    }

    /// The writer is about to wait for room: asks the reader to ring. The caller then looks at
    /// ``hasRoom(for:)`` once more.
    func writerWillWait() {
        _ = ipc_atomic_exchange_u32(writerWaiting, 1)
        ipc_atomic_fence()
    }

    /// After publishing: whether the reader asked to be rung (the flag is cleared).
    func takeReaderWaiting() -> Bool {
        ipc_atomic_fence()
        return ipc_atomic_exchange_u32(readerWaiting, 0) != 0
    }

    /// After consuming: whether the writer asked to be rung (the flag is cleared).
    func takeWriterWaiting() -> Bool {
        ipc_atomic_fence()
        return ipc_atomic_exchange_u32(writerWaiting, 0) != 0
    }
}
