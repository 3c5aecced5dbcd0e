import CIPCShims
import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization

/// The listening side of a file presenter endpoint: an inbox journal that every client appends
/// to, which the process's event loop reads for all clients (woken by an inotify watch; a read
/// that finds the inbox locked tries again from a loop timer, never waiting), and a rendezvous
/// socket (`G/<endpoint>.rendezvous`) that clients connect over: it
/// gives the listener each client's kernel-verified credentials (so an accept filter works and
/// a client cannot claim another's pid), and stays open for the connection's life.
public final class FilePresenterListener: IdleClosingListener, @unchecked Sendable {
    // @unchecked: every stored property is immutable or a Mutex, but `reader` and
    // `retryArmed`/`retry`, which the loop's thread alone uses.
    public let endpoint: Endpoint
    public let connections: AsyncStream<FilePresenterConnection>

    private let lock: EndpointLock
    private let options: ConnectionOptions
    private let loop: EventLoop
    private let inboxPath: String
    /// The inbox's reader (loop thread), let go of on the loop when the listener closes.
    private var reader: JournalReader?
    private let watch = Mutex<JournalWatch?>(nil)
    /// The next try of an inbox read that found it locked, and whether its timer is armed (loop thread).
    private var retry = JournalRetry()
    private var retryArmed = false
    private let connectionSink: AsyncStream<FilePresenterConnection>.Continuation
    private let identity = SenderID(pid: getpid(), serial: 0)
    private let rendezvousPath: String
    /// The rendezvous socket came from a launcher (``SocketActivatedTransport``): its file stays.
    private let activated: Bool
    private let acceptor = Mutex<SocketAcceptor?>(nil)
    /// Clients that connected and have not finished their hello, at most.
    public static let maximumPendingHandshakes = 64

    private struct State {
        var closed = false
        var clients: [SenderID: Client] = [:]
        /// Server connections whose peer ended while the inbox was locked: told once it is read.
        var awaitingDrain: [FilePresenterChannel] = []
    }

    /// One admitted client: the channel the listener delivers its records to, and its
    /// connection (from the moment the handshake is answered).
    private struct Client {
        let channel: FilePresenterChannel
        var connection: EngineConnection?
    }

    private let state = Mutex(State())

    init(endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?, capacity: Int, handshakeTimeout: Duration, activated: Bool = false) throws {
        loop = try EventLoop.shared()
        try GroupDirectories.prepare(endpoint.group)
        let lock = try EndpointLock(endpoint: endpoint)
        // Journals of clients that died, which their listener (if it died too) could not remove.
        Self.removeJournalsOfDeadClients(endpoint)
        inboxPath = JournalNames.inbox(endpoint)
        rendezvousPath = RendezvousHello.socketPath(endpoint)
        self.activated = activated
        // We hold the endpoint's lock, so a socket file still here belongs to a dead listener
        // (or, socket-activated, to the launcher that handed it over).
        if !activated { unlink(rendezvousPath) }
        let inbox: JournalFile
        do {
            inbox = try Journal.create(at: inboxPath, in: endpoint.group, capacity: capacity)
        } catch {
            lock.release()
            throw error
        }
        self.endpoint = endpoint
        self.lock = lock
        self.options = options
        (connections, connectionSink) = AsyncStream.makeStream(of: FilePresenterConnection.self)
        do {
            callbacks.lend = { [weak self] record, header, payload in
                self?.lend(record, header, payload) ?? .notOffered
            }
            callbacks.retry = { [weak self] in
                self?.retryArmed = false
                self?.readInbox()
            }
            reader = JournalReader(inbox, maximumPayloadLength: options.maximumPayloadLength)
            let watch = try JournalWatch(path: inboxPath, loop: loop) { [weak self] in _ = self?.readInbox() }
            self.watch.withLock { $0 = watch }
        } catch {
            close()
            throw error
        }
        do {
            let acceptor = try SocketAcceptor(
                path: rendezvousPath,
                activated: activated,
                loop: loop,
                acceptFilter: acceptFilter,
                mode: .handshake(timeout: handshakeTimeout, maximumPending: Self.maximumPendingHandshakes) { [weak self] fd, peer in
                    self?.takeHello(fd, peer: peer) ?? .finished(.malformed)
                }
            )
            self.acceptor.withLock { $0 = acceptor }
        } catch {
            close()
            throw error
        }
    }

    public var activeConnections: [FilePresenterConnection] {
        state.withLock { $0.clients.values.compactMap(\.connection) }
    }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        activeConnections.broadcast(payload, msgid: msgid, timeout: timeout)
    }

    public func close() {
        let clients: [FilePresenterConnection]? = state.withLock { state in
            guard !state.closed else { return nil }
            state.closed = true
            return state.clients.values.compactMap(\.connection)
        }
        guard let clients else { return }
        acceptor.withLock { $0.take() }?.close()
        watch.withLock { $0.take() }?.cancel()
        loop.execute { [self] in reader = nil }
        // Remove the inbox and the socket before giving up the name, so a successor's are never removed.
        if !activated { _ = unlink(rendezvousPath) }
        _ = unlink(inboxPath)
        lock.release()
        connectionSink.finish()
        for client in clients { client.invalidate() }
    }

    public func closeIfIdle(handOver: IdleHandOver) async -> Bool {
        guard let acceptor = acceptor.withLock({ $0 }) else { return true }
        guard await acceptor.stopIfIdle(handOver: handOver, isIdle: { [weak self] in self?.state.withLock { $0.clients.isEmpty } ?? true }) else { return false }
        close()
        return true
    }

    private var isOpen: Bool { state.withLock { !$0.closed } }

    /// The inbox changed (the loop's thread, woken by its ``JournalWatch``; or a retry; or a
    /// connection whose peer ended, `drain`): reads what clients appended, and hands each
    /// client's records to its connection. Never waits for the inbox's lock: a read that finds
    /// it taken tries again from a timer. Returns whether it read.
    @discardableResult
    private func readInbox() -> Bool {
        guard isOpen, let reader else { return true }
        do {
            guard try reader.fill() != nil else {
                retryLater()
                return false
            }
            retry.reset()
            // A record whose sender is not a connection yet is not offered here; if its
            // connection exists by the time the record is routed, it offers it then. (`if let`,
            // not `??`: a closure that comes out of a generic operator is wrapped in a thunk,
            // an allocation per read.)
            if let lend = callbacks.lend {
                while let record = try reader.next(offering: true, lend: lend) { route(record) }
            } else {
                while let record = try reader.next(offering: false, lend: { _, _, _ in .notOffered }) { route(record) }
            }
        } catch {
            // The inbox cannot be read on, for anyone.
            let reason = InvalidationReason(.protocolError, error: error as? IPCError)
            for client in activeConnections { client.invalidate(reason) }
            close()
            return true
        }
        for channel in state.withLock({ state -> [FilePresenterChannel] in
            defer { state.awaitingDrain.removeAll() }
            return state.awaitingDrain
        }) {
            channel.inboxDrained()
        }
        return true
    }

    /// The lender and the retry timer's action, made once (``JournalReadCallbacks``).
    private let callbacks = JournalReadCallbacks()

    /// After a read that found the inbox locked: reads again from a loop timer (one armed at a
    /// time), sooner the first times.
    private func retryLater() {
        guard !retryArmed, isOpen, let action = callbacks.retry else { return }
        retryArmed = true
        loop.schedule(at: monotonicNanoseconds() &+ retry.next(), action)
    }

    /// A connection's peer ended (loop thread): reads the inbox once more, so that what the
    /// peer appended before it went arrives first. Returns whether it could; if not, the
    /// channel is told when the inbox has been read (``FilePresenterChannel/inboxDrained()``).
    private func drain(for channel: FilePresenterChannel) -> Bool {
        if readInbox() { return true }
        state.withLock { $0.awaitingDrain.append(channel) }
        return false
    }

    /// Offers a one-way message, in place, to its client's connection, if that connection
    /// borrows (loop thread): handed over while the payload is valid; taken either way.
    private func lend(_ record: RecordHeader, _ header: FrameHeader, _ payload: UnsafeRawBufferPointer) -> JournalLending {
        guard let client = state.withLock({ $0.clients[record.sender] }), let connection = client.connection, connection.core.lendsMessages else {
            return .notOffered
        }
        client.channel.deliver(.inPlace(header, payload)) { connection.readNow() }
        return .taken
    }

    private func route(_ record: JournalRecord) {
        let delivered: FilePresenterChannel.Delivered
        switch record {
        case .lent:
            return
        case .frame(_, let frame, let offered):
            delivered = .frame(frame, offered: offered)
        case .oversized(_, let error):
            delivered = .error(error)
        case .control(let header):
            // Version 1's handshake records: skipped.
            guard header.kind == .goodbye else { return }
            delivered = .goodbye
        }
        guard let client = state.withLock({ $0.clients[record.header.sender] }), let connection = client.connection else { return }
        client.channel.deliver(delivered) { connection.readNow() }
    }

    /// Takes a client's hello from its rendezvous socket (loop thread): checks that the pid it
    /// claims is the one the kernel reports and that the journal it names is that process's and
    /// this user's, opens the journal, and admits the client. Never waits: a journal whose lock
    /// is taken (a client's fresh journal is not) makes the hello malformed.
    private func takeHello(_ fd: CInt, peer: PeerCredentials) -> SocketAcceptor.Handshake {
        var hello = [UInt8](repeating: 0, count: RendezvousHello.length)
        let count = hello.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT | MSG_PEEK)) }
        if count < 0, errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return .incomplete }
        if count > 0, count < RendezvousHello.length { return .incomplete }
        guard count == RendezvousHello.length else { return .finished(.malformed) }
        _ = hello.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT)) }
        guard let client = RendezvousHello.sender(parsing: hello[...]), client.pid == peer.pid else { return .finished(.malformed) }
        let journalPath = JournalNames.clientJournal(endpoint, sender: client)
        guard let journal = try? JournalFile(CoordinatedFile(path: journalPath, create: false), timeout: .zero),
            journal.header.ownerPID == client.pid
        else { return .finished(.malformed) }
        var status = stat()
        guard fstat(journal.file.descriptor, &status) == 0, status.st_uid == peer.uid, status.st_mode & S_IFMT == S_IFREG else {
            return .finished(.malformed)
        }
        let channel = FilePresenterChannel(
            role: .server(clientJournalPath: journalPath, drain: { [weak self] channel in self?.drain(for: channel) ?? true }),
            lifeline: fd,
            outbound: JournalAppender(journal),
            sender: identity,
            peerPID: client.pid,
            reader: nil,
            maximumPayloadLength: options.maximumPayloadLength,
            loop: loop
        )
        let admitted = state.withLock { state in
            guard !state.closed, state.clients[client] == nil else { return false }
            state.clients[client] = Client(channel: channel)
            return true
        }
        guard admitted else { return .finished(.malformed) }
        return .accepted { [weak self, options, loop, connectionSink, endpoint] in
            // The acceptor has stopped watching the socket: the connection watches it from now on.
            do {
                let connection = try EngineConnection(
                    channel: channel, peer: peer, options: options, loop: loop, label: "a file-presenter connection to \(endpoint)"
                ) { [weak self] connection in
                    _ = self?.state.withLock { state in
                        if state.clients[client]?.channel === channel { state.clients[client] = nil }
                    }
                }
                channel.attach(connection)
                _ = self?.state.withLock { state in
                    if state.clients[client]?.channel === channel { state.clients[client]?.connection = connection }
                }
                do {
                    try connection.watchPeerProcess(client.pid)
                } catch {
                    return connection.invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
                }
                guard self?.isOpen == true else { return connection.invalidate() }
                connectionSink.yield(connection)
            } catch {
                _ = self?.state.withLock { state in
                    if state.clients[client]?.channel === channel { state.clients[client] = nil }
                }
            }
        }
    }

    /// Removes the journals of this endpoint's clients whose processes are gone (a client that
    /// dies cannot remove its own, and the listener that would have may be gone too).
    private static func removeJournalsOfDeadClients(_ endpoint: Endpoint) {
        guard let directory = opendir(endpoint.group.path) else { return }
        defer { closedir(directory) }
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard let sender = JournalNames.sender(ofClientJournal: name, endpoint: endpoint), !ProcessWatcher.isAlive(pid: sender.pid) else { continue }
            _ = unlink(JournalNames.clientJournal(endpoint, sender: sender))
        }
    }
}
