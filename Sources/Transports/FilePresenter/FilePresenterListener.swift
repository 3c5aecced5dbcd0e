import CIPCShims
import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization

/// The listening side of a file presenter endpoint: a rendezvous socket
/// (`G/<endpoint>.rendezvous`) that clients connect over, which gives the listener each client's
/// kernel-verified credentials (so an accept filter works and a client cannot claim another's
/// pid) and stays open for the connection's life. Each admitted client's connection reads that
/// client's own outbox on the process's event loop (woken by an inotify watch; a read that finds
/// the outbox locked tries again from a loop timer, never waiting): no file is shared between
/// clients, so one that stalls holding its outbox's lock holds up its own connection only.
public final class FilePresenterListener: IdleClosingListener, Sendable {
    public let endpoint: Endpoint
    public let connections: AsyncStream<FilePresenterConnection>

    private let lock: EndpointLock
    private let options: ConnectionOptions
    private let loop: EventLoop
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
    }

    /// One admitted client: its channel, and its connection (from the moment the handshake is
    /// answered).
    private struct Client {
        let channel: FilePresenterChannel
        var connection: EngineConnection?
    }

    private let state = Mutex(State())

    init(endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?, handshakeTimeout: Duration, activated: Bool = false) throws {
        loop = try EventLoop.shared()
        try GroupDirectories.prepare(endpoint.group)
        let lock = try EndpointLock(endpoint: endpoint)
        // Files of clients that died, which their listener (if it died too) could not remove.
        Self.removeFilesOfDeadClients(endpoint)
        rendezvousPath = RendezvousHello.socketPath(endpoint)
        self.activated = activated
        // We hold the endpoint's lock, so a socket file still here belongs to a dead listener
        // (or, socket-activated, to the launcher that handed it over).
        if !activated { unlink(rendezvousPath) }
        self.endpoint = endpoint
        self.lock = lock
        self.options = options
        (connections, connectionSink) = AsyncStream.makeStream(of: FilePresenterConnection.self)
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
        // Remove the socket before giving up the name, so a successor's is never removed.
        if !activated { _ = unlink(rendezvousPath) }
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

    /// Takes a client's hello from its rendezvous socket (loop thread): checks that the pid it
    /// claims is the one the kernel reports and that the journal and outbox it names are that
    /// process's and this user's, opens them, watches the outbox, and admits the client. Never
    /// waits: a file whose lock is taken (a client's fresh ones are not) makes the hello
    /// malformed.
    private func takeHello(_ fd: CInt, peer: PeerCredentials) -> SocketAcceptor.Handshake {
        var hello = [UInt8](repeating: 0, count: RendezvousHello.length)
        let count = hello.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT | MSG_PEEK)) }
        if count < 0, errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return .incomplete }
        if count > 0, count < RendezvousHello.length { return .incomplete }
        guard count == RendezvousHello.length else { return .finished(.malformed) }
        _ = hello.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT)) }
        guard let client = RendezvousHello.sender(parsing: hello[...]), client.pid == peer.pid else { return .finished(.malformed) }
        let journalPath = JournalNames.clientJournal(endpoint, sender: client)
        let outboxPath = JournalNames.clientOutbox(endpoint, sender: client)
        guard let journal = Self.openClientFile(journalPath, of: client, peer: peer),
            let outbox = Self.openClientFile(outboxPath, of: client, peer: peer)
        else { return .finished(.malformed) }
        let channel = FilePresenterChannel(
            role: .server(clientJournalPath: journalPath, clientOutboxPath: outboxPath),
            lifeline: fd,
            outbound: JournalAppender(journal),
            sender: identity,
            peerPID: client.pid,
            reader: JournalReader(outbox, maximumPayloadLength: options.maximumPayloadLength),
            maximumPayloadLength: options.maximumPayloadLength,
            loop: loop
        )
        // Watched before the answer: the client may write as soon as it has it.
        guard let watch = try? JournalWatch(path: outboxPath, loop: loop, didChange: { [weak channel] in channel?.journalChanged() }) else {
            return .finished(.malformed)
        }
        channel.keep(watch)
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
                // What the client appended before the connection could be told.
                connection.readNow()
            } catch {
                _ = self?.state.withLock { state in
                    if state.clients[client]?.channel === channel { state.clients[client] = nil }
                }
            }
        }
    }

    /// Opens a client's journal or outbox, if it is a regular file of the client's uid whose
    /// header names the client, and it is not locked now; else `nil`.
    private static func openClientFile(_ path: String, of client: SenderID, peer: PeerCredentials) -> JournalFile? {
        guard let file = try? JournalFile(CoordinatedFile(path: path, create: false), timeout: .zero), file.header.ownerPID == client.pid else { return nil }
        var status = stat()
        guard fstat(file.file.descriptor, &status) == 0, status.st_uid == peer.uid, status.st_mode & S_IFMT == S_IFREG else { return nil }
        return file
    }

    /// Removes the journals and outboxes of this endpoint's clients whose processes are gone (a
    /// client that dies cannot remove its own, and the listener that would have may be gone too).
    private static func removeFilesOfDeadClients(_ endpoint: Endpoint) {
        guard let directory = opendir(endpoint.group.path) else { return }
        defer { closedir(directory) }
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard let sender = JournalNames.sender(ofClientFile: name, endpoint: endpoint), !ProcessWatcher.isAlive(pid: sender.pid) else { continue }
            _ = unlink(JournalNames.clientJournal(endpoint, sender: sender))
            _ = unlink(JournalNames.clientOutbox(endpoint, sender: sender))
        }
    }
}
