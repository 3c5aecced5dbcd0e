import CIPCShims
import Glibc
public import IPCCore
import IPCFileCoordination
public import IPCEngine
import IPCSystem
import Synchronization
import SystemPackage

/// Messaging through files in the group directory, in the `NSFilePresenter` /
/// `NSFileCoordinator` pattern: a writer makes a coordinated (locked) write to a file, and the
/// file's presenter is told that it changed and reads it under a coordinated read.
///
/// Files, for an endpoint `<group>/<name>`:
/// - `<name>.lock`: the listener's claim on the name (an `flock` held while it lives, with its
///   pid), so a dead listener's name can be taken over and a live one's cannot.
/// - `<name>.rendezvous`: the listener's socket, which a client connects to and says hello on
///   (its pid and serial), and which both keep open for the connection's life.
/// - `<name>.<pid>-<serial>.journal`: one per client, created by the client, which the listener
///   appends to and the client reads.
/// - `<name>.<pid>-<serial>.outbox`: one per client, created by the client, which the client
///   appends to and the listener reads. No file is written by two clients: a client stopped
///   while it holds its outbox's lock holds up its own connection only.
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
/// - A peer's death invalidates the connection once, as soon as its process closes its end of
///   the rendezvous socket (and, for a socket kept alive by a forked child, when the process
///   exits: each side watches the other's with a pidfd); pending requests fail with
///   ``IPCError/Code/peerInvalidated``, and the survivor removes the dead side's journal.
/// - On invalidation or close a side removes its own files and tells the other with a goodbye
///   record.
///
/// Identity: both sides learn the other's pid, uid and gid from the kernel (`SO_PEERCRED` on the
/// rendezvous socket), the listener refuses a hello that claims another pid or names a journal
/// or outbox another user owns, and an accept filter decides on the kernel's credentials. A
/// process of the same user can write a client's files (mode 0600) and so could forge records
/// in them; the group directory is the trust boundary for that, as with message ports.
public struct FilePresenterTransport: MessageTransport, SocketActivatedTransport {
    public typealias Connection = FilePresenterConnection
    public typealias Listener = FilePresenterListener

    /// The bytes of unread records a journal this side reads may hold before writers wait, from
    /// ``minimumJournalCapacity`` to 2^32 - 1 (a value outside is taken to the nearer end). A
    /// listener also admits only clients whose files declare at most its own.
    public var journalCapacity: Int {
        didSet { journalCapacity = Self.clamped(journalCapacity) }
    }
    /// The smallest journal capacity: a listener refuses a client whose files declare less.
    public static let minimumJournalCapacity = 4096
    /// How long a connect waits for the listener's answer (and a listener for a client's hello).
    public var connectTimeout: Duration

    public init(journalCapacity: Int = 16 << 20, connectTimeout: Duration = .seconds(5)) {
        self.journalCapacity = Self.clamped(journalCapacity)
        self.connectTimeout = connectTimeout
    }

    /// `capacity` taken into ``minimumJournalCapacity`` to 2^32 - 1 (a listener's range of
    /// capacities to admit, `minimumJournalCapacity...journalCapacity`, is then never empty).
    private static func clamped(_ capacity: Int) -> Int {
        min(max(capacity, minimumJournalCapacity), Int(UInt32.max))
    }

    public var name: String { "file-presenter" }

    public var capabilities: TransportCapabilities {
        TransportCapabilities(
            maximumPayloadLength: ConnectionOptions.defaults.maximumPayloadLength,
            preservesOrder: true,
            supportsRequestReply: true,
            supportsBroadcast: true,
            supportsAcceptFilter: true,
            peerDeathDetection: .processWatch,
            supportsConnectionLimit: true
        )
    }

    /// - Throws: what ``MessageTransport/listen(at:options:acceptFilter:)`` documents.
    public func listen(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> FilePresenterListener {
        try FilePresenterListener(endpoint: endpoint, options: options, acceptFilter: acceptFilter, handshakeTimeout: connectTimeout, maximumCapacity: journalCapacity)
    }

    /// The rendezvous socket, `<group>/<name>.rendezvous`.
    public func activationSocketPath(for endpoint: Endpoint) -> String { RendezvousHello.socketPath(endpoint) }

    public func listenActivated(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> FilePresenterListener {
        try FilePresenterListener(endpoint: endpoint, options: options, acceptFilter: acceptFilter, handshakeTimeout: connectTimeout, maximumCapacity: journalCapacity, activated: true)
    }

    /// - Throws: ``IPCError/Code/endpointNotFound`` if no live process listens on the endpoint,
    ///   or (made with ``IPCError/listenerBusy(_:answered:)``) if it is full or, while a process holds
    ///   the endpoint, did not answer within ``connectTimeout``; ``IPCError/Code/accessDenied`` if its
    ///   accept filter refuses this process; ``IPCError/Code/invalidEndpoint`` for an unsafe
    ///   group directory; ``IPCError/Code/transportFailure``.
    public func connect(to endpoint: Endpoint, options: ConnectionOptions) throws -> FilePresenterConnection {
        try GroupDirectories.verify(endpoint.group)
        let (socket, deadline) = try RendezvousStatus.connect(path: RendezvousHello.socketPath(endpoint), endpoint: endpoint, connectTimeout: connectTimeout)
        var socketOwned = true
        defer { if socketOwned { try? socket.close() } }
        let peer = try UnixSocket.peerCredentials(socket)
        try GroupDirectories.verifyListener(peer, at: RendezvousHello.socketPath(endpoint))
        let loop = try EventLoop.shared()
        let identity = SenderID(pid: getpid(), serial: Self.nextSerial())
        let journalPath = JournalNames.clientJournal(endpoint, sender: identity)
        let outboxPath = JournalNames.clientOutbox(endpoint, sender: identity)
        var journalOwned = true
        defer {
            if journalOwned {
                _ = unlink(journalPath)
                _ = unlink(outboxPath)
            }
        }
        let journal = try Journal.create(at: journalPath, in: endpoint.group, capacity: journalCapacity)
        let outbox = try Journal.create(at: outboxPath, in: endpoint.group, capacity: journalCapacity)
        let channel = FilePresenterChannel(
            role: .client(journalPath: journalPath, outboxPath: outboxPath),
            lifeline: socket,
            outbound: JournalAppender(outbox),
            sender: identity,
            peerPID: peer.pid,
            reader: JournalReader(journal, maximumPayloadLength: options.maximumPayloadLength),
            maximumPayloadLength: options.maximumPayloadLength,
            loop: loop
        )
        // Watched before the hello: the listener may write as soon as it has answered.
        channel.keep(try JournalWatch(path: journalPath, loop: loop) { [weak channel] in channel?.journalChanged() })
        let hello = RendezvousHello.bytes(identity)
        let sent = hello.withUnsafeBytes { send(socket.rawValue, $0.baseAddress, $0.count, CInt(MSG_NOSIGNAL)) }
        // A listener that refuses at once (accept filter, busy) may have answered and closed
        // before the hello went: the answer is still there to read.
        guard sent == hello.count || errno == EPIPE || errno == ECONNRESET else {
            throw IPCError.syscall("send", Errno(rawValue: errno), context: "file presenter hello")
        }
        try RendezvousStatus.awaitAcceptance(on: socket, deadline: deadline, listener: "file presenter") {
            EndpointLock.owner(of: endpoint) != nil
        }
        // From here the channel owns the socket and the journal (the engine closes it if it
        // cannot serve it).
        socketOwned = false
        journalOwned = false
        let connection = try EngineConnection(channel: channel, peer: peer, options: options, loop: loop, label: "a file-presenter connection to \(endpoint)")
        channel.attach(connection)
        do {
            // Watched too, for a listener whose socket outlives it in a forked child.
            try connection.watchPeerProcess(peer.pid)
        } catch {
            // Invalidated as if by its user, so a listener that admitted it hears goodbye.
            connection.invalidate()
            throw error
        }
        // What the listener appended before the connection could be told.
        loop.execute { connection.readNow() }
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
