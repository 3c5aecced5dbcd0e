import CIPCShims
import Glibc
import IPCCore
import IPCEngine
import IPCPosix

/// The shared store of one connection: a file `G/<endpoint>.<client pid>-<serial>.ring`, mapped
/// by both processes, holding one single-producer, single-consumer byte ring per direction.
/// Frames (the binary framing) are written into a ring and published by advancing its write
/// index; the writer then posts the ring's data counter (a futex word, the same mechanism as a
/// ``NotifyCenter`` name) to wake the reader. See docs/WIRE-FORMAT.md for the layout.
///
/// Why this avoids MMWormhole's defects: a message is never overwritten by a later one (the ring
/// holds every unread byte, and a writer waits for space); the reader drains everything published
/// however many posts coalesced, and advances its read index past each byte once, so nothing is
/// lost or delivered twice; a frame becomes visible only through the write index, which a writer
/// advances after copying the bytes, and a frame whose writer died before finishing is discarded
/// with the connection, so no reader acts on half a message.
final class NotifyStore: @unchecked Sendable {
    // @unchecked: its fields point into a shared mapping that is read and written only through
    // atomics (indexes, counters) and by each ring's one writer and one reader.
    enum State: UInt32 {
        case waiting = 0, accepted = 1, closed = 2
    }

    /// One direction: the writer owns `writeIndex`, the reader owns `readIndex`. Both count bytes
    /// since the start and never wrap; positions in the ring are taken modulo the capacity.
    struct Ring: @unchecked Sendable {
        // @unchecked: pointers into the shared mapping, used through atomics by one writer and one reader.
        let writeIndex: UnsafeMutablePointer<UInt64>
        let readIndex: UnsafeMutablePointer<UInt64>
        /// Posted by the writer after publishing bytes.
        let data: FutexCounter
        /// Posted by the reader after consuming bytes.
        let space: FutexCounter
        let bytes: UnsafeMutableRawPointer
        let capacity: Int
    }

    static let magic: UInt32 = 0x4E54_4659 // "NTFY"
    /// 2: counters carry a waiters flag in bit 31 (see ``FutexCounter``), which a version-1
    /// peer would neither set nor expect.
    static let version: UInt32 = 2
    static let headerLength = 4096

    let mapping: SharedMapping
    let clientToServer: Ring
    let serverToClient: Ring

    var path: String { mapping.path }
    var stateWord: UnsafeMutablePointer<UInt32> { mapping.word32(at: 16) }
    var state: State { State(rawValue: ipc_atomic_load_u32(stateWord)) ?? .closed }
    var clientPID: Int32 { Int32(bitPattern: ipc_atomic_load_u32(mapping.word32(at: 8))) }
    var serverPID: Int32 { Int32(bitPattern: ipc_atomic_load_u32(mapping.word32(at: 12))) }

    /// Creates a new store for a connecting client (exclusive: the name is the client's own).
    static func create(path: String, ringCapacity: Int) throws -> NotifyStore {
        let mapping = try SharedMapping(path: path, length: headerLength + 2 * ringCapacity, create: true, exclusive: true)
        ipc_atomic_store_u32(mapping.word32(at: 4), version)
        ipc_atomic_store_u32(mapping.word32(at: 8), UInt32(bitPattern: getpid()))
        ipc_atomic_store_u32(mapping.word32(at: 20), UInt32(ringCapacity))
        ipc_atomic_store_u32(mapping.word32(at: 0), magic)
        return NotifyStore(mapping: mapping, ringCapacity: ringCapacity)
    }

    /// Opens a client's store on the server side.
    /// - Throws: ``IPCError/Code/malformedFrame`` if the file is not a store of this version.
    static func open(path: String) throws -> NotifyStore {
        let header = try SharedMapping(path: path, length: headerLength, create: false)
        guard ipc_atomic_load_u32(header.word32(at: 0)) == magic, ipc_atomic_load_u32(header.word32(at: 4)) == version else {
            throw IPCError(code: .malformedFrame, message: "\(path) is not a notify store of version \(version)")
        }
        let capacity = Int(ipc_atomic_load_u32(header.word32(at: 20)))
        guard capacity >= 4096, capacity <= 1 << 30 else {
            throw IPCError(code: .malformedFrame, message: "\(path) declares a ring of \(capacity) bytes")
        }
        return NotifyStore(mapping: try SharedMapping(path: path, length: headerLength + 2 * capacity, create: false), ringCapacity: capacity)
    }

    private init(mapping: SharedMapping, ringCapacity: Int) {
        self.mapping = mapping
        func ring(header: Int, data: Int) -> Ring {
            Ring(
                writeIndex: mapping.word64(at: header),
                readIndex: mapping.word64(at: header + 8),
                data: FutexCounter(in: mapping, at: header + 16),
                space: FutexCounter(in: mapping, at: header + 20),
                bytes: mapping.base + data,
                capacity: ringCapacity
            )
        }
        clientToServer = ring(header: 64, data: Self.headerLength)
        serverToClient = ring(header: 128, data: Self.headerLength + ringCapacity)
    }

    /// Whether the store still carries its magic and version: the other process (or anyone of
    /// this user) can overwrite the file, and a reader asleep on a futex is not woken by a plain
    /// write, so readers look at this whenever they wake, including on their periodic timeout.
    var isIntact: Bool {
        ipc_atomic_load_u32(mapping.word32(at: 0)) == Self.magic && ipc_atomic_load_u32(mapping.word32(at: 4)) == Self.version
    }

    /// The server accepts the connection: records its pid, then publishes the state.
    func accept() {
        ipc_atomic_store_u32(mapping.word32(at: 12), UInt32(bitPattern: getpid()))
        if ipc_atomic_compare_exchange_u32(stateWord, State.waiting.rawValue, State.accepted.rawValue) != 0 {
            _ = ipc_futex_wake(stateWord, Int32.max)
        }
    }

    /// Marks the connection closed and wakes both readers, so the other side notices at once.
    func close() {
        ipc_atomic_store_u32(stateWord, State.closed.rawValue)
        _ = ipc_futex_wake(stateWord, Int32.max)
        // Post rather than just wake: a reader between reading a counter and sleeping on it
        // would miss a bare wake, but not a changed counter.
        clientToServer.data.post()
        serverToClient.data.post()
        clientToServer.space.post()
        serverToClient.space.post()
    }

    /// Waits up to `timeout` for the server to accept. Returns the state then; gives up early if
    /// the server's process `serverPID` dies, so a connect never waits out a dead server.
    func awaitAcceptance(timeout: Duration, serverPID: Int32) -> State {
        let deadline = monotonicNanoseconds() &+ timeout.wholeNanoseconds
        while state == .waiting {
            let now = monotonicNanoseconds()
            guard now < deadline, ProcessWatcher.isAlive(pid: serverPID) else { break }
            _ = ipc_futex_wait(stateWord, State.waiting.rawValue, Int64(min(deadline - now, 50_000_000)))
        }
        return state
    }
}

extension NotifyStore.Ring {
    /// Copies `header` then `payload` into the ring as they fit, publishing after each copy, waiting for space
    /// until `deadline` (monotonic nanoseconds). `written` counts published bytes, so a caller
    /// can tell a clean failure from a torn frame. `isOpen` is checked while waiting.
    func write(header: UnsafeRawBufferPointer, payload: UnsafeRawBufferPointer, deadline: UInt64, written: inout Int, isOpen: () -> Bool) throws {
        let total = header.count + payload.count
        while written < total {
            let write = ipc_atomic_load_u64(writeIndex)
            let read = ipc_atomic_load_u64(readIndex)
            // The other process can write anything into the store: check before trusting it.
            let used = write &- read
            guard write >= read, used <= UInt64(capacity) else {
                throw IPCError(code: .malformedFrame, message: "ring indexes are inconsistent (write \(write), read \(read), capacity \(capacity))")
            }
            let free = capacity - Int(used)
            if free == 0 {
                let seen = space.value
                guard ipc_atomic_load_u64(readIndex) == read else { continue }
                guard isOpen() else { throw IPCError(code: .peerInvalidated, message: "the connection closed while waiting for ring space") }
                let now = monotonicNanoseconds()
                guard now < deadline else {
                    throw IPCError(code: .sendTimeout, message: "the reader left the ring full; \(written) of \(total) bytes sent before the send timeout")
                }
                space.wait(whileEqualTo: seen, timeoutNanoseconds: Int64(min(deadline - now, 100_000_000)))
                continue
            }
            var position = Int(write % UInt64(capacity))
            var copied = 0
            while copied < free, written + copied < total {
                // The next bytes come from the header until it is all in, then from the payload.
                let offset = written + copied
                let (source, start) = offset < header.count ? (header, offset) : (payload, offset - header.count)
                let count = min(source.count - start, free - copied, capacity - position)
                (bytes + position).copyMemory(from: source.baseAddress! + start, byteCount: count)
                copied += count
                position = (position + count) % capacity
            }
            // Indexes never wrap in a store's lifetime (2^64 bytes); one that would was forged.
            let (published, overflow) = write.addingReportingOverflow(UInt64(copied))
            guard !overflow else {
                throw IPCError(code: .malformedFrame, message: "ring write index \(write) would overflow")
            }
            ipc_atomic_store_u64(writeIndex, published)
            written += copied
            data.post()
        }
    }

    /// Copies published bytes into `buffer` and consumes them. Returns how many (0 if none).
    /// - Throws: ``IPCError/Code/malformedFrame`` if the indexes are impossible (a hostile or
    ///   corrupted store), before anything is read.
    func read(into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        let read = ipc_atomic_load_u64(readIndex)
        let write = ipc_atomic_load_u64(writeIndex)
        guard write >= read, write &- read <= UInt64(capacity) else {
            throw IPCError(code: .malformedFrame, message: "ring indexes are inconsistent (write \(write), read \(read), capacity \(capacity))")
        }
        let available = Int(write &- read)
        let count = min(available, buffer.count)
        guard count > 0 else { return 0 }
        let position = Int(read % UInt64(capacity))
        let first = min(count, capacity - position)
        buffer.baseAddress!.copyMemory(from: bytes + position, byteCount: first)
        if first < count {
            (buffer.baseAddress! + first).copyMemory(from: bytes, byteCount: count - first)
        }
        // `count` is at most `write - read`, so this cannot overflow: `write` bounds it.
        ipc_atomic_store_u64(readIndex, read + UInt64(count))
        space.post()
        return count
    }
}
