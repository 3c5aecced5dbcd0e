import CIPCShims
import Glibc
import IPCCore
public import SystemPackage

/// Listening sockets handed over by a launcher: the systemd socket-activation protocol
/// (`sd_listen_fds(3)`), which systemd itself and `systemd-socket-activate(1)` speak. The
/// launcher binds and listens, then starts the service with the sockets as descriptors 3, 4, ...
/// and sets `LISTEN_PID` (the service's pid), `LISTEN_FDS` (how many) and, optionally,
/// `LISTEN_FDNAMES` (colon-separated names). Everything in them is checked: the environment is
/// the launcher's, but the descriptors could be anything.
public enum SocketActivation {
    /// The first descriptor passed (`SD_LISTEN_FDS_START`).
    public static let firstDescriptor = FileDescriptor(rawValue: 3)
    /// More than this many is not a launcher's hand-over: refused.
    public static let maximumDescriptors = 256

    /// What the launcher's environment says, parsed and checked against this process.
    public struct Handover: Sendable, Equatable {
        /// The descriptors passed, in order: ``firstDescriptor`` and the ones after it.
        public var descriptors: [FileDescriptor]
        /// Their names (`LISTEN_FDNAMES`), one for each descriptor, if the launcher gave them.
        public var names: [String]?
    }

    /// Reads `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` from `environment`.
    /// - Returns: `nil` if `LISTEN_FDS` is not set (the process was not socket-activated).
    /// - Throws: ``IPCError/Code/invalidEndpoint`` if the variables are malformed, if
    ///   `LISTEN_PID` is not `pid` (they were meant for another process: a parent's, inherited),
    ///   or if the names do not match the count.
    /// - Parameter pid: the process the sockets must be meant for; `nil` for this one.
    public static func handover(environment: [String: String], pid: Int32? = nil) throws -> Handover? {
        let pid = pid ?? getpid()
        guard let countText = environment["LISTEN_FDS"] else { return nil }
        guard let pidText = environment["LISTEN_PID"] else {
            throw IPCError(code: .invalidEndpoint, message: "socket activation: LISTEN_FDS is set but LISTEN_PID is not")
        }
        guard let listenPID = pid_t(pidText), listenPID > 0 else {
            throw IPCError(code: .invalidEndpoint, message: "socket activation: LISTEN_PID is not a process id: \(pidText.prefix(40))")
        }
        guard listenPID == pid else {
            throw IPCError(code: .invalidEndpoint, message: "socket activation: LISTEN_PID is \(listenPID), not this process (\(pid)): the sockets were passed to another process")
        }
        guard let count = Int(countText), (1...maximumDescriptors).contains(count) else {
            throw IPCError(code: .invalidEndpoint, message: "socket activation: LISTEN_FDS must be 1 to \(maximumDescriptors), got \(countText.prefix(40))")
        }
        var names: [String]?
        if let nameText = environment["LISTEN_FDNAMES"] {
            let split = nameText.split(separator: ":", omittingEmptySubsequences: false).map(String.init)
            guard split.count == count else {
                throw IPCError(code: .invalidEndpoint, message: "socket activation: LISTEN_FDNAMES names \(split.count) descriptors, LISTEN_FDS says \(count)")
            }
            names = split
        }
        let descriptors = (0..<CInt(count)).map { FileDescriptor(rawValue: firstDescriptor.rawValue + $0) }
        return Handover(descriptors: descriptors, names: names)
    }

    /// The process's own environment, as ``handover(environment:pid:)`` reads it.
    public static func processEnvironment() -> [String: String] {
        var result: [String: String] = [:]
        for key in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
            if let value = getenv(key) { result[key] = String(cString: value) }
        }
        return result
    }

    /// Takes the inherited listening socket bound to `path`: an `AF_UNIX` stream socket in the
    /// listening state whose bound name is `path` (compared after resolving the directories, so
    /// a launcher given a relative or symlinked path is recognised). The socket is made
    /// close-on-exec and non-blocking; the caller owns it. The variables are then removed from
    /// the environment, so children do not take them for theirs (as `sd_listen_fds(1)` does).
    /// - Throws: ``IPCError/Code/invalidEndpoint`` if the process was not socket-activated,
    ///   the environment is not this process's, or no passed descriptor is a listening
    ///   `AF_UNIX` stream socket bound to `path` (the message says what each one is).
    public static func takeListeningSocket(boundTo path: String, kind: UnixSocket.Kind = .stream) throws -> FileDescriptor {
        guard let handover = try handover(environment: processEnvironment()) else {
            throw IPCError(code: .invalidEndpoint, message: "socket activation: LISTEN_FDS is not set; start the service from a launcher that passes the listening socket (systemd, or systemd-socket-activate -l \(path))")
        }
        var seen: [String] = []
        for descriptor in handover.descriptors {
            let fd = descriptor.rawValue
            switch describe(fd, kind: kind, expecting: path) {
            case .match:
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
                let flags = fcntl(fd, F_GETFL)
                guard flags >= 0, fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0 else {
                    throw IPCError.syscall("fcntl(O_NONBLOCK)", Errno(rawValue: errno), context: "inherited descriptor \(fd)")
                }
                for key in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] { unsetenv(key) }
                return descriptor
            case .other(let what):
                seen.append("\(fd): \(what)")
            }
        }
        throw IPCError(code: .invalidEndpoint, message: "socket activation: no inherited descriptor is a listening AF_UNIX \(kind == .stream ? "stream" : "sequenced-packet") socket bound to \(path) (\(seen.joined(separator: "; ")))")
    }

    private enum Description {
        case match
        case other(String)
    }

    private static func describe(_ fd: CInt, kind: UnixSocket.Kind, expecting path: String) -> Description {
        var status = stat()
        guard fstat(fd, &status) == 0 else { return .other("not open (\(Errno(rawValue: errno)))") }
        guard status.st_mode & S_IFMT == S_IFSOCK else { return .other("not a socket") }
        guard let domain = socketOption(fd, SO_DOMAIN), domain == AF_UNIX else { return .other("not an AF_UNIX socket") }
        guard let type = socketOption(fd, SO_TYPE), type == kind.type else { return .other(kind == .stream ? "not a stream socket" : "not a sequenced-packet socket") }
        guard socketOption(fd, SO_ACCEPTCONN) == 1 else { return .other("not listening") }
        guard let bound = boundPath(fd) else { return .other("an unnamed socket") }
        guard samePath(bound, path) else { return .other("bound to \(bound)") }
        return .match
    }

    private static func socketOption(_ fd: CInt, _ option: CInt) -> CInt? {
        var value: CInt = 0
        var length = socklen_t(MemoryLayout<CInt>.size)
        guard getsockopt(fd, SOL_SOCKET, option, &value, &length) == 0 else { return nil }
        return value
    }

    private static func boundPath(_ fd: CInt) -> String? {
        var address = sockaddr_un()
        var length = socklen_t(MemoryLayout<sockaddr_un>.size)
        let result = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard result == 0, address.sun_family == sa_family_t(AF_UNIX) else { return nil }
        let pathLength = Int(length) - MemoryLayout<sa_family_t>.size
        guard pathLength > 0 else { return nil }
        return withUnsafeBytes(of: &address.sun_path) { raw in
            let bytes = raw.prefix(min(pathLength, raw.count))
            // An abstract name starts with NUL: never a path.
            guard let first = bytes.first, first != 0 else { return nil }
            return String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
        }
    }

    /// Whether two paths name the same directory entry: the same final name in directories that
    /// resolve to the same place.
    private static func samePath(_ a: String, _ b: String) -> Bool {
        if a == b { return true }
        func split(_ path: String) -> (directory: String, name: Substring)? {
            guard let slash = path.lastIndex(of: "/") else { return (".", Substring(path)) }
            let directory = slash == path.startIndex ? "/" : String(path[..<slash])
            return (directory, path[path.index(after: slash)...])
        }
        guard let (directoryA, nameA) = split(a), let (directoryB, nameB) = split(b), nameA == nameB else { return false }
        guard let resolvedA = realpath(directoryA, nil), let resolvedB = realpath(directoryB, nil) else { return false }
        defer { free(resolvedA); free(resolvedB) }
        return strcmp(resolvedA, resolvedB) == 0
    }
}
