import CIPCShims
import Glibc
public import IPCCore
import SystemPackage

/// An exclusive claim on an endpoint name, held for as long as a listener lives.
///
/// It is an `flock` on `<endpoint>.lock`: the kernel drops it when its holder dies, however it
/// dies, so a dead listener's endpoint can be reclaimed while a live listener's cannot, with no
/// window in which two processes both think they own the name.
public final class EndpointLock: Sendable {
    public let path: String
    private let fd: CInt

    /// - Throws: ``IPCError/Code/endpointInUse`` if a live process holds the endpoint.
    public init(endpoint: Endpoint) throws {
        let path = endpoint.path(suffix: ".lock")
        self.path = path
        let fd: CInt
        do {
            fd = try syscallRetryingInterrupts { open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        } catch {
            throw IPCError.syscall("open", error, context: path)
        }
        // A shared hold is a moment's (``ifUnheld(_:_:)`` tidying up after a dead listener, or
        // ``owner(of:)`` asking), never a listener's: wait it out, a little, rather than report
        // the endpoint in use.
        let patience = ContinuousClock.now + .milliseconds(200)
        while true {
            do {
                _ = try syscallRetryingInterrupts { flock(fd, LOCK_EX | LOCK_NB) }
                break
            } catch {
                if error == .wouldBlock, ContinuousClock.now < patience, Self.exclusiveHolder(of: fd) == .some(nil) {
                    usleep(1000)
                    continue
                }
                try? FileDescriptor(rawValue: fd).close()
                if error == .wouldBlock {
                    throw IPCError(code: .endpointInUse, message: "another live process listens on \(endpoint)", cause: error)
                }
                throw IPCError.syscall("flock", error, context: path)
            }
        }
        self.fd = fd
        // Record the owner so that peers without a connection to watch can find its process.
        let pid = Array(String(getpid()).utf8)
        _ = ftruncate(fd, 0)
        _ = pid.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
    }

    /// Runs `body` if no process holds `endpoint`, holding its lock meanwhile so that no
    /// listener can start in between. For removing what a dead listener left behind.
    ///
    /// The hold is shared, not exclusive: a listener's hold is the only exclusive one, so
    /// ``owner(of:)`` never takes a process tidying up for a live listener (a client connecting
    /// just then waited for that process's answer, which never came, for its whole connect
    /// timeout), and a listener starting meanwhile waits for it to end.
    public static func ifUnheld(_ endpoint: Endpoint, _ body: () -> Void) {
        let fd = open(endpoint.path(suffix: ".lock"), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { return }
        defer { try? FileDescriptor(rawValue: fd).close() }
        guard flock(fd, LOCK_SH | LOCK_NB) == 0 else { return }
        body()
        _ = flock(fd, LOCK_UN)
    }

    /// The pid of the live process that holds `endpoint`, or `nil` if nobody holds it (its
    /// listener is gone, or never was).
    ///
    /// The pid is the kernel's record of who holds the lock (`/proc/locks`), not the text in the
    /// file, which any process of this user could overwrite (a forged pid would send clients to
    /// watch the wrong process, or refuse them all); the text is read only where `/proc/locks`
    /// cannot be.
    public static func owner(of endpoint: Endpoint) -> Int32? {
        let path = endpoint.path(suffix: ".lock")
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return nil }
        defer { try? FileDescriptor(rawValue: fd).close() }
        // A shared lock is granted only when no listener holds the exclusive one (a listener
        // starting just then waits for it to be let go: see init).
        if flock(fd, LOCK_SH | LOCK_NB) == 0 {
            _ = flock(fd, LOCK_UN)
            return nil
        }
        if let holder = exclusiveHolder(of: fd) { return holder }
        var bytes = [UInt8](repeating: 0, count: 16)
        let count = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { return nil }
        return Int32(String(decoding: bytes.prefix(count), as: UTF8.self))
    }

    /// The pid holding an exclusive `flock` on the open file `fd` (`.some(nil)`: nobody), from
    /// `/proc/locks`; `nil` if that cannot be read.
    private static func exclusiveHolder(of fd: CInt) -> Int32?? {
        var status = stat()
        guard fstat(fd, &status) == 0, let holders = procLocks() else { return nil }
        return .some(flockHolder(in: holders, device: UInt64(status.st_dev), inode: UInt64(status.st_ino)))
    }

    /// The text of `/proc/locks`, read to the end (the file reports a size of 0).
    private static func procLocks() -> String? {
        let fd = open("/proc/locks", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { try? FileDescriptor(rawValue: fd).close() }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0, errno == EINTR { continue }
            if count < 0 { return nil }
            if count == 0 { break }
            bytes += chunk.prefix(count)
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The pid holding an exclusive `flock` on the file with this device and inode, from the
    /// text of `/proc/locks` (lines like `3: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF`,
    /// the device as hexadecimal major:minor).
    static func flockHolder(in locks: String, device: UInt64, inode: UInt64) -> Int32? {
        let major = ((device >> 8) & 0xfff) | ((device >> 32) & ~0xfff)
        let minor = (device & 0xff) | ((device >> 12) & ~0xff)
        for line in locks.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 6, fields[1] == "FLOCK", fields[3] == "WRITE", let pid = Int32(fields[4]) else { continue }
            let file = fields[5].split(separator: ":")
            guard file.count == 3, UInt64(file[0], radix: 16) == major, UInt64(file[1], radix: 16) == minor, UInt64(file[2]) == inode else { continue }
            return pid
        }
        return nil
    }

    /// Releases the claim. The lock file stays: unlinking it would let a second process lock a
    /// new file of the same name while a third still holds the old one.
    public func release() {
        try? FileDescriptor(rawValue: fd).close()
    }
}

/// Creating and checking group directories.
public enum GroupDirectories {
    /// Creates the directory (mode 0700) if it does not exist, then checks it as ``verify(_:)``
    /// does. Listeners call this.
    /// - Throws: ``IPCError/Code/invalidEndpoint``.
    public static func prepare(_ group: GroupDirectory) throws {
        if mkdir(group.path, 0o700) != 0, errno != EEXIST {
            throw IPCError(code: .invalidEndpoint, message: "cannot create group directory \(group.path)", cause: Errno(rawValue: errno))
        }
        try verify(group)
    }

    /// Refuses a group directory that anyone but its owner can write to (the group bit too, even
    /// with the sticky bit, which stops others removing files but not creating an endpoint's
    /// files first) or that another user owns (its owner can replace anything in it): whoever
    /// can do that could replace a live endpoint or squat on one, and a client connecting there
    /// could be talking to them. Clients call this before they connect; listeners through
    /// ``prepare(_:)``. Root's directories are accepted (root is not defended against).
    /// - Throws: ``IPCError/Code/invalidEndpoint``; ``IPCError/Code/endpointNotFound`` if the
    ///   directory does not exist.
    public static func verify(_ group: GroupDirectory) throws {
        var status = stat()
        guard stat(group.path, &status) == 0 else {
            let error = Errno(rawValue: errno)
            if error == .noSuchFileOrDirectory {
                throw IPCError(code: .endpointNotFound, message: "no group directory \(group.path)", cause: error)
            }
            throw IPCError(code: .invalidEndpoint, message: "cannot stat group directory \(group.path)", cause: error)
        }
        guard (status.st_mode & S_IFMT) == S_IFDIR else {
            throw IPCError(code: .invalidEndpoint, message: "\(group.path) is not a directory")
        }
        if status.st_mode & 0o022 != 0 {
            let who = status.st_mode & 0o002 != 0 ? "every user" : "its group (gid \(status.st_gid))"
            throw IPCError(code: .invalidEndpoint, message: "group directory \(group.path) is writable by \(who); use a directory only its owner can write (mode 0700)")
        }
        if status.st_uid != geteuid(), status.st_uid != 0 {
            throw IPCError(code: .invalidEndpoint, message: "group directory \(group.path) belongs to user \(status.st_uid), not to this process's user \(geteuid())")
        }
    }
}

extension GroupDirectories {
    /// Refuses a listener that cannot have been the one the group directory holds: the directory
    /// belongs to this process's user or to root (``verify(_:)``), so only they can make a socket
    /// in it. A client that checked the directory and then connects by path can still reach
    /// another user's socket, if the directory (or one above it) was swapped in between, by
    /// someone who can rename in its parent: the kernel's record of who listens (`SO_PEERCRED`)
    /// tells. Clients call this with the listener's credentials right after they connect.
    /// - Throws: ``IPCError/Code/accessDenied`` if the listener runs as another user.
    public static func verifyListener(_ listener: PeerCredentials, at path: String) throws {
        guard listener.uid != geteuid(), listener.uid != 0 else { return }
        throw IPCError(
            code: .accessDenied,
            message: "the listener at \(path) runs as user \(listener.uid) (pid \(listener.pid)), not as this process's user \(geteuid()) or root, who alone can listen in its group directory: the directory was swapped after it was checked; not connecting"
        )
    }
}

/// Short critical sections between processes.
public enum FileLocks {
    /// Runs `body` holding an exclusive `flock` on the existing file at `path`. The kernel drops
    /// the lock if this process dies inside `body`.
    ///
    /// With a `timeout`, a lock that another process holds for longer (any process of the user
    /// can take it and keep it) is not waited for past it: ``IPCError/Code/coordinationTimeout``.
    /// The lock is then asked for without blocking, first every 50 µs, backing off to every
    /// millisecond (a lock held for microseconds is then taken at most a millisecond late).
    public static func withExclusiveLock<T>(onFile path: String, timeout: Duration? = nil, _ body: () throws -> T) throws -> T {
        let fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { throw IPCError.syscall("open", Errno(rawValue: errno), context: path) }
        defer { try? FileDescriptor(rawValue: fd).close() }
        guard let timeout else {
            do { _ = try syscallRetryingInterrupts { flock(fd, LOCK_EX) } } catch { throw IPCError.syscall("flock", error, context: path) }
            return try body()
        }
        let deadline = ContinuousClock.now + timeout
        var pause: UInt32 = 50
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let error = errno
            guard error == EWOULDBLOCK || error == EINTR else { throw IPCError.syscall("flock", Errno(rawValue: error), context: path) }
            guard ContinuousClock.now < deadline else {
                throw IPCError(code: .coordinationTimeout, message: "another process held the lock on \(path) for more than \(timeout)")
            }
            usleep(pause)
            pause = min(pause * 2, 1_000)
        }
        return try body()
    }
}
