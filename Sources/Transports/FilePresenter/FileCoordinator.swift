import CIPCShims
import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization
import SystemPackage

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
    let descriptor: CInt
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
    init(descriptor: CInt, path: String) {
        self.descriptor = descriptor
        self.path = path
    }

    deinit {
        closeDescriptor(descriptor)
    }

    /// Takes the lock, waiting until `timeout`.
    ///
    /// Linux has no timed wait for a file lock (`F_OFD_SETLKW` waits forever, or until a signal),
    /// so a busy lock is polled: a few yields first, since holders keep it for microseconds, then
    /// sleeps that double up to a millisecond. A holder that dies releases at once, so a waiter
    /// goes on within about a millisecond of the death.
    /// - Throws: ``IPCError/Code/coordinationTimeout``; ``IPCError/Code/transportFailure``.
    func lock(exclusive: Bool, timeout: Duration) throws {
        let giveUp = deadline(after: timeout)
        var backoff = Backoff()
        while true {
            if busy.compareExchange(expected: false, desired: true, ordering: .acquiring).exchanged {
                if ipc_ofd_lock(descriptor, Int16(exclusive ? F_WRLCK : F_RDLCK)) == 0 { return }
                let error = Errno(rawValue: errno)
                busy.store(false, ordering: .releasing)
                guard error == .resourceTemporarilyUnavailable || error == .permissionDenied || error == .interrupted else {
                    throw IPCError.syscall("fcntl(F_OFD_SETLK)", error, context: path)
                }
            }
            guard monotonicNanoseconds() < giveUp else {
                throw IPCError(
                    code: .coordinationTimeout,
                    message: "could not coordinate \(exclusive ? "writing" : "reading") \(path) within \(timeout): another reader or writer holds it"
                )
            }
            backoff.wait()
        }
    }

    func unlock() {
        _ = ipc_ofd_lock(descriptor, Int16(F_UNLCK))
        busy.store(false, ordering: .releasing)
    }
}

/// What a coordinated read or write may do with the file while it holds the lock. Valid only
/// inside the accessor it was passed to.
public struct FileAccess {
    let file: CoordinatedFile
    /// Whether this is a coordinated write (reads hold a shared lock and may not write).
    public let isWriting: Bool

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
/// own writes, as `NSFileCoordinator(filePresenter:)` does not.
public struct FileCoordinator: Sendable {
    /// The presenter this coordinator's writes are not reported to.
    public let filePresenter: FilePresenter?

    public init(filePresenter: FilePresenter? = nil) {
        self.filePresenter = filePresenter
    }

    /// Runs `accessor` holding a shared lock on `file`.
    /// - Throws: ``IPCError/Code/coordinationTimeout`` if a writer held the file for all of
    ///   `timeout`; ``IPCError/Code/transportFailure``; what `accessor` throws.
    public func coordinate<T>(readingItem file: CoordinatedFile, timeout: Duration, byAccessor accessor: (FileAccess) throws -> T) throws -> T {
        try file.lock(exclusive: false, timeout: timeout)
        defer { file.unlock() }
        return try accessor(FileAccess(file: file, isWriting: false))
    }

    /// Runs `accessor` holding an exclusive lock on `file`.
    /// - Throws: ``IPCError/Code/coordinationTimeout`` if readers or a writer held the file for
    ///   all of `timeout`; ``IPCError/Code/transportFailure``; what `accessor` throws.
    public func coordinate<T>(writingItem file: CoordinatedFile, timeout: Duration, byAccessor accessor: (FileAccess) throws -> T) throws -> T {
        try file.lock(exclusive: true, timeout: timeout)
        defer { file.unlock() }
        // Bracketed while the lock is held, so that no other coordinated write falls inside.
        filePresenter?.beginOwnWrite()
        defer { filePresenter?.endOwnWrite() }
        return try accessor(FileAccess(file: file, isWriting: true))
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
}

/// Waiting for something another process will release soon: yield a few times, then sleep
/// for doubling intervals of at most a millisecond.
struct Backoff {
    private var attempt = 0

    mutating func wait() {
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
    var nanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0 else { return 0 }
        guard seconds < 18_000_000_000 else { return 18_000_000_000 * 1_000_000_000 }
        return UInt64(seconds) * 1_000_000_000 + UInt64(max(0, attoseconds / 1_000_000_000))
    }
}

/// A point on the monotonic clock `timeout` from now.
func deadline(after timeout: Duration) -> UInt64 {
    monotonicNanoseconds() + timeout.nanoseconds
}

/// The time left until `deadline`, zero once it has passed.
func remaining(until deadline: UInt64) -> Duration {
    let now = monotonicNanoseconds()
    return .nanoseconds(Int64(clamping: deadline > now ? deadline - now : 0))
}
