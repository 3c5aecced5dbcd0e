import CIPCShims
import Glibc
import IPCCore
import IPCFileCoordination
public import IPCEngine
import IPCSystem
import Synchronization
import SystemPackage

/// The listening side of a file presenter endpoint: a rendezvous socket
/// (`G/<endpoint>.rendezvous`) that clients connect over, which gives the listener each client's
/// kernel-verified credentials (so an accept filter works and a client cannot claim another's
/// pid) and stays open for the connection's life. Each admitted client's connection reads that
/// client's own outbox on the process's event loop (woken by an inotify watch; a read that finds
/// the outbox locked tries again from a loop timer, never waiting): no file is shared between
/// clients, so one that stalls holding its outbox's lock holds up its own connection only.
public final class FilePresenterListener: SocketEndpointListener, Sendable {
    /// Clients that connected and have not finished their hello, at most.
    public static let maximumPendingHandshakes = 64

    public let socketEndpoint: SocketEndpoint

    /// The clients admitted and not yet ended, by the id their hello named: a second hello with
    /// the same id is refused.
    private final class Admitted: Sendable {
        let senders = Mutex<Set<SenderID>>([])
    }

    /// - Parameter maximumCapacity: the largest capacity a client's files may declare (the
    ///   transport's ``FilePresenterTransport/journalCapacity``): what the connection's reader
    ///   may have to hold of a client's outbox follows from it, and the client writes it.
    init(endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?, handshakeTimeout: Duration, maximumCapacity: Int, activated: Bool = false) throws {
        // Files of clients that died, which their listener (if it died too) could not remove.
        // Before the endpoint's lock: a live listener's clients are alive, so nothing of theirs goes.
        try GroupDirectories.prepare(endpoint.group)
        Self.removeFilesOfDeadClients(endpoint)
        let admitted = Admitted()
        socketEndpoint = try SocketEndpoint(
            endpoint: endpoint,
            path: RendezvousHello.socketPath(endpoint),
            acceptFilter: acceptFilter,
            activated: activated,
            accept: .afterHandshake(timeout: handshakeTimeout, maximumPending: Self.maximumPendingHandshakes) { fd, peer, listener in
                Self.takeHello(fd, peer: peer, options: options, maximumCapacity: maximumCapacity, listener: listener, admitted: admitted)
            },
            maximumConnections: options.maximumConnections
        )
    }

    /// Takes a client's hello from its rendezvous socket (loop thread): checks that the pid it
    /// claims is the one the kernel reports and that the journal and outbox it names are that
    /// process's and this user's, opens them, watches the outbox, and admits the client. Never
    /// waits: a file whose lock is taken (a client's fresh ones are not) makes the hello
    /// malformed.
    private static func takeHello(_ fd: FileDescriptor, peer: PeerCredentials, options: ConnectionOptions, maximumCapacity: Int, listener: SocketEndpoint, admitted: Admitted) -> RendezvousHandshake {
        var hello = [UInt8](repeating: 0, count: RendezvousHello.length)
        let count = hello.withUnsafeMutableBytes { recv(fd.rawValue, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT | MSG_PEEK)) }
        if count < 0, errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return .incomplete }
        if count > 0, count < RendezvousHello.length { return .incomplete }
        guard count == RendezvousHello.length else { return .finished(.malformed) }
        _ = hello.withUnsafeMutableBytes { recv(fd.rawValue, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT)) }
        guard let client = RendezvousHello.sender(parsing: hello[...]), client.pid == peer.pid else { return .finished(.malformed) }
        // A sender already admitted is refused before its files are opened or watched: a second
        // watch of its outbox is the first one (inotify gives a path one watch an instance), and
        // dropping it with the refused hello stopped the live connection's reads.
        guard !admitted.senders.withLock({ $0.contains(client) }) else { return .finished(.malformed) }
        let endpoint = listener.endpoint
        let journalPath = JournalNames.clientJournal(endpoint, sender: client)
        let outboxPath = JournalNames.clientOutbox(endpoint, sender: client)
        guard let journal = openClientFile(journalPath, of: client, peer: peer, maximumCapacity: maximumCapacity),
            let outbox = openClientFile(outboxPath, of: client, peer: peer, maximumCapacity: maximumCapacity)
        else { return .finished(.malformed) }
        let loop = listener.loop
        let channel = FilePresenterChannel(
            role: .server(clientJournalPath: journalPath, clientOutboxPath: outboxPath),
            lifeline: fd,
            outbound: JournalAppender(journal),
            sender: SenderID(pid: getpid(), serial: 0),
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
        guard admitted.senders.withLock({ $0.insert(client).inserted }) else { return .finished(.malformed) }
        return .accepted { [admitted] in
            // The acceptor has stopped watching the socket: the connection watches it from now on.
            let connection = listener.keep { onInvalidated in
                try EngineConnection(channel: channel, peer: peer, options: options, loop: loop, label: "a file-presenter connection to \(endpoint)") { connection in
                    _ = admitted.senders.withLock { $0.remove(client) }
                    onInvalidated(connection)
                }
            }
            guard let connection else {
                _ = admitted.senders.withLock { $0.remove(client) }
                return
            }
            channel.attach(connection)
            do {
                try connection.watchPeerProcess(client.pid)
            } catch {
                return connection.invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
            }
            // What the client appended before the connection could be told.
            connection.readNow()
        }
    }

    /// Opens a client's journal or outbox, if it is a regular file of the client's uid that
    /// only its owner can write, whose header names the client and a capacity from
    /// ``FilePresenterTransport/minimumJournalCapacity`` to `maximumCapacity`, and it is not
    /// locked now; else `nil`.
    private static func openClientFile(_ path: String, of client: SenderID, peer: PeerCredentials, maximumCapacity: Int) -> JournalFile? {
        guard let file = try? JournalFile(CoordinatedFile(path: path, create: false), timeout: .zero), file.header.ownerPID == client.pid,
            (FilePresenterTransport.minimumJournalCapacity...maximumCapacity).contains(file.header.capacity)
        else { return nil }
        var status = stat()
        guard fstat(file.file.descriptor, &status) == 0, status.st_uid == peer.uid, status.st_mode & S_IFMT == S_IFREG,
            status.st_mode & (S_IWGRP | S_IWOTH) == 0
        else { return nil }
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
