import CIPCShims
import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization
import SystemPackage

/// The listening side of the notify transport: accepts on the endpoint's rendezvous socket on
/// the event loop, passes each client through the accept filter with its kernel-verified
/// credentials, takes its hello (the store and the doorbells) without ever blocking the loop,
/// and serves the connection on the loop from then on.
///
/// A client that connects and says nothing is dropped after the handshake timeout, and at most
/// ``maximumPendingHandshakes`` may be in the middle of connecting at once (the next ones are
/// told `busy`), so clients that never finish cannot hold the listener's descriptors.
public final class NotifyListener: IdleClosingListener, Sendable {
    public let endpoint: Endpoint
    /// Clients that connected and have not finished their hello, at most.
    public static let maximumPendingHandshakes = 64

    private let path: String
    /// The rendezvous socket came from a launcher (``SocketActivatedTransport``): its file stays.
    private let activated: Bool
    private let lock: EndpointLock
    private let registry = ConnectionRegistry<NotifyConnection>()
    private let acceptor = Mutex<SocketAcceptor?>(nil)

    init(endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?, handshakeTimeout: Duration, activated: Bool = false) throws {
        try GroupDirectories.prepare(endpoint.group)
        let lock = try EndpointLock(endpoint: endpoint)
        let path = NotifyRendezvous.socketPath(endpoint)
        // We hold the endpoint's lock, so a socket file still here belongs to a dead listener
        // (or, socket-activated, to the launcher that handed it over).
        if !activated { unlink(path) }
        self.endpoint = endpoint
        self.path = path
        self.lock = lock
        self.activated = activated
        do {
            let acceptor = try SocketAcceptor(
                path: path,
                activated: activated,
                loop: try EventLoop.shared(),
                acceptFilter: acceptFilter,
                mode: .handshake(timeout: handshakeTimeout, maximumPending: Self.maximumPendingHandshakes) { [registry] fd, peer in
                    Self.takeHello(fd, peer: peer, options: options, endpoint: endpoint, registry: registry)
                }
            )
            self.acceptor.withLock { $0 = acceptor }
        } catch {
            if !activated { unlink(path) }
            lock.release()
            throw error
        }
    }

    public var connections: AsyncStream<NotifyConnection> { registry.connections }

    public var activeConnections: [NotifyConnection] { registry.activeConnections }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        registry.broadcast(payload, msgid: msgid, timeout: timeout)
    }

    public func close() {
        guard let toInvalidate = registry.close() else { return }
        // Remove the socket file before giving up the name, so a successor never loses its own file.
        if !activated { unlink(path) }
        acceptor.withLock { $0.take() }?.close()
        lock.release()
        for connection in toInvalidate { connection.invalidate() }
    }

    public func closeIfIdle(handOver: IdleHandOver) async -> Bool {
        guard let acceptor = acceptor.withLock({ $0 }) else { return true }
        guard await acceptor.stopIfIdle(handOver: handOver, isIdle: { [registry] in registry.activeConnections.isEmpty }) else { return false }
        close()
        return true
    }

    deinit {
        close()
    }

    /// Takes a client's hello when its socket is readable (loop thread): one message of
    /// ``NotifyRendezvous/helloLength`` bytes with the store and the two doorbells.
    private static func takeHello(_ fd: CInt, peer: PeerCredentials, options: ConnectionOptions, endpoint: Endpoint, registry: ConnectionRegistry<NotifyConnection>) -> SocketAcceptor.Handshake {
        var hello = [UInt8](repeating: 0, count: NotifyRendezvous.helloLength)
        var descriptors = [CInt](repeating: -1, count: NotifyRendezvous.descriptorCount)
        var received: CInt = 0
        let count = hello.withUnsafeMutableBytes { bytes in
            descriptors.withUnsafeMutableBufferPointer { fds in
                ipc_receive_with_descriptors(fd, bytes.baseAddress, UInt(bytes.count), fds.baseAddress, CInt(fds.count), &received)
            }
        }
        if count < 0, errno == EAGAIN || errno == EWOULDBLOCK { return .incomplete }
        let handed = Array(descriptors.prefix(Int(max(0, received))))
        // Whatever is wrong with it, the client gets an answer and nothing it handed over stays open.
        guard count == NotifyRendezvous.helloLength, handed.count == NotifyRendezvous.descriptorCount,
            let capacity = NotifyRendezvous.ringCapacity(ofHello: hello[...]),
            let channel = try? Self.channel(memfd: handed[0], ownBell: handed[1], peerBell: handed[2], ringCapacity: capacity, options: options)
        else {
            handed.forEach { closeDescriptor($0) }
            return .finished(.malformed)
        }
        closeDescriptor(handed[0])
        guard let connection = try? NotifyTransport.serve(channel, peer: peer, options: options, endpoint: endpoint, onInvalidated: { [weak registry] connection in
            registry?.remove(connection)
        }) else {
            return .finished(.malformed)
        }
        // Registered before the client hears it is accepted, so that a client that has
        // connected is among ``activeConnections``.
        guard registry.add(connection) else {
            connection.invalidate()
            return .finished(.malformed)
        }
        return .finished(.accepted)
    }

    /// A channel over what a client handed over, after checking each descriptor is what it
    /// should be: the store (see ``NotifyStore/adopt(memfd:ringCapacity:)``) and two eventfds,
    /// made non-blocking here whatever the client set (a ring must never block the loop).
    /// - Throws: ``IPCError/Code/malformedFrame``.
    private static func channel(memfd: CInt, ownBell: CInt, peerBell: CInt, ringCapacity: Int, options: ConnectionOptions) throws -> NotifyChannel {
        guard ipc_is_eventfd(ownBell) == 1, ipc_is_eventfd(peerBell) == 1, ownBell != peerBell,
            ipc_set_nonblocking(ownBell) == 0, ipc_set_nonblocking(peerBell) == 0
        else {
            throw IPCError(code: .malformedFrame, message: "the doorbells handed over are not two eventfds")
        }
        let store = try NotifyStore.adopt(memfd: memfd, ringCapacity: ringCapacity)
        store.recordServer()
        return NotifyChannel(store: store, isClient: false, ownBell: ownBell, peerBell: peerBell, maximumPayloadLength: options.maximumPayloadLength)
    }
}
