import CIPCShims
import Glibc
public import IPCCore
import IPCSystem
import Synchronization

/// MMWormhole's mailbox between the processes of a group: the last message passed under an
/// identifier is stored in the group directory, where a process that was not running when it
/// was passed reads it later, and the listeners of that identifier, in every process, are told.
///
/// Storage: `G/wormhole/<identifier>.message` (the directory mode 0700, the files 0600), each a
/// 16-byte header (`IPWH`, version 1, three zero bytes, the payload's length as a big-endian
/// UInt64), the payload, and its FNV-1a 64-bit hash, big-endian. A message is written to a new
/// temporary file, flushed, and renamed over the old one, so a reader sees the old message or
/// the new one, never part of either, and a message stays after its sender dies. Then the
/// notification `wormhole.<identifier>` is posted on the wormhole's ``NamedNotificationCenter``
/// (any implementation: the notify transport's `NotifyCenter` is the Darwin-notification
/// counterpart MMWormhole uses).
///
/// Everything in the directory is read as hostile: a file that is not a regular file of this
/// user, has a bad header, a length above ``maximumMessageLength`` or other than the file's
/// size, or a wrong hash gives a typed ``IPCError``, never a crash or a torn message.
public final class Wormhole<Center: NamedNotificationCenter>: WormholeMailbox {
    /// The longest identifier, in bytes: letters, digits, `.`, `-` and `_` only.
    public static var maximumIdentifierLength: Int { 64 }

    public let directory: String
    public let center: Center
    /// The largest payload passed or read; a stored file announcing more is refused unread.
    public let maximumMessageLength: Int
    /// Listeners by identifier: their registrations and the streams they feed.
    private let listeners = Mutex<[String: [Listener]]>([:])

    private struct Listener: Sendable {
        var registration: Center.Registration
        var continuation: AsyncStream<[UInt8]>.Continuation
    }

    /// Opens the wormhole of `group` (creating `G/wormhole` if needed) over `center`.
    /// - Throws: ``IPCError/Code/invalidEndpoint`` for a group directory or wormhole directory
    ///   that is not this user's alone (see `GroupDirectories`), or that cannot be created.
    public init(group: GroupDirectory, center: Center, maximumMessageLength: Int = 16 << 20) throws {
        try GroupDirectories.prepare(group)
        let directory = group.path + "/wormhole"
        try GroupDirectories.prepare(GroupDirectory(path: directory))
        self.directory = directory
        self.center = center
        self.maximumMessageLength = maximumMessageLength
    }

    deinit {
        for listener in listeners.withLock({ $0.values.flatMap { $0 } }) {
            listener.registration.cancel()
            listener.continuation.finish()
        }
    }

    // MARK: Passing and reading

    /// Stores `payload` as the message of `identifier` (replacing the previous one, atomically)
    /// and tells its listeners in every process.
    /// - Throws: ``IPCError/Code/invalidEndpoint`` for a bad identifier;
    ///   ``IPCError/Code/payloadTooLarge``; ``IPCError/Code/transportFailure`` if the file cannot
    ///   be written (nothing is then replaced).
    public func passMessage(_ payload: [UInt8], identifier: String) throws {
        try Self.check(identifier)
        guard payload.count <= maximumMessageLength else {
            throw IPCError(code: .payloadTooLarge, message: "a wormhole message of \(payload.count) bytes is above the maximum of \(maximumMessageLength)")
        }
        let final = path(of: identifier)
        let temporary = directory + "/.\(identifier).\(getpid()).\(UInt64.random(in: 0...UInt64.max)).tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw failure("create \(temporary)") }
        var bytes = Self.header(length: payload.count)
        bytes += payload
        bytes += withUnsafeBytes(of: Self.hash(payload).bigEndian, Array.init)
        do {
            var written = 0
            while written < bytes.count {
                let count = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + written, $0.count - written) }
                if count < 0, errno == EINTR { continue }
                guard count > 0 else { throw failure("write \(temporary)") }
                written += count
            }
            guard fsync(fd) == 0 else { throw failure("fsync \(temporary)") }
            close(fd)
            guard rename(temporary, final) == 0 else { throw failure("rename \(temporary) to \(final)") }
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
        try center.post(Self.notificationName(identifier))
    }

    /// The last message passed under `identifier` by any process of the group, or `nil` if none
    /// is stored.
    /// - Throws: ``IPCError/Code/invalidEndpoint`` for a bad identifier, or a stored file that is
    ///   not a regular file of this user; ``IPCError/Code/frameTooLarge`` for a stored length
    ///   above the maximum; ``IPCError/Code/malformedPayload`` for a bad header, a length other
    ///   than the file's or a wrong hash.
    public func message(withIdentifier identifier: String) throws -> [UInt8]? {
        try Self.check(identifier)
        let path = path(of: identifier)
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        if fd < 0 {
            if errno == ENOENT { return nil }
            if errno == ELOOP { throw IPCError(code: .invalidEndpoint, message: "\(path) is a symbolic link, not a wormhole message") }
            throw failure("open \(path)")
        }
        defer { close(fd) }
        var status = stat()
        guard fstat(fd, &status) == 0 else { throw failure("fstat \(path)") }
        guard status.st_mode & S_IFMT == S_IFREG else {
            throw IPCError(code: .invalidEndpoint, message: "\(path) is not a regular file")
        }
        guard status.st_uid == geteuid() else {
            throw IPCError(code: .invalidEndpoint, message: "\(path) belongs to user \(status.st_uid), not to this process's user \(geteuid())")
        }
        let size = Int(status.st_size)
        guard size >= 24 else {
            throw IPCError(code: .malformedPayload, message: "\(path) holds \(size) bytes, less than a wormhole message's header and hash")
        }
        var header = [UInt8](repeating: 0, count: 16)
        try readExactly(fd, into: &header, at: 0, path: path)
        guard header[0..<8] == Self.header(length: 0)[0..<8] else {
            throw IPCError(code: .malformedPayload, message: "\(path) does not start with a version 1 wormhole header")
        }
        let announced = header[8..<16].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        guard announced <= UInt64(maximumMessageLength) else {
            throw IPCError(code: .frameTooLarge, message: "\(path) announces \(announced) bytes, above the maximum of \(maximumMessageLength)")
        }
        guard Int(announced) + 24 == size else {
            throw IPCError(code: .malformedPayload, message: "\(path) announces \(announced) bytes but holds \(size - 24)")
        }
        var payload = [UInt8](repeating: 0, count: Int(announced))
        try readExactly(fd, into: &payload, at: 16, path: path)
        var trailer = [UInt8](repeating: 0, count: 8)
        try readExactly(fd, into: &trailer, at: 16 + Int(announced), path: path)
        guard trailer.reduce(UInt64(0), { $0 << 8 | UInt64($1) }) == Self.hash(payload) else {
            throw IPCError(code: .malformedPayload, message: "\(path): the message's hash does not match its bytes")
        }
        return payload
    }

    /// Removes the message of `identifier` (nothing if there is none).
    public func clearMessageContents(forIdentifier identifier: String) throws {
        try Self.check(identifier)
        guard unlink(path(of: identifier)) == 0 || errno == ENOENT else { throw failure("unlink \(path(of: identifier))") }
    }

    /// Removes every stored message of the group (and temporary files a killed sender left).
    public func clearAllMessageContents() throws {
        guard let handle = opendir(directory) else { throw failure("open \(directory)") }
        defer { closedir(handle) }
        while let entry = readdir(handle) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard name.hasSuffix(".message") || (name.hasPrefix(".") && name.hasSuffix(".tmp")) else { continue }
            guard unlink(directory + "/" + name) == 0 || errno == ENOENT else { throw failure("unlink \(directory)/\(name)") }
        }
    }

    // MARK: Listening

    /// The messages passed under `identifier` from now on, by any process of the group: after
    /// each notification, the message then stored. Passes that come faster than the listener
    /// reads coalesce (it gets the latest, as MMWormhole's listeners do); a stored file that is
    /// not a valid message is skipped. Ends at ``stopListening(forIdentifier:)``.
    /// - Throws: ``IPCError/Code/invalidEndpoint`` for a bad identifier.
    public func listen(forIdentifier identifier: String) throws -> AsyncStream<[UInt8]> {
        try Self.check(identifier)
        let (stream, continuation) = AsyncStream.makeStream(of: [UInt8].self, bufferingPolicy: .bufferingNewest(1))
        let registration = try center.register(Self.notificationName(identifier)) { [weak self] in
            guard let self, let message = try? message(withIdentifier: identifier) else { return }
            continuation.yield(message)
        }
        listeners.withLock { $0[identifier, default: []].append(Listener(registration: registration, continuation: continuation)) }
        return stream
    }

    /// Ends every stream ``listen(forIdentifier:)`` returned for `identifier` in this wormhole.
    public func stopListening(forIdentifier identifier: String) {
        for listener in listeners.withLock({ $0.removeValue(forKey: identifier) ?? [] }) {
            listener.registration.cancel()
            listener.continuation.finish()
        }
    }

    // MARK: Helpers

    static func notificationName(_ identifier: String) -> String { "wormhole." + identifier }

    private func path(of identifier: String) -> String { directory + "/" + identifier + ".message" }

    private static func check(_ identifier: String) throws {
        let bytes = Array(identifier.utf8)
        let allowed = bytes.allSatisfy { (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0) || $0 == 0x2E || $0 == 0x2D || $0 == 0x5F }
        guard !bytes.isEmpty, bytes.count <= maximumIdentifierLength, allowed, bytes[0] != 0x2E else {
            throw IPCError(code: .invalidEndpoint, message: "a wormhole identifier is 1-\(maximumIdentifierLength) letters, digits, '.', '-' or '_', not starting with '.'; got \(identifier.debugDescription)")
        }
    }

    private static func header(length: Int) -> [UInt8] {
        [0x49, 0x50, 0x57, 0x48, 1, 0, 0, 0] + withUnsafeBytes(of: UInt64(length).bigEndian, Array.init)
    }

    /// FNV-1a, 64 bits.
    static func hash(_ bytes: [UInt8]) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes {
            hash ^= UInt64(byte)
            hash &*= 0x0100_0000_01b3
        }
        return hash
    }

    private func readExactly(_ fd: CInt, into buffer: inout [UInt8], at offset: Int, path: String) throws {
        var done = 0
        while done < buffer.count {
            let count = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, $0.count - done, off_t(offset + done)) }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else {
                throw IPCError(code: .malformedPayload, message: "\(path) ended \(offset + done) bytes in, inside a wormhole message")
            }
            done += count
        }
    }

    private func failure(_ what: String) -> IPCError {
        IPCError(code: .transportFailure, message: "wormhole: cannot \(what): errno \(errno) (\(String(cString: strerror(errno))))")
    }
}
