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
public final class FilePresenterListener: MessageListener, @unchecked Sendable {
    // @unchecked: every stored property is immutable or a Mutex; the reader slot locks itself.
    public let endpoint: Endpoint
    public let connections: AsyncStream<FilePresenterConnection>

    private let lock: EndpointLock
    private let options: ConnectionOptions
    private let loop: EventLoop
    private let inboxPath: String
    private let reader = JournalReaderSlot()
    private let watch = Mutex<JournalWatch?>(nil)
    /// The next try of an inbox read that found it locked, and whether its timer is armed.
    private let retry = Mutex<(backoff: JournalRetry, armed: Bool)>((JournalRetry(), false))
    private let connectionSink: AsyncStream<FilePresenterConnection>.Continuation
    private let identity = SenderID(pid: getpid(), serial: 0)
    private let rendezvousPath: String
    private let acceptor = Mutex<SocketAcceptor?>(nil)
    /// Clients that connected and have not finished their hello, at most.
    public static let maximumPendingHandshakes = 64

    private struct State {
        var closed = false
        var clients: [SenderID: FilePresenterConnection] = [:]
    }

    private let state = Mutex(State())

    init(endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?, capacity: Int, handshakeTimeout: Duration) throws {
        loop = try EventLoop.shared()
        try GroupDirectories.prepare(endpoint.group)
        let lock = try EndpointLock(endpoint: endpoint)
        // Journals of clients that died, which their listener (if it died too) could not remove.
        Self.removeJournalsOfDeadClients(endpoint)
        inboxPath = JournalNames.inbox(endpoint)
        rendezvousPath = RendezvousHello.socketPath(endpoint)
        // We hold the endpoint's lock, so a socket file still here belongs to a dead listener.
        unlink(rendezvousPath)
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
                self?.state.withLock({ $0.clients[record.sender] })?.lend(header, payload) ?? .notOffered
            }
            callbacks.retry = { [weak self] in
                self?.retry.withLock { $0.armed = false }
                self?.readInbox()
            }
            reader.install(JournalReader(inbox, maximumPayloadLength: options.maximumPayloadLength))
            let watch = try JournalWatch(path: inboxPath, loop: loop) { [weak self] in self?.readInbox() }
            self.watch.withLock { $0 = watch }
        } catch {
            close()
            throw error
        }
        do {
            let acceptor = try SocketAcceptor(
                path: rendezvousPath,
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
        state.withLock { Array($0.clients.values) }
    }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        activeConnections.broadcast(payload, msgid: msgid, timeout: timeout)
    }

    public func close() {
        let clients: [FilePresenterConnection]? = state.withLock { state in
            guard !state.closed else { return nil }
            state.closed = true
            return Array(state.clients.values)
        }
        guard let clients else { return }
        acceptor.withLock { $0.take() }?.close()
        watch.withLock { $0.take() }?.cancel()
        reader.release()
        // Remove the inbox and the socket before giving up the name, so a successor's are never removed.
        _ = unlink(rendezvousPath)
        _ = unlink(inboxPath)
        lock.release()
        connectionSink.finish()
        for client in clients { client.invalidate() }
    }

    private var isOpen: Bool { state.withLock { !$0.closed } }

    /// The inbox changed (the loop's thread, woken by its ``JournalWatch``), or a connection's
    /// lifeline drain (a thread of its own, `waiting`): reads what clients appended. On the loop
    /// it never waits for the inbox's lock: a read that finds it taken tries again from a timer.
    private func readInbox(waiting: Bool = false) {
        do {
            // A record whose sender is not a connection yet is not offered here; if its
            // connection exists by the time the record is routed, it offers it then.
            let read = try reader.read(isActive: { isOpen }, ifFree: !waiting, lockTimeout: waiting ? .seconds(1) : .zero, lend: callbacks.lend) { record in
                route(record)
                return true
            }
            if !waiting { retryIfLocked(read: read) }
        } catch {
            // The inbox cannot be read on, for anyone.
            let reason = InvalidationReason(.protocolError, error: error as? IPCError)
            for client in activeConnections { client.invalidate(reason) }
            close()
        }
    }

    /// The lender and the retry timer's action, made once (``JournalReadCallbacks``).
    private let callbacks = JournalReadCallbacks()

    /// After a read on the loop: if it found the inbox locked, reads again from a loop timer
    /// (one armed at a time), sooner the first times.
    private func retryIfLocked(read: Bool) {
        let delay: UInt64? = retry.withLock { retry in
            guard !read else {
                retry.backoff.reset()
                return nil
            }
            guard !retry.armed, isOpen else { return nil }
            retry.armed = true
            return retry.backoff.next()
        }
        guard let delay else { return }
        guard let retry = callbacks.retry else { return }
        loop.schedule(at: monotonicNanoseconds() &+ delay, retry)
    }

    private func route(_ record: JournalRecord) {
        state.withLock { $0.clients[record.header.sender] }?.receive(record)
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
        let connection = FilePresenterConnection(
            peer: peer,
            outbound: JournalAppender(journal),
            sender: identity,
            role: .server(clientJournalPath: journalPath, drain: { [weak self] in self?.readInbox(waiting: true) }) { [weak self] connection in
                _ = self?.state.withLock { state in
                    if state.clients[client] === connection { state.clients[client] = nil }
                }
            },
            options: options,
            loop: loop
        )
        let admitted = state.withLock { state in
            guard !state.closed, state.clients[client] == nil else { return false }
            state.clients[client] = connection
            return true
        }
        guard admitted else { return .finished(.malformed) }
        do {
            try connection.watchPeer(pid: client.pid)
        } catch {
            connection.invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
            return .finished(.malformed)
        }
        return .accepted { [connectionSink] in
            connection.adopt(lifeline: fd)
            connectionSink.yield(connection)
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
