import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization

/// The listening side of a file presenter endpoint: an inbox journal that every client appends
/// to, presented by one thread that reads it for all clients and answers requests in arrival
/// order.
public final class FilePresenterListener: MessageListener, @unchecked Sendable {
    // @unchecked: every stored property is immutable or a Mutex; the reader slot locks itself.
    public let endpoint: Endpoint
    public let connections: AsyncStream<FilePresenterConnection>

    private let lock: EndpointLock
    private let options: ConnectionOptions
    private let loop: EventLoop
    private let inboxPath: String
    private let reader = JournalReaderSlot()
    private let presenter = Mutex<FilePresenter?>(nil)
    private let connectionSink: AsyncStream<FilePresenterConnection>.Continuation
    private let identity = SenderID(pid: getpid(), serial: 0)

    private struct State {
        var closed = false
        var clients: [SenderID: FilePresenterConnection] = [:]
    }

    private let state = Mutex(State())

    init(endpoint: Endpoint, options: ConnectionOptions, capacity: Int) throws {
        loop = try EventLoop.shared()
        try GroupDirectories.prepare(endpoint.group)
        let lock = try EndpointLock(endpoint: endpoint)
        // Journals of clients that died, which their listener (if it died too) could not remove.
        Self.removeJournalsOfDeadClients(endpoint)
        inboxPath = JournalNames.inbox(endpoint)
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
            let presenter = try FilePresenter(presenting: inboxPath) { [weak self] in self?.readInbox() }
            let inboxReader = JournalReader(inbox, maximumPayloadLength: options.maximumPayloadLength)
            inboxReader.presenter = presenter
            reader.install(inboxReader)
            self.presenter.withLock { $0 = presenter }
        } catch {
            close()
            throw error
        }
        // A client may have said hello before the presenter was watching.
        readInbox()
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
        presenter.withLock { $0.take() }?.remove()
        reader.release()
        // Remove the inbox before giving up the name, so a successor's inbox is never removed.
        _ = unlink(inboxPath)
        lock.release()
        connectionSink.finish()
        for client in clients { client.invalidate() }
    }

    private var isOpen: Bool { state.withLock { !$0.closed } }

    /// The presenter calls this when the inbox changed: reads what clients appended.
    private func readInbox() {
        do {
            try reader.read(isActive: { isOpen }) { route($0) }
        } catch {
            // The inbox cannot be read on, for anyone.
            let reason = InvalidationReason(.protocolError, error: error as? IPCError)
            for client in activeConnections { client.invalidate(reason) }
            close()
        }
    }

    private func route(_ record: JournalRecord) {
        let header = record.header
        if case .control(let control) = record, control.kind == .hello {
            admit(control.sender)
            return
        }
        state.withLock { $0.clients[header.sender] }?.receive(record)
    }

    /// Registers a client from its hello: opens the journal it created and welcomes it there.
    private func admit(_ client: SenderID) {
        let journalPath = JournalNames.clientJournal(endpoint, sender: client)
        // Anyone who can write the inbox can say hello; one without a journal of its own is ignored.
        guard let journal = try? JournalFile(CoordinatedFile(path: journalPath, create: false), timeout: .seconds(1)),
            journal.header.ownerPID == client.pid
        else { return }
        var status = stat()
        _ = fstat(journal.file.descriptor, &status)
        let connection = FilePresenterConnection(
            peer: PeerCredentials(pid: client.pid, uid: status.st_uid, gid: status.st_gid),
            outbound: JournalAppender(journal),
            sender: identity,
            role: .server(clientJournalPath: journalPath) { [weak self] connection in
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
        guard admitted else { return }
        do {
            try connection.sendControl(.welcome, timeout: .seconds(1))
            try connection.watchPeer(pid: client.pid)
        } catch {
            connection.invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
            return
        }
        connectionSink.yield(connection)
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
