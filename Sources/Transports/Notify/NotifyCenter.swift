import CIPCShims
import Glibc
public import IPCCore
import IPCEngine
import IPCSystem
import Synchronization
public import SystemPackage

/// Named, payload-less notifications shared by every process of a group: the notify(3) model.
///
/// Names live in one table in `G/notify.center`, a file every process maps. A name's slot holds
/// a 32-bit post counter and a 64-bit state value. Posting increments the counter and wakes the
/// processes waiting on it with a futex; an observer compares the counter with the value it last
/// saw, so posts can coalesce (K rapid posts give between 1 and K deliveries) but are never
/// missed. No daemon: the kernel's futex queue is the only shared machinery.
///
/// Why a futex: measured on this machine's kind (docs/DESIGN-NOTES.md), a futex wake on shared
/// memory is the cheapest kernel wake-up between two processes (about 5 µs round trip on one core,
/// against about 6 µs for a pipe and 20 µs for inotify), and it needs no descriptor per observer.
public final class NotifyCenter: NamedNotificationCenter {
    /// Slots in the table; a name, once posted or observed, keeps its slot (as notify(3) names do).
    public static let capacity = 1024
    /// The longest name accepted, in UTF-8 bytes.
    public static let maximumNameLength = 111

    /// How long a call waits for the table lock (held only to claim a name or write the magic,
    /// a few microseconds): past it, another process keeps the lock, and the call fails with
    /// ``IPCError/Code/coordinationTimeout`` rather than waiting for as long as it does.
    public static let tableLockTimeout: Duration = .seconds(5)

    static let headerLength = 64
    static let slotLength = 128
    static let magic: UInt32 = 0x4E43_5452 // "NCTR"

    /// The table's file as last mapped; mapped again when the path names another file
    /// (``currentMapping()``).
    private let table: Mutex<SharedMapping>
    private let lockPath: String
    private let group: GroupDirectory

    /// Opens (creating if needed) the group's notification table.
    /// - Throws: ``IPCError/Code/invalidEndpoint`` for an unusable group directory;
    ///   ``IPCError/Code/transportFailure``.
    public init(group: GroupDirectory) throws {
        try GroupDirectories.prepare(group)
        let path = group.path + "/notify.center"
        lockPath = path
        self.group = group
        table = Mutex(try Self.map(path))
    }

    /// Maps the table at `path`, creating it if there is none, and writes its magic if it is not
    /// there.
    private static func map(_ path: String) throws -> SharedMapping {
        let mapping = try SharedMapping(path: path, length: headerLength + capacity * slotLength, create: true)
        if try readable(mapping.guardedLoad32(at: 0), path) != magic {
            try FileLocks.withExclusiveLock(onFile: path, timeout: tableLockTimeout) {
                _ = try readable(mapping.guardedStore32(magic, at: 0) ? () : nil, path)
            }
        }
        return mapping
    }

    /// The table's mapping, mapped again if another process removed the file or put another in
    /// its place since (one `lstat` a call): names then live in the file the path names now,
    /// which is where other processes that open it post.
    private func currentMapping() throws -> SharedMapping {
        let mapping = table.withLock { $0 }
        if mapping.isStillAtPath() { return mapping }
        // The directory is checked again, as when the center was made: it may be another now.
        try GroupDirectories.prepare(group)
        let fresh = try Self.map(lockPath)
        table.withLock { $0 = fresh }
        return fresh
    }

    /// `name`'s counter in the table the path names now, if `counter` is no longer it: its file
    /// was removed or replaced, or its slot no longer holds the name (the table was cut or
    /// overwritten, and the names claimed again, maybe in other slots). `nil` if it still is.
    /// For registrations and check tokens (``NotifyWatcher``), which look once a second.
    func counter(for name: String, ifMovedFrom counter: FutexCounter) throws -> FutexCounter? {
        if let mapping = counter.mapping, mapping.isStillAtPath(), try holds(Array(name.utf8), slotAt: counter.offset - 4, in: mapping) {
            return nil
        }
        return try slot(for: name).counter
    }

    /// Whether the slot at `offset` holds the name `bytes`: its tag, then its name.
    private func holds(_ bytes: [UInt8], slotAt offset: Int, in mapping: SharedMapping) throws -> Bool {
        try Self.readable(mapping.guardedLoad32(at: offset), lockPath) == Self.hash(bytes) && nameMatches(bytes, slotAt: offset, in: mapping)
    }

    /// Whether the name stored in the slot at `offset` (its length byte, then its bytes) is `bytes`.
    private func nameMatches(_ bytes: [UInt8], slotAt offset: Int, in mapping: SharedMapping) throws -> Bool {
        let name = try Self.readable(mapping.guardedBytes(at: offset + 16, count: bytes.count + 1), lockPath)
        return Int(name[0]) == bytes.count && name[1...].elementsEqual(bytes)
    }

    /// Posts `name`: every registration for it, in every process of the group, is called.
    /// - Throws: ``IPCError/Code/invalidEndpoint`` for an empty or overlong name or a full table;
    ///   ``IPCError/Code/transportFailure`` if the table was cut and cannot be restored;
    ///   ``IPCError/Code/coordinationTimeout`` if the name is new and another process keeps the
    ///   table lock (``tableLockTimeout``). Reading or setting a state, and registering, throw
    ///   the same.
    public func post(_ name: String) throws {
        guard try slot(for: name).counter.post() else { throw Self.cut(lockPath) }
    }

    /// Sets the 64-bit state value of `name`, which any process of the group can read.
    public func setState(_ value: UInt64, for name: String) throws {
        let slot = try slot(for: name)
        guard slot.mapping.guardedStore64(value, at: slot.offset + 8) else { throw Self.cut(lockPath) }
    }

    /// The 64-bit state value of `name` (0 until set).
    public func state(for name: String) throws -> UInt64 {
        let slot = try slot(for: name)
        return try Self.readable(slot.mapping.guardedLoad64(at: slot.offset + 8), lockPath)
    }

    /// The table's file was cut under its mapping by another process, and its length could not
    /// be put back (``SharedMapping/restoreLength()``).
    private static func cut(_ path: String) -> IPCError {
        IPCError(code: .transportFailure, message: "\(path) was truncated under its mapping and its length could not be restored")
    }

    /// `value`, or the error of a table that was cut and could not be restored.
    private static func readable<T>(_ value: T?, _ path: String) throws -> T {
        guard let value else { throw cut(path) }
        return value
    }

    /// Calls `handler` on Dispatch's global queue after each post of `name`, one call at a time
    /// (posts that arrive together, or during a call, may give one call). Posts made after this
    /// returns are never missed.
    public func register(_ name: String, handler: @escaping @Sendable () -> Void) throws -> NotifyRegistration {
        try NotifyRegistration(counter: slot(for: name).counter, name: name, handler: handler) { [self] in try counter(for: name, ifMovedFrom: $0) }
    }

    /// The posts of `name` as an asynchronous sequence (`notify_register_dispatch` with a
    /// queue): one element per delivery, posts that arrive before the consumer takes the last one
    /// coalesced into one. The registration lives as long as the sequence or an iterator of it;
    /// dropping them, or ending the loop, cancels it.
    public func notifications(_ name: String) throws -> NotifyNotifications {
        let (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let registration = try register(name) { continuation.yield() }
        return NotifyNotifications(registration: registration, stream: stream, continuation: continuation)
    }

    /// The posts of `name` on a descriptor this process can poll with its own event loop
    /// (`notify_register_file_descriptor`): readable after a post, until
    /// ``NotifyDescriptorRegistration/acknowledge()`` reads it.
    public func registerFileDescriptor(_ name: String) throws -> NotifyDescriptorRegistration {
        try NotifyDescriptorRegistration(center: self, name: name)
    }

    /// A token to poll instead of a handler (`notify_check`).
    public func checkToken(for name: String) throws -> NotifyCheckToken {
        NotifyCheckToken(counter: try slot(for: name).counter) { [self] in try counter(for: name, ifMovedFrom: $0) }
    }

    // MARK: - The table

    private struct Slot {
        var counter: FutexCounter
        /// The table's mapping it was found in, and its offset there (its state is 8 bytes on).
        var mapping: SharedMapping
        var offset: Int
    }

    // Slot layout: tag u32 (0 = free; else the name's hash, set last), counter u32, state u64,
    // name length u8, name bytes.
    private func slot(for name: String) throws -> Slot {
        let bytes = Array(name.utf8)
        guard !bytes.isEmpty, bytes.count <= Self.maximumNameLength else {
            throw IPCError(code: .invalidEndpoint, message: "notification names are 1-\(Self.maximumNameLength) UTF-8 bytes; got \(bytes.count)")
        }
        let tag = Self.hash(bytes)
        // A claim is made in the file the lock was taken on: if the path named another file by
        // then (removed or replaced meanwhile), the claim is made again there.
        for _ in 0..<3 {
            let mapping = try currentMapping()
            if let found = try find(bytes, tag: tag, in: mapping, claimFree: false) { return found }
            let claimed: Slot? = try withTableLock {
                guard mapping.isStillAtPath() else { return nil }
                // Another process may have added it while we waited for the lock.
                guard let slot = try find(bytes, tag: tag, in: mapping, claimFree: true) else {
                    throw IPCError(code: .invalidEndpoint, message: "the notification table of \(lockPath) is full (\(Self.capacity) names)")
                }
                return slot
            }
            if let claimed { return claimed }
        }
        throw IPCError(code: .transportFailure, message: "\(lockPath) was replaced three times while \(name) was claimed in it")
    }

    /// Probes from the name's home slot. With `claimFree` (only under the table lock), writes the
    /// name into the first free slot and publishes it by storing its tag last.
    ///
    /// The table is a file any process of the user can write: a slot whose tag is not the hash of
    /// the name it holds was not written by a center, and a claim takes it as free (a lookup
    /// passes over it), so a table overwritten with garbage heals as names are used again
    /// instead of reading as full forever.
    ///
    /// Every access to the file is guarded (``SharedMapping``): a table cut by another process is
    /// put back to its length, zeros where it was cut, and the probe goes on over what is there.
    /// - Throws: ``IPCError/Code/transportFailure`` if it was cut and cannot be put back.
    private func find(_ bytes: [UInt8], tag: UInt32, in mapping: SharedMapping, claimFree: Bool) throws -> Slot? {
        let home = Int(tag) % Self.capacity
        for probe in 0..<Self.capacity {
            let offset = Self.headerLength + ((home + probe) % Self.capacity) * Self.slotLength
            let stored = try Self.readable(mapping.guardedLoad32(at: offset), lockPath)
            let slot = Slot(counter: FutexCounter(in: mapping, at: offset + 4), mapping: mapping, offset: offset)
            let free = try stored == 0 || (claimFree && !holdsItsOwnName(offset, tag: stored, in: mapping))
            if free {
                guard claimFree else { return nil }
                // A slot no center claimed has no counter or state of a name: whatever is there
                // (garbage written into the file) is replaced, so a new name reads state 0. The
                // count starts at a random value, with the waiters flag set: a registration made
                // before the table lost its names (cut or overwritten by another process) still
                // waits in this slot with the count it last saw, and the first post must change
                // the count from that and wake it. The tag is stored last.
                let count = UInt32.random(in: 0...(~IPC_FUTEX_COUNTER_WAITERS)) | IPC_FUTEX_COUNTER_WAITERS
                guard mapping.guardedStore32(count, at: offset + 4), mapping.guardedStore64(0, at: offset + 8),
                    mapping.guardedWrite([UInt8(bytes.count)] + bytes, at: offset + 16),
                    mapping.guardedStore32(tag, at: offset)
                else { throw Self.cut(lockPath) }
                return slot
            }
            if stored == tag, try nameMatches(bytes, slotAt: offset, in: mapping) { return slot }
        }
        return nil
    }

    /// Whether the slot at `offset` holds a name whose hash is `tag`, as every claimed slot does.
    private func holdsItsOwnName(_ offset: Int, tag: UInt32, in mapping: SharedMapping) throws -> Bool {
        let nameArea = try Self.readable(mapping.guardedBytes(at: offset + 16, count: Self.maximumNameLength + 1), lockPath)
        let length = Int(nameArea[0])
        guard length >= 1, length <= Self.maximumNameLength else { return false }
        return Self.hash(Array(nameArea[1...length])) == tag
    }

    private func withTableLock<T>(_ body: () throws -> T) throws -> T {
        try FileLocks.withExclusiveLock(onFile: lockPath, timeout: Self.tableLockTimeout, body)
    }

    /// FNV-1a of the name, never 0 (0 marks a free slot).
    private static func hash(_ bytes: [UInt8]) -> UInt32 {
        var hash: UInt32 = 0x811c_9dc5
        for byte in bytes {
            hash ^= UInt32(byte)
            hash &*= 0x0100_0193
        }
        return hash == 0 ? 1 : hash
    }
}

/// Polls a name for posts without a handler, like `notify_check`.
public final class NotifyCheckToken: Sendable {
    /// The name's counter, and the count the last check saw.
    private let state: Mutex<(counter: FutexCounter, seen: UInt32?)>
    /// The name's counter in the table the path names now, if the token's is no longer it.
    private let relocate: @Sendable (FutexCounter) throws -> FutexCounter?
    /// When the token last looked whether its counter is still its name's.
    private let lastLook = Mutex(ContinuousClock.now)

    init(counter: FutexCounter, relocate: @escaping @Sendable (FutexCounter) throws -> FutexCounter?) {
        state = Mutex((counter, nil))
        self.relocate = relocate
    }

    /// `true` on the first call, then whenever the name was posted since the previous call, and
    /// once when another process removed the table's file or put another in its place, or the
    /// name's slot was lost (posts are then made in the name's slot in the file the path names
    /// now, where this token looks from then on). That is looked at once a second at most.
    public func check() -> Bool {
        let look = lastLook.withLock { last in
            guard ContinuousClock.now - last >= NotifyWatcher.fileCheckPeriod else { return false }
            last = .now
            return true
        }
        return state.withLock { state in
            if look, let moved = try? relocate(state.counter) {
                state = (moved, moved.value)
                return true
            }
            let now = state.counter.value
            defer { state.seen = now }
            return state.seen != now
        }
    }
}

/// A handler registered for a name. After ``cancel()`` returns, the handler is not running and
/// never runs again; cancelling from inside the handler is allowed. Releasing the last
/// reference to a registration cancels it, as releasing a notify(3) token does. The handler is
/// called on Dispatch's global queue, one call at a time per registration; no thread is kept per
/// registration (``NotifyWatcher``: one per 127 registrations of the process waits for them all).
public final class NotifyRegistration: NamedNotificationRegistration {
    public let name: String
    private let observation: NotifyObservation

    init(counter: FutexCounter, name: String, handler: @escaping @Sendable () -> Void, relocate: @escaping @Sendable (FutexCounter) throws -> FutexCounter?) throws {
        self.name = name
        observation = NotifyObservation(counter: counter, handler: handler, relocate: relocate)
        try NotifyWatcher.shared.add(observation)
    }

    deinit {
        NotifyWatcher.shared.remove(observation)
    }

    public func cancel() {
        NotifyWatcher.shared.remove(observation)
    }

    /// Stops calls to the handler until ``resume()`` (`notify_suspend`): posts made meanwhile
    /// are not lost but coalesce into one call on resume. A handler running now finishes.
    public func suspend() {
        NotifyWatcher.shared.setSuspended(observation, true)
    }

    /// Resumes calls after ``suspend()`` (`notify_resume`): if the name was posted while
    /// suspended, the handler is called once, at once.
    public func resume() {
        NotifyWatcher.shared.setSuspended(observation, false)
    }
}

/// The posts of a name as an `AsyncSequence` (``NotifyCenter/notifications(_:)``): one element per
/// delivery; the registration is cancelled once neither the sequence nor an iterator of it is
/// held, or by ``cancel()``, which also ends every loop over it.
public struct NotifyNotifications: AsyncSequence, Sendable {
    public typealias Element = Void
    let registration: NotifyRegistration
    let stream: AsyncStream<Void>
    let continuation: AsyncStream<Void>.Continuation

    /// Stops deliveries until ``resume()``; posts meanwhile give one element on resume.
    public func suspend() { registration.suspend() }

    public func resume() { registration.resume() }

    /// Cancels the registration and ends the sequence: a loop over it finishes.
    public func cancel() {
        registration.cancel()
        continuation.finish()
    }

    public func makeAsyncIterator() -> Iterator {
        Iterator(registration: registration, base: stream.makeAsyncIterator())
    }

    public struct Iterator: AsyncIteratorProtocol {
        /// Held so that the registration lives as long as the loop that iterates.
        let registration: NotifyRegistration
        var base: AsyncStream<Void>.Iterator

        public mutating func next() async -> Void? {
            await base.next()
        }
    }
}

/// Posts of a name delivered to a descriptor (``NotifyCenter/registerFileDescriptor(_:)``): an
/// eventfd, non-blocking, that becomes readable after a post; poll it with any event loop (its
/// ``descriptor``), then call ``acknowledge()``. Posts between two acknowledgements coalesce.
/// Cancelling, or releasing the last reference, stops deliveries and closes the descriptor.
public final class NotifyDescriptorRegistration: Sendable {
    public let name: String
    /// The descriptor to poll for reading. Valid until ``cancel()`` or release.
    public var descriptor: FileDescriptor { FileDescriptor(rawValue: fd) }
    private let fd: CInt
    private let registration: NotifyRegistration
    private let closed = Mutex(false)

    init(center: NotifyCenter, name: String) throws {
        let descriptor = eventfd(0, CInt(EFD_NONBLOCK | EFD_CLOEXEC))
        guard descriptor >= 0 else {
            throw IPCError(code: .transportFailure, message: "eventfd for notifications of \(name) failed: errno \(errno)")
        }
        do {
            registration = try center.register(name) {
                var one: UInt64 = 1
                // EAGAIN only at a counter of 2^64 - 2 posts unacknowledged: readable anyway.
                _ = write(descriptor, &one, 8)
            }
        } catch {
            close(descriptor)
            throw error
        }
        self.name = name
        self.fd = descriptor
    }

    deinit {
        cancel()
    }

    /// Reads the descriptor: whether the name was posted since the last acknowledgement. After
    /// it, the descriptor is not readable until the next post.
    public func acknowledge() -> Bool {
        closed.withLock { closed in
            guard !closed else { return false }
            var count: UInt64 = 0
            return read(fd, &count, 8) == 8 && count > 0
        }
    }

    /// Suspends deliveries (posts meanwhile give one on ``resume()``).
    public func suspend() { registration.suspend() }

    public func resume() { registration.resume() }

    /// Stops deliveries and closes the descriptor; later calls do nothing.
    public func cancel() {
        // After cancel returns the handler never runs again, so it never writes to a closed
        // (or reused) descriptor number.
        registration.cancel()
        closed.withLock { closed in
            guard !closed else { return }
            closed = true
            close(fd)
        }
    }
}
