import CIPCShims
import Glibc
import IPCCore
import IPCEngine
import IPCSystem
import Synchronization
import SystemPackage

/// What a coordinator asks a presenter over its answering socket (docs/WIRE-FORMAT.md, section 8).
enum PresenterRequest: UInt8 {
    /// `S`: save unsaved changes; the conversation ends with the answer.
    case save = 0x53
    /// `R`: relinquish to a reader; the conversation stays open until the read is over.
    case relinquishToReader = 0x52
    /// `W`: relinquish to a writer; the conversation stays open until the write is over.
    case relinquishToWriter = 0x57
}

/// A presenter's one-byte answer.
enum PresenterAnswer: UInt8 {
    /// `K`: done (saved, or relinquished).
    case done = 0x4B
    /// `E`: the save failed; the access must not go on.
    case failed = 0x45
}

/// The directory through which coordinators reach the presenters of one file that answer them:
/// `.<file name>.presenters/` beside the file, owner-only, holding one listening `AF_UNIX`
/// socket per presenter, named `<pid>.<serial>`.
///
/// Everything in it may have been put there by another process of the same user, so a
/// coordinator trusts nothing it finds: it asks only sockets owned by this user whose
/// connected peer the kernel says runs as this user, removes sockets nobody listens on (the
/// presenter died), ignores other names, and bounds every wait by the access's timeout.
struct PresenterDirectory {
    /// More entries than this are not looked at: a directory filled by someone else cannot
    /// make an access take unbounded time.
    static let maximumPresenters = 256
    /// At most this many conversations are open on one presenter at a time; more connections
    /// wait in the socket's backlog (and their coordinators within their timeouts).
    static let maximumConversations = 64

    let path: String

    /// The directory for the file at `file`.
    init(presenting file: String) {
        let slash = file.lastIndex(of: "/")
        let directory = slash.map { String(file[..<$0]) } ?? "."
        let name = slash.map { String(file[file.index(after: $0)...]) } ?? file
        path = (directory.isEmpty ? "" : directory) + "/." + name + ".presenters"
    }

    /// Checks that the directory is one this user's processes alone can change. Returns
    /// `false` if it does not exist (and `create` is false).
    /// - Throws: ``IPCError/Code/accessDenied`` if it is not a directory, belongs to another
    ///   user or is open to other users; ``IPCError/Code/transportFailure``.
    @discardableResult
    func check(create: Bool) throws -> Bool {
        var status = stat()
        if lstat(path, &status) != 0 {
            let error = Errno(rawValue: errno)
            guard error == .noSuchFileOrDirectory else { throw IPCError.syscall("lstat", error, context: path) }
            guard create else { return false }
            if mkdir(path, 0o700) != 0, errno != EEXIST {
                throw IPCError.syscall("mkdir", Errno(rawValue: errno), context: path)
            }
            return try check(create: false)
        }
        guard status.st_mode & S_IFMT == S_IFDIR else {
            throw IPCError(code: .accessDenied, message: "\(path) must be a directory (a presenters directory); it is not")
        }
        guard status.st_uid == geteuid() else {
            throw IPCError(code: .accessDenied, message: "\(path) belongs to uid \(status.st_uid), not to this user (\(geteuid()))")
        }
        guard status.st_mode & 0o077 == 0 else {
            throw IPCError(code: .accessDenied, message: "\(path) is open to other users (mode \(String(status.st_mode & 0o777, radix: 8))); it must be 0700")
        }
        return true
    }

    /// Binds a new answering socket for a presenter of this process.
    /// - Returns: the listening socket (non-blocking) and its path.
    /// - Throws: what ``check(create:)`` and `UnixSocket.listen` throw.
    func register() throws -> (listener: FileDescriptor, path: String) {
        try check(create: true)
        let socketPath = "\(path)/\(getpid()).\(Self.serial.add(1, ordering: .relaxed).newValue)"
        do {
            return (try UnixSocket.listen(path: socketPath), socketPath)
        } catch let error as IPCError where error.code == .endpointInUse {
            // Left by a dead process that had this pid; this process owns the name now.
            unlink(socketPath)
            return (try UnixSocket.listen(path: socketPath), socketPath)
        }
    }

    private static let serial = Atomic<UInt64>(0)

    /// Asks every presenter in the directory but `own` and waits for all answers.
    ///
    /// A presenter that dies before it answers (its connection ends) is not waited for.
    /// - Returns: the open conversations of a relinquish request: closing each tells its
    ///   presenter that the access is over. For ``PresenterRequest/save`` none stay open.
    /// - Throws: ``IPCError/Code/coordinationTimeout`` if a presenter has not answered by
    ///   `giveUp`; ``IPCError/Code/presenterFailed`` if one refused or answered garbage;
    ///   `CancellationError` once `cancelled()` is true; what ``check(create:)`` throws.
    func ask(_ request: PresenterRequest, excluding own: String?, until giveUp: UInt64, timeout: Duration, cancelled: () -> Bool) throws -> PresenterConversations {
        guard try check(create: false) else { return PresenterConversations() }
        var waiting: [(descriptor: FileDescriptor, pid: Int32)] = []
        var answered = PresenterConversations()
        func giveUpAll() {
            for entry in waiting { try? entry.descriptor.close() }
            answered.end()
        }
        for name in try presenterNames() where path + "/" + name != own {
            let descriptor: FileDescriptor
            switch connect(name) {
            case .connected(let connected): descriptor = connected
            case .none: continue
            case .backlogFull:
                // A listener that never accepts: it cannot be asked, and the access must not go
                // on without asking it.
                giveUpAll()
                throw IPCError(code: .coordinationTimeout, message: "the presenter socket \(path)/\(name) accepts no connection (its backlog is full)")
            }
            var byte = request.rawValue
            guard send(descriptor.rawValue, &byte, 1, CInt(MSG_NOSIGNAL)) == 1 else {
                // The presenter went away between the connect and now.
                try? descriptor.close()
                continue
            }
            waiting.append((descriptor, Int32(name.prefix { $0 != "." }) ?? 0))
        }
        while !waiting.isEmpty {
            if cancelled() {
                giveUpAll()
                throw CancellationError()
            }
            let now = monotonicNanoseconds()
            guard now < giveUp else {
                let pids = waiting.map { String($0.pid) }.joined(separator: ", ")
                giveUpAll()
                throw IPCError(code: .coordinationTimeout, message: "the presenters of \(path) in processes \(pids) did not answer within \(timeout)")
            }
            var polled = waiting.map { pollfd(fd: $0.descriptor.rawValue, events: Int16(POLLIN), revents: 0) }
            // Slices of at most 10 ms, so that cancel() is seen promptly.
            let slice = CInt(min(10, (giveUp - now + 999_999) / 1_000_000))
            guard poll(&polled, nfds_t(polled.count), slice) > 0 else { continue }
            var still: [(descriptor: FileDescriptor, pid: Int32)] = []
            var refusal: IPCError?
            for (entry, result) in zip(waiting, polled) {
                guard refusal == nil, result.revents != 0 else {
                    still.append(entry)
                    continue
                }
                switch receiveByte(entry.descriptor) {
                case .notYet:
                    still.append(entry)
                case .ended:
                    // The presenter's process died (or closed) before answering: nobody to wait for.
                    try? entry.descriptor.close()
                case .byte(PresenterAnswer.done.rawValue):
                    if request == .save { try? entry.descriptor.close() } else { answered.descriptors.append(entry.descriptor) }
                case .byte(let answer):
                    try? entry.descriptor.close()
                    refusal = IPCError(
                        code: .presenterFailed,
                        message: answer == PresenterAnswer.failed.rawValue
                            ? "the presenter of \(path) in process \(entry.pid) could not save its changes"
                            : "the presenter of \(path) in process \(entry.pid) answered 0x\(String(answer, radix: 16)), which is not an answer"
                    )
                }
            }
            waiting = still
            if let refusal {
                giveUpAll()
                throw refusal
            }
        }
        return answered
    }

    /// The names in the directory that can be presenters' sockets, at most
    /// ``maximumPresenters`` of them.
    private func presenterNames() throws -> [String] {
        guard let directory = opendir(path) else {
            let error = Errno(rawValue: errno)
            if error == .noSuchFileOrDirectory { return [] }
            throw IPCError.syscall("opendir", error, context: path)
        }
        defer { closedir(directory) }
        var names: [String] = []
        while names.count < Self.maximumPresenters, let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            let parts = name.split(separator: ".", omittingEmptySubsequences: false)
            guard parts.count == 2, parts.allSatisfy({ !$0.isEmpty && $0.count <= 20 && $0.allSatisfy(\.isASCII) && $0.allSatisfy(\.isNumber) }) else { continue }
            names.append(name)
        }
        return names
    }

    private enum Connection {
        case connected(FileDescriptor)
        /// Not a presenter of this user, or one that died.
        case none
        case backlogFull
    }

    /// Connects, without blocking, to the socket `name` if it is one of this user's and a
    /// process of this user listens on it; removes it if nobody does.
    private func connect(_ name: String) -> Connection {
        let socketPath = path + "/" + name
        var status = stat()
        guard lstat(socketPath, &status) == 0, status.st_mode & S_IFMT == S_IFSOCK, status.st_uid == geteuid() else { return .none }
        let descriptor: FileDescriptor
        do {
            descriptor = try UnixSocket.connect(path: socketPath, nonBlocking: true)
        } catch let error as IPCError where error.code == .endpointNotFound {
            // A presenter that died without removing its socket.
            unlink(socketPath)
            return .none
        } catch let error as IPCError where (error.cause as? Errno) == .resourceTemporarilyUnavailable {
            return .backlogFull
        } catch {
            return .none
        }
        guard let peer = try? UnixSocket.peerCredentials(descriptor), peer.uid == geteuid() else {
            try? descriptor.close()
            return .none
        }
        return .connected(descriptor)
    }
}

/// What a non-blocking read of one byte found.
enum ByteReceived: Equatable {
    case byte(UInt8)
    /// Nothing yet.
    case notYet
    /// End of file, or the connection failed.
    case ended
}

/// Reads one byte from a conversation without waiting.
func receiveByte(_ descriptor: FileDescriptor) -> ByteReceived {
    var byte: UInt8 = 0
    let count = recv(descriptor.rawValue, &byte, 1, CInt(MSG_DONTWAIT))
    if count == 1 { return .byte(byte) }
    return count < 0 && (errno == EAGAIN || errno == EINTR) ? .notYet : .ended
}

/// The open conversations of the presenters that relinquished a file to an access.
struct PresenterConversations {
    var descriptors: [FileDescriptor] = []

    /// Tells each presenter that the access is over (its reacquirer runs).
    mutating func end() {
        descriptors.forEach { try? $0.close() }
        descriptors = []
    }

    mutating func append(_ other: PresenterConversations) {
        descriptors += other.descriptors
    }
}
