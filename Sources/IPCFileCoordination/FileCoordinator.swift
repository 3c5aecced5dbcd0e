import CIPCShims
import Glibc
public import IPCCore
import IPCEngine
import IPCSystem
import Synchronization
public import SystemPackage

/// An open file that coordinated reads and writes lock: the counterpart of the item an
/// `NSFileCoordinator` coordinates on.
///
/// Coordination takes an open file description lock (`F_OFD_SETLK`) on the whole file: shared for
/// a read, exclusive for a write. The kernel owns these locks, so they work across processes, and
/// it drops them when the holder's description closes, which happens however the holder dies:
/// a writer killed with SIGKILL while it holds the lock leaves nobody waiting (the TN2408
/// deadlock cannot happen). Locks belong to the open file description, not to a thread, so one
/// `CoordinatedFile` also serializes its own users within this process; two `CoordinatedFile`s
/// on the same path, even in one process, exclude each other as two processes would.
///
/// Writes change the file in place. Replacing the file (renaming another over it) would leave
/// its readers and writers locking the old one.
///
/// The descriptor closes when the last reference to the `CoordinatedFile` goes, so an operation
/// in progress on another thread never finds it closed (or reused) under it.
public final class CoordinatedFile: Sendable {
    public let path: String
    package let descriptor: CInt
    /// Taken before the kernel lock: the kernel lock does not exclude two threads that share
    /// this file's one open file description.
    private let busy = Atomic<Bool>(false)

    /// Opens the file at `path` for coordinated access.
    /// - Parameter create: create the file (mode 0600) if it does not exist.
    /// - Throws: ``IPCError/Code/transportFailure`` if it cannot be opened (the cause is the
    ///   `Errno`, `ENOENT` for a missing file that was not to be created).
    public init(path: String, create: Bool = true) throws {
        let flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0)
        do {
            descriptor = try syscallRetryingInterrupts { open(path, flags, 0o600) }
        } catch {
            throw IPCError.syscall("open", error, context: path)
        }
        self.path = path
    }

    /// Wraps a descriptor this object now owns.
    package init(descriptor: CInt, path: String) {
        self.descriptor = descriptor
        self.path = path
    }

    deinit {
        try? FileDescriptor(rawValue: descriptor).close()
    }

    /// Takes the lock, waiting until `timeout` (or the monotonic time `giveUp`, if given).
    ///
    /// Linux has no timed wait for a file lock (`F_OFD_SETLKW` waits forever, or until a signal),
    /// so a busy lock is polled: a few yields first, since holders keep it for microseconds, then
    /// sleeps that double up to a millisecond. A holder that dies releases at once, so a waiter
    /// goes on within about a millisecond of the death.
    /// - Throws: ``IPCError/Code/coordinationTimeout``; `CancellationError` once `cancelled()`
    ///   is true; ``IPCError/Code/transportFailure``.
    package func lock(exclusive: Bool, timeout: Duration, until giveUp: UInt64? = nil, cancelled: () -> Bool = { false }) throws {
        let giveUp = giveUp ?? deadline(after: timeout)
        var backoff = Backoff()
        while true {
            if try tryLock(exclusive: exclusive) { return }
            if cancelled() { throw CancellationError() }
            guard monotonicNanoseconds() < giveUp else {
                throw IPCError(
                    code: .coordinationTimeout,
                    message: "could not coordinate \(exclusive ? "writing" : "reading") \(path) within \(timeout): another reader or writer holds it"
                )
            }
            backoff.wait()
        }
    }

    /// Takes the lock if nobody holds it, without waiting.
    /// - Returns: whether it was taken.
    /// - Throws: ``IPCError/Code/transportFailure`` for a failure other than a holder.
    package func tryLock(exclusive: Bool) throws -> Bool {
        guard busy.compareExchange(expected: false, desired: true, ordering: .acquiring).exchanged else { return false }
        if ipc_ofd_lock(descriptor, Int16(exclusive ? F_WRLCK : F_RDLCK)) == 0 { return true }
        let error = Errno(rawValue: errno)
        busy.store(false, ordering: .releasing)
        guard error == .resourceTemporarilyUnavailable || error == .permissionDenied || error == .interrupted else {
            throw IPCError.syscall("fcntl(F_OFD_SETLK)", error, context: path)
        }
        return false
    }

    package func unlock() {
        _ = ipc_ofd_lock(descriptor, Int16(F_UNLCK))
        busy.store(false, ordering: .releasing)
    }
}

/// What a coordinated read or write may do with the file while it holds the lock. Valid only
/// inside the accessor it was passed to.
public struct FileAccess: CoordinatedFileContents {
    package let file: CoordinatedFile
    /// Whether this is a coordinated write (reads hold a shared lock and may not write).
    public let isWriting: Bool

    package init(file: CoordinatedFile, isWriting: Bool) {
        self.file = file
        self.isWriting = isWriting
    }

    public var path: String { file.path }

    /// The file's descriptor, for operations the accessor does not offer. Do not close it.
    public var descriptor: FileDescriptor { FileDescriptor(rawValue: file.descriptor) }

    /// The file's length in bytes.
    /// - Throws: ``IPCError/Code/transportFailure``.
    public func size() throws -> Int {
        var status = stat()
        guard fstat(file.descriptor, &status) == 0 else { throw IPCError.syscall("fstat", Errno(rawValue: errno), context: path) }
        return Int(status.st_size)
    }

    /// Reads up to `buffer.count` bytes at `offset` into `buffer`; fewer only at the end of the file.
    /// - Returns: how many bytes were read.
    /// - Throws: ``IPCError/Code/transportFailure``.
    public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws -> Int {
        var done = 0
        while done < buffer.count {
            let count: Int
            do {
                count = try syscallRetryingInterrupts {
                    pread(file.descriptor, buffer.baseAddress! + done, buffer.count - done, off_t(offset + done))
                }
            } catch {
                throw IPCError.syscall("pread", error, context: path)
            }
            if count == 0 { break }
            done += count
        }
        return done
    }

    /// Reads the bytes from `offset` to the end of the file, or `count` of them.
    /// - Throws: ``IPCError/Code/transportFailure``.
    public func read(at offset: Int = 0, count: Int? = nil) throws -> [UInt8] {
        let wanted = try count ?? max(0, size() - offset)
        var bytes = [UInt8](repeating: 0, count: wanted)
        let got = try bytes.withUnsafeMutableBytes { try read(into: $0, at: offset) }
        bytes.removeLast(wanted - got)
        return bytes
    }

    /// Writes all of `bytes` at `offset`, extending the file if needed.
    /// - Throws: ``IPCError/Code/accessDenied`` in a coordinated read; ``IPCError/Code/transportFailure``.
    public func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws {
        try checkWriting()
        var done = 0
        while done < bytes.count {
            do {
                done += try syscallRetryingInterrupts {
                    pwrite(file.descriptor, bytes.baseAddress! + done, bytes.count - done, off_t(offset + done))
                }
            } catch {
                throw IPCError.syscall("pwrite", error, context: path)
            }
        }
    }

    /// Writes all of `bytes` at `offset`.
    /// - Throws: what the buffer form of `write(_:at:)` throws.
    public func write(_ bytes: [UInt8], at offset: Int) throws {
        try bytes.withUnsafeBytes { try write($0, at: offset) }
    }

    /// Sets the file's length, dropping bytes beyond it or adding zeros.
    /// - Throws: ``IPCError/Code/accessDenied`` in a coordinated read; ``IPCError/Code/transportFailure``.
    public func truncate(to length: Int) throws {
        try checkWriting()
        do {
            _ = try syscallRetryingInterrupts { ftruncate(file.descriptor, off_t(length)) }
        } catch {
            throw IPCError.syscall("ftruncate", error, context: path)
        }
    }

    /// The whole file.
    /// - Throws: ``IPCError/Code/transportFailure``.
    public func contents() throws -> [UInt8] {
        try read()
    }

    /// Makes `bytes` the whole content of the file.
    /// - Throws: what `write(_:at:)` and ``truncate(to:)`` throw.
    public func replaceContents(with bytes: [UInt8]) throws {
        try write(bytes, at: 0)
        try truncate(to: bytes.count)
    }

    private func checkWriting() throws {
        guard isWriting else {
            throw IPCError(code: .accessDenied, message: "a coordinated read of \(path) cannot change it; coordinate a write")
        }
    }
}

/// Coordinated reads and writes: the counterpart of `NSFileCoordinator`.
///
/// A coordinated write has the file to itself (no other reader or writer, in any process,
/// runs at the same time); coordinated reads share the file with each other and never see a
/// write half done. A coordinator made with a presenter does not tell that presenter about its
/// own writes, nor ask it anything, as `NSFileCoordinator(filePresenter:)` does not.
///
/// Before it takes the file, an access asks the file's other presenters, in every process,
/// that answer coordinators (``FilePresenterCallbacks/answersCoordinators``): a read asks them
/// to save and then to relinquish to a reader, a write to relinquish to a writer. It waits for
/// every answer within its timeout; a presenter whose process dies meanwhile is not waited
/// for. Each presenter's reacquirer runs once the access is over. The presenters are reached
/// through ``PresenterDirectory`` (docs/WIRE-FORMAT.md, section 8).
///
/// Copies of a coordinator share its state: ``cancel()`` and a
/// ``prepare(forReadingItemsAt:writingItemsAt:timeout:byAccessor:)`` batch apply to all of them.
public struct FileCoordinator: FileCoordinating {
    /// The presenter this coordinator's writes are not reported to, and that it does not ask.
    public let filePresenter: FilePresenter?
    /// `nil` for the transport's own journal accesses (``journal(filePresenter:)``).
    private let state: CoordinatorState?

    public init(filePresenter: FilePresenter? = nil) {
        self.filePresenter = filePresenter
        state = CoordinatorState()
    }

    private init(journalPresenter: FilePresenter?) {
        filePresenter = journalPresenter
        state = nil
    }

    /// A coordinator for the transport's journals: it locks and brackets its writes like any
    /// other, but asks no presenters (the journals' presenters are the transport's own, which
    /// answer none) and cannot be cancelled, so that a message costs no more than the lock,
    /// with nothing allocated.
    package static func journal(filePresenter: FilePresenter? = nil) -> FileCoordinator {
        FileCoordinator(journalPresenter: filePresenter)
    }

    /// For a journal coordinator (``journal(filePresenter:)``): runs `accessor` holding the lock
    /// on `file` (shared, or `exclusive`) if nobody holds it now, else returns `nil` at once,
    /// with nothing allocated: for a reader on the event loop, which tries again later instead
    /// of waiting.
    /// - Throws: ``IPCError/Code/transportFailure``; what `accessor` throws.
    package func tryCoordinate<T>(_ file: CoordinatedFile, exclusive: Bool, byAccessor accessor: (FileAccess) throws -> T) throws -> T? {
        guard try file.tryLock(exclusive: exclusive) else { return nil }
        defer { file.unlock() }
        if exclusive { filePresenter?.beginOwnWrite() }
        defer { if exclusive { filePresenter?.endOwnWrite() } }
        return try accessor(FileAccess(file: file, isWriting: exclusive))
    }

    /// Runs `accessor` holding a shared lock on `file`.
    /// - Throws: ``IPCError/Code/coordinationTimeout`` if a writer held the file, or a presenter
    ///   did not answer, for all of `timeout`; ``IPCError/Code/presenterFailed`` if a presenter
    ///   could not save; `CancellationError` after ``cancel()``; ``IPCError/Code/accessDenied``
    ///   for a presenters directory another user can change; ``IPCError/Code/transportFailure``;
    ///   what `accessor` throws.
    public func coordinate<T>(readingItem file: CoordinatedFile, timeout: Duration, byAccessor accessor: (FileAccess) throws -> T) throws -> T {
        try access(file, exclusive: false, timeout: timeout) { try accessor(FileAccess(file: file, isWriting: false)) }
    }

    /// Runs `accessor` holding an exclusive lock on `file`.
    /// - Throws: ``IPCError/Code/coordinationTimeout`` if readers or a writer held the file, or
    ///   a presenter did not answer, for all of `timeout`; `CancellationError` after
    ///   ``cancel()``; ``IPCError/Code/accessDenied`` for a presenters directory another user can
    ///   change; ``IPCError/Code/transportFailure``; what `accessor` throws.
    public func coordinate<T>(writingItem file: CoordinatedFile, timeout: Duration, byAccessor accessor: (FileAccess) throws -> T) throws -> T {
        try access(file, exclusive: true, timeout: timeout) {
            // Bracketed while the lock is held, so that no other coordinated write falls inside.
            filePresenter?.beginOwnWrite()
            defer { filePresenter?.endOwnWrite() }
            return try accessor(FileAccess(file: file, isWriting: true))
        }
    }

    /// Opens the existing file at `path` and runs `accessor` under a coordinated read.
    /// - Throws: ``IPCError/Code/transportFailure`` if there is no such file; what
    ///   ``coordinate(readingItem:timeout:byAccessor:)`` throws.
    public func coordinate<T>(readingItemAt path: String, timeout: Duration, byAccessor accessor: (FileAccess) throws -> T) throws -> T {
        try coordinate(readingItem: CoordinatedFile(path: path, create: false), timeout: timeout, byAccessor: accessor)
    }

    /// Opens the file at `path`, creating it if needed, and runs `accessor` under a coordinated write.
    /// - Throws: what ``coordinate(writingItem:timeout:byAccessor:)`` throws.
    public func coordinate<T>(writingItemAt path: String, timeout: Duration, byAccessor accessor: (FileAccess) throws -> T) throws -> T {
        try coordinate(writingItem: CoordinatedFile(path: path), timeout: timeout, byAccessor: accessor)
    }

    /// Asks the presenters of every file once (save and relinquish to a reader for `reading`,
    /// relinquish to a writer for `writing`; a file in both counts as written), then runs
    /// `batch`: the counterpart of `prepare(forReadingItems:...)`. Accesses this coordinator
    /// makes to those files inside `batch` take their locks but do not ask again; the
    /// presenters' reacquirers run when `batch` returns or throws.
    /// - Throws: what the presenters' answers make an access throw (within `timeout` for all
    ///   of them together); what `batch` throws.
    public func prepare<T>(forReadingItemsAt reading: [String], writingItemsAt writing: [String], timeout: Duration, byAccessor batch: () throws -> T) throws -> T {
        guard let state else { return try batch() }
        let giveUp = deadline(after: timeout)
        let generation = state.generation.load(ordering: .acquiring)
        var conversations = PresenterConversations()
        let directories = (reading + writing).map { PresenterDirectory(presenting: $0).path }
        do {
            for path in reading where !writing.contains(path) {
                conversations.append(try ask(PresenterDirectory(presenting: path), exclusive: false, until: giveUp, timeout: timeout, generation: generation))
            }
            for path in writing {
                conversations.append(try ask(PresenterDirectory(presenting: path), exclusive: true, until: giveUp, timeout: timeout, generation: generation))
            }
        } catch {
            conversations.end()
            throw error
        }
        state.prepared.withLock { prepared in directories.forEach { prepared[$0, default: 0] += 1 } }
        defer {
            state.prepared.withLock { prepared in
                for directory in directories {
                    prepared[directory]! -= 1
                    if prepared[directory] == 0 { prepared[directory] = nil }
                }
            }
            conversations.end()
        }
        return try batch()
    }

    /// Fails this coordinator's accesses that are waiting now (for a lock or a presenter's
    /// answer) with `CancellationError`, within about 10 ms. Accesses already running their
    /// accessor finish; later accesses are not affected.
    public func cancel() {
        state?.generation.add(1, ordering: .acquiringAndReleasing)
    }

    private func access<T>(_ file: CoordinatedFile, exclusive: Bool, timeout: Duration, _ body: () throws -> T) throws -> T {
        guard let state else {
            try file.lock(exclusive: exclusive, timeout: timeout)
            defer { file.unlock() }
            return try body()
        }
        let giveUp = deadline(after: timeout)
        let generation = state.generation.load(ordering: .acquiring)
        var conversations = try ask(PresenterDirectory(presenting: file.path), exclusive: exclusive, until: giveUp, timeout: timeout, generation: generation)
        defer { conversations.end() }
        try file.lock(exclusive: exclusive, timeout: timeout, until: giveUp) { state.generation.load(ordering: .acquiring) != generation }
        defer { file.unlock() }
        return try body()
    }

    /// Asks the presenters behind `directory` what an access needs (none inside a batch that
    /// asked them already).
    private func ask(_ directory: PresenterDirectory, exclusive: Bool, until giveUp: UInt64, timeout: Duration, generation: Int) throws -> PresenterConversations {
        guard let state, !state.prepared.withLock({ $0[directory.path] != nil }) else { return PresenterConversations() }
        let own = filePresenter?.answeringSocket
        let cancelled = { state.generation.load(ordering: .acquiring) != generation }
        if exclusive {
            return try directory.ask(.relinquishToWriter, excluding: own, until: giveUp, timeout: timeout, cancelled: cancelled)
        }
        var saved = try directory.ask(.save, excluding: own, until: giveUp, timeout: timeout, cancelled: cancelled)
        saved.end()
        return try directory.ask(.relinquishToReader, excluding: own, until: giveUp, timeout: timeout, cancelled: cancelled)
    }
}

/// What the copies of one ``FileCoordinator`` share.
private final class CoordinatorState: Sendable {
    /// Moved on by each `cancel()`: an access that sees it move while it waits is cancelled.
    let generation = Atomic<Int>(0)
    /// The presenters directories of files inside a `prepare` batch, with how many batches hold each.
    let prepared = Mutex<[String: Int]>([:])
}

/// Waiting for something another process will release soon: yield a few times, then sleep
/// for doubling intervals of at most a millisecond.
package struct Backoff {
    private var attempt = 0

    package init() {}

    package mutating func wait() {
        defer { attempt += 1 }
        if attempt < 8 {
            sched_yield()
            return
        }
        let microseconds = min(1000, 10 << min(attempt - 8, 7))
        var interval = timespec(tv_sec: 0, tv_nsec: microseconds * 1000)
        _ = nanosleep(&interval, nil)
    }
}

extension Duration {
    /// The duration in nanoseconds, clamped to zero below and to about 570 years above.
    package var nanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0 else { return 0 }
        guard seconds < 18_000_000_000 else { return 18_000_000_000 * 1_000_000_000 }
        return UInt64(seconds) * 1_000_000_000 + UInt64(max(0, attoseconds / 1_000_000_000))
    }
}

/// A point on the monotonic clock `timeout` from now.
package func deadline(after timeout: Duration) -> UInt64 {
    monotonicNanoseconds() + timeout.nanoseconds
}

/// The time left until `deadline`, zero once it has passed.
package func remaining(until deadline: UInt64) -> Duration {
    let now = monotonicNanoseconds()
    return .nanoseconds(Int64(clamping: deadline > now ? deadline - now : 0))
}

/// This package's presenters and coordinators as a ``FileCoordinationSystem``, for the
/// conformance suite (area 9).
public struct FileCoordination: FileCoordinationSystem {
    public init() {}

    public func present(_ path: String, callbacks: FilePresenterCallbacks) throws -> FilePresenter {
        try FilePresenter(presenting: path, callbacks: callbacks)
    }

    public func coordinator(filePresenter: FilePresenter?) -> FileCoordinator {
        FileCoordinator(filePresenter: filePresenter)
    }
}
