#if os(Linux)
import Glibc
public import IPCCore
public import IPCSystem
import Synchronization
public import SystemPackage

/// The listening side of a transport whose clients connect to an `AF_UNIX` socket in the group
/// directory, with everything but the transport's own channel and handshake: the group
/// directory's preparation and checks (owner-only, this user's), the endpoint's lock (a second
/// listener gets `endpointInUse`; a dead one's socket file is reclaimed), the non-blocking
/// acceptor on the event loop with the accept filter on kernel credentials (`SO_PEERCRED`),
/// socket activation (``SocketActivatedTransport``), the registry of connections, broadcast,
/// the close order (the socket file goes before the name is given up, so a successor's is never
/// removed) and the idle close. unix-socket, notify and the toy transport of `Examples/` are
/// built on it; a listener conforms to ``SocketEndpointListener`` to get its
/// ``MessageListener`` members from it.
public final class SocketEndpoint: Sendable {
    /// What happens to a client the accept filter let through (on the loop's thread).
    public enum Accept: Sendable {
        /// The accepted socket is the connection: `serve` makes it (usually with
        /// ``serve(_:peer:options:label:)``) and returns whether it took the socket (a channel
        /// owns it from then on, whether or not the connection could be made); if not, the
        /// socket is closed. A refused client is sent `refusal` (bytes it reads as the end of its connection;
        /// empty for none) before its socket is closed.
        case immediately(refusal: [UInt8], serve: @Sendable (_ socket: FileDescriptor, _ peer: PeerCredentials, _ endpoint: SocketEndpoint) -> Bool)
        /// The socket is a rendezvous: `handshake` is called each time it is readable until it
        /// says what became of the client (see ``RendezvousHandshake``). A client that says
        /// nothing is dropped after `timeout`; at most `maximumPending` are mid-handshake (the
        /// next are answered ``RendezvousStatus/busy``).
        case afterHandshake(
            timeout: Duration, maximumPending: Int,
            handshake: @Sendable (_ socket: FileDescriptor, _ peer: PeerCredentials, _ endpoint: SocketEndpoint) -> RendezvousHandshake
        )
    }

    public var endpoint: Endpoint { claim.endpoint }
    /// The listening socket's path.
    public let path: String
    public var loop: EventLoop { claim.loop }
    private let activated: Bool
    private let claim: ClaimedEndpoint
    private let acceptor = Mutex<SocketAcceptor?>(nil)

    /// Listens at `path` (a file in `endpoint`'s group directory), or, with `activated`, on the
    /// socket bound there that a launcher handed over. With `maximumConnections` (a listener's
    /// ``IPCCore/ConnectionOptions/maximumConnections``), a client is turned away as busy while
    /// that many connections are kept or in the middle of their handshake: a rendezvous client
    /// is answered ``RendezvousStatus/busy``, an immediately accepted one is sent `busyRefusal`
    /// before its socket is closed. So is a client past the clients waiting for the accept filter
    /// (``SocketAcceptor/maximumFiltering``), whatever `maximumConnections` is.
    /// - Throws: ``IPCError/Code/endpointInUse`` if a live listener holds the endpoint;
    ///   ``IPCError/Code/invalidEndpoint`` for an unsafe group directory or a wrong hand-over;
    ///   ``IPCError/Code/transportFailure``.
    public init(
        endpoint: Endpoint, path: String, kind: UnixSocket.Kind = .stream, acceptFilter: AcceptFilter?, activated: Bool = false, accept: Accept,
        maximumConnections: Int? = nil, busyRefusal: [UInt8] = []
    ) throws {
        let claim = try ClaimedEndpoint(endpoint)
        // We hold the endpoint's lock, so a socket file still here belongs to a dead listener
        // (or, socket-activated, to the launcher that handed it over).
        if !activated { unlink(path) }
        self.claim = claim
        self.path = path
        self.activated = activated
        let mode: SocketAcceptor.Mode
        switch accept {
        case .immediately(let refusal, let serve):
            mode = .immediate(refusal: refusal) { [weak self] fd, peer in
                guard let self, serve(fd, peer, self) else {
                    try? fd.close()
                    return
                }
            }
        case .afterHandshake(let timeout, let maximumPending, let handshake):
            mode = .handshake(timeout: timeout, maximumPending: maximumPending) { [weak self] fd, peer in
                guard let self else { return .finished(.malformed) }
                return handshake(fd, peer, self)
            }
        }
        do {
            let hasRoom = maximumConnections.map { limit in
                { @Sendable [claim] (pending: Int) in claim.activeConnectionCount + pending < limit }
            }
            let acceptor = try SocketAcceptor(
                path: path, kind: kind, activated: activated, loop: claim.loop, acceptFilter: acceptFilter, mode: mode, hasRoom: hasRoom, busyRefusal: busyRefusal
            )
            self.acceptor.withLock { $0 = acceptor }
        } catch {
            claim.close { if !activated { unlink(path) } }
            throw error
        }
    }

    /// Makes the connection over an accepted client's `channel` and keeps it until it is
    /// invalidated. Returns it, or `nil` if it could not be made or the listener has closed (it
    /// is then invalidated).
    @discardableResult
    public func serve(_ channel: any EngineChannel, peer: PeerCredentials?, options: ConnectionOptions, label: String) -> EngineConnection? {
        keep { onInvalidated in
            try EngineConnection(channel: channel, peer: peer, options: options, loop: loop, label: label, onInvalidated: onInvalidated)
        }
    }

    /// Keeps the connection `make` makes, for a transport whose connection needs more than
    /// ``serve(_:peer:options:label:)`` does (see ``ClaimedEndpoint/keep(_:)``).
    @discardableResult
    public func keep(_ make: (_ onInvalidated: @escaping @Sendable (EngineConnection) -> Void) throws -> EngineConnection) -> EngineConnection? {
        claim.keep(make)
    }

    public var connections: AsyncStream<EngineConnection> { claim.connections }

    public var activeConnections: [EngineConnection] { claim.activeConnections }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        claim.broadcast(payload, msgid: msgid, timeout: timeout)
    }

    /// Stops accepting, invalidates every connection and removes the socket file (not a
    /// launcher's), then gives up the endpoint's name. Idempotent.
    public func close() {
        claim.close {
            if !activated { unlink(path) }
            acceptor.withLock { $0.take() }?.close()
        }
    }

    /// ``IdleClosingListener/closeIfIdle(handOver:)``: closes if no connection is open, none is
    /// mid-handshake and none waits in the backlog.
    public func closeIfIdle(handOver: IdleHandOver) async -> Bool {
        guard let acceptor = acceptor.withLock({ $0 }) else { return true }
        guard await acceptor.stopIfIdle(handOver: handOver, isIdle: { [claim] in claim.activeConnections.isEmpty }) else { return false }
        close()
        return true
    }

    deinit {
        close()
    }
}

/// A listener built on a ``SocketEndpoint``: its ``MessageListener`` and
/// ``IdleClosingListener`` members are the endpoint's.
public protocol SocketEndpointListener: IdleClosingListener where Connection == EngineConnection {
    var socketEndpoint: SocketEndpoint { get }
}

extension SocketEndpointListener {
    public var endpoint: Endpoint { socketEndpoint.endpoint }
    public var connections: AsyncStream<EngineConnection> { socketEndpoint.connections }
    public var activeConnections: [EngineConnection] { socketEndpoint.activeConnections }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        socketEndpoint.broadcast(payload, msgid: msgid, timeout: timeout)
    }

    public func close() { socketEndpoint.close() }

    public func closeIfIdle(handOver: IdleHandOver) async -> Bool { await socketEndpoint.closeIfIdle(handOver: handOver) }
}
#endif
