import Dispatch
import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization

/// Messaging through files in the group directory, in the `NSFilePresenter` /
/// `NSFileCoordinator` pattern: a writer makes a coordinated (locked) write to a file, and the
/// file's presenter is told that it changed and reads it under a coordinated read.
///
/// Files, for an endpoint `<group>/<name>`:
/// - `<name>.lock`: the listener's claim on the name (an `flock` held while it lives, with its
///   pid), so a dead listener's name can be taken over and a live one's cannot.
/// - `<name>.inbox`: the listener's journal, which every client appends to.
/// - `<name>.<pid>-<serial>.journal`: one per client, created by the client, which the listener
///   appends to.
///
/// A journal (specified in `docs/WIRE-FORMAT.md`, section 5) is a header and then records, each
/// a 12-byte record header naming the sender and, for messages, a binary frame. A writer takes
/// the journal's exclusive open file description lock, appends its record at the committed end,
/// and then moves the committed end past it; the reader, told by inotify that the journal
/// changed, takes the shared lock, reads from the offset it last consumed up to the committed
/// end, and delivers the records in order, each once.
///
/// Guarantees:
/// - A writer killed in the middle of a record (even while it holds the lock: the kernel drops
///   the lock with the process) leaves a partial record past the committed end: it is never
///   delivered, and the next writer's record overwrites it and arrives.
/// - Journals do not grow without bound: once the reader has consumed half the capacity (at most
///   1 MiB) it moves the unread records to the start and shortens the file; writers wait while
///   a journal holds more than its capacity (16 MiB by default) and report
///   ``IPCError/Code/sendTimeout`` if it stays full.
/// - Each side watches the other's process (a pidfd), so a peer's death invalidates the
///   connection once, pending requests fail with ``IPCError/Code/peerInvalidated``, and the
///   survivor removes the dead side's journal.
/// - On invalidation or close a side removes its own files and tells the other with a goodbye
///   record.
///
/// Limits: records carry the sender's pid as the sender states it (the group directory is the
/// trust boundary, as with message ports), so there is no accept filter; the journal owner's uid
/// and gid are read from the file and are kernel-verified.
public struct FilePresenterTransport: MessageTransport {
    public typealias Connection = FilePresenterConnection
    public typealias Listener = FilePresenterListener

    /// The bytes of unread records a journal this side reads may hold before writers wait.
    public var journalCapacity: Int
    /// How long a connect waits for the listener's welcome.
    public var connectTimeout: Duration

    public init(journalCapacity: Int = 16 << 20, connectTimeout: Duration = .seconds(5)) {
        self.journalCapacity = min(max(journalCapacity, 4096), Int(UInt32.max))
        self.connectTimeout = connectTimeout
    }

    public var name: String { "file-presenter" }

    public var capabilities: TransportCapabilities {
        TransportCapabilities(
            maximumPayloadLength: ConnectionOptions.defaults.maximumPayloadLength,
            preservesOrder: true,
            supportsRequestReply: true,
            supportsBroadcast: true,
            // A record's sender pid is what the sender wrote, not what the kernel verified.
            supportsAcceptFilter: false,
            peerDeathDetection: .processWatch
        )
    }

    /// - Throws: what ``MessageTransport/listen(at:options:acceptFilter:)`` documents. An accept
    ///   filter is refused with ``IPCError/Code/unsupportedOperation``.
    public func listen(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> FilePresenterListener {
        guard acceptFilter == nil else {
            throw IPCError(code: .unsupportedOperation, message: "file presenter endpoints cannot filter clients: a record carries no kernel-verified sender")
        }
        return try FilePresenterListener(endpoint: endpoint, options: options, capacity: journalCapacity)
    }

    /// - Throws: ``IPCError/Code/endpointNotFound`` if no live process listens on the endpoint or
    ///   it did not welcome us within ``connectTimeout``; ``IPCError/Code/transportFailure``.
    public func connect(to endpoint: Endpoint, options: ConnectionOptions) throws -> FilePresenterConnection {
        try GroupDirectories.verify(endpoint.group)
        guard let listenerPID = EndpointLock.owner(of: endpoint), ProcessWatcher.isAlive(pid: listenerPID) else {
            throw IPCError(code: .endpointNotFound, message: "no live process listens on \(endpoint)")
        }
        let loop = try EventLoop.shared()
        let inbox: JournalFile
        do {
            inbox = try JournalFile(CoordinatedFile(path: JournalNames.inbox(endpoint), create: false), timeout: connectTimeout)
            guard inbox.header.ownerPID == listenerPID else {
                throw IPCError(code: .endpointNotFound, message: "the inbox belongs to process \(inbox.header.ownerPID)")
            }
        } catch {
            throw IPCError(code: .endpointNotFound, message: "\(endpoint) has no inbox of its live listener \(listenerPID)", cause: error as? IPCError)
        }
        var status = stat()
        _ = fstat(inbox.file.descriptor, &status)
        let identity = SenderID(pid: getpid(), serial: Self.nextSerial())
        let journalPath = JournalNames.clientJournal(endpoint, sender: identity)
        let journal = try Journal.create(at: journalPath, in: endpoint.group, capacity: journalCapacity)
        let inbound = FilePresenterConnection.Inbound(path: journalPath)
        let connection = FilePresenterConnection(
            peer: PeerCredentials(pid: listenerPID, uid: status.st_uid, gid: status.st_gid),
            outbound: JournalAppender(inbox),
            sender: identity,
            role: .client(inbound),
            options: options,
            loop: loop
        )
        do {
            let presenter = try FilePresenter(presenting: journalPath) { [weak connection] in connection?.readJournal() }
            let reader = JournalReader(journal, maximumPayloadLength: options.maximumPayloadLength)
            reader.presenter = presenter
            inbound.reader.install(reader)
            inbound.presenter.withLock { $0 = presenter }
            // Watched from the start, so that a listener dying now ends the wait for its welcome.
            try connection.watchPeer(pid: listenerPID)
            try connection.sendControl(.hello, timeout: connectTimeout)
            let answered = inbound.welcomed.wait(timeout: .now() + DispatchTimeInterval.nanoseconds(Int(clamping: connectTimeout.nanoseconds)))
            guard answered == .success, connection.invalidationReason == nil else {
                throw IPCError(code: .endpointNotFound, message: "the listener on \(endpoint) did not welcome us within \(connectTimeout) (\(connection.invalidationReason.map { "\($0)" } ?? "no answer"))")
            }
        } catch {
            // Invalidated as if by its user, so a listener that admits it late hears goodbye.
            connection.invalidate()
            throw error
        }
        return connection
    }

    private static let serial = Atomic<UInt32>(0)

    private static func nextSerial() -> UInt32 {
        serial.add(1, ordering: .relaxed).newValue
    }
}

extension MessageTransport where Self == FilePresenterTransport {
    /// Coordinated journals in the group directory, woken by inotify.
    public static var filePresenter: FilePresenterTransport { FilePresenterTransport() }
}
