import Glibc
public import IPCCore
public import IPCEngine
import IPCSystem
import Synchronization
import SystemPackage

/// Messages over doorbells and a shared store: the MMWormhole pattern without its defects, on
/// the notify(3) model of payload-less notifications delivered to a file descriptor.
///
/// A connection's messages live in a store (``NotifyStore``: a sealed memfd holding one byte
/// ring per direction, frames in the binary framing); the writer publishes a frame and rings the
/// reader's doorbell, an eventfd that the reader's event loop waits on with every other
/// connection of its process. Every message is delivered exactly once and in order however
/// rings coalesce, bursts wait for ring space instead of overwriting, and a frame is seen only
/// once it is whole. Peer death is detected through the peer's process (a pidfd).
///
/// Files: `G/<name>.lock` (held by the listener) and `G/<name>.rendezvous` (the socket a client
/// hands its store and doorbells over, and learns the listener's credentials from; the listener
/// learns the client's, so an accept filter works). Nothing else is named: a store and its
/// doorbells exist only as descriptors in the two processes.
public struct NotifyTransport: MessageTransport, SocketActivatedTransport {
    public typealias Connection = NotifyConnection
    public typealias Listener = NotifyListener

    /// Bytes per direction in each connection's store (4 KiB to 1 GiB).
    public var ringCapacity: Int
    /// How long a connect waits for the listener to accept.
    public var connectTimeout: Duration
    /// The name of the memfds this transport's connections create (at most 249 bytes): it shows
    /// in `/proc/<pid>/maps` as `/memfd:<label> (deleted)`, which is how a debugger, or a test,
    /// finds a connection's store.
    public var storeLabel: String

    public init(ringCapacity: Int = 1 << 20, connectTimeout: Duration = .seconds(5), storeLabel: String = "ipcbench-notify") {
        self.ringCapacity = min(max(ringCapacity, NotifyStore.minimumRingCapacity), NotifyStore.maximumRingCapacity)
        self.connectTimeout = connectTimeout
        self.storeLabel = String(decoding: storeLabel.utf8.prefix(249), as: UTF8.self)
    }

    public var name: String { "notify" }

    public var capabilities: TransportCapabilities {
        TransportCapabilities(
            maximumPayloadLength: ConnectionOptions.defaults.maximumPayloadLength,
            preservesOrder: true,
            supportsRequestReply: true,
            supportsBroadcast: true,
            supportsAcceptFilter: true,
            peerDeathDetection: .processWatch,
            supportsSpinning: true,
            supportsConnectionLimit: true
        )
    }

    /// - Throws: what ``MessageTransport/listen(at:options:acceptFilter:)`` documents.
    public func listen(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> NotifyListener {
        try NotifyListener(endpoint: endpoint, options: options, acceptFilter: acceptFilter, handshakeTimeout: connectTimeout)
    }

    /// The rendezvous socket, `<group>/<name>.rendezvous`.
    public func activationSocketPath(for endpoint: Endpoint) -> String { NotifyRendezvous.socketPath(endpoint) }

    public func listenActivated(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> NotifyListener {
        try NotifyListener(endpoint: endpoint, options: options, acceptFilter: acceptFilter, handshakeTimeout: connectTimeout, activated: true)
    }

    /// - Throws: ``IPCError/Code/endpointNotFound`` if nobody listens, or (made with
    ///   ``IPCError/listenerBusy(_:answered:)``) if the listener is full or, while a process holds the
    ///   endpoint, does not answer within ``connectTimeout``; ``IPCError/Code/accessDenied`` if its accept filter
    ///   refuses this process; ``IPCError/Code/invalidEndpoint`` for an unsafe group directory;
    ///   ``IPCError/Code/transportFailure``.
    public func connect(to endpoint: Endpoint, options: ConnectionOptions) throws -> NotifyConnection {
        try GroupDirectories.verify(endpoint.group)
        let (socket, deadline) = try RendezvousStatus.connect(path: NotifyRendezvous.socketPath(endpoint), endpoint: endpoint, connectTimeout: connectTimeout)
        defer { try? socket.close() }
        let peer = try UnixSocket.peerCredentials(socket)
        try GroupDirectories.verifyListener(peer, at: NotifyRendezvous.socketPath(endpoint))
        let (store, ownBell, peerBell) = try NotifyRendezvous.connect(socket: socket, ringCapacity: ringCapacity, storeLabel: storeLabel, deadline: deadline) {
            EndpointLock.owner(of: endpoint) != nil
        }
        let channel = NotifyChannel(store: store, isClient: true, ownBell: ownBell, peerBell: peerBell, maximumPayloadLength: options.maximumPayloadLength)
        return try Self.serve(channel, peer: peer, options: options, endpoint: endpoint, onInvalidated: nil)
    }

    /// An engine connection over `channel` whose peer's death (seen through its process, since
    /// a store has no connection to break) invalidates it.
    static func serve(
        _ channel: NotifyChannel, peer: PeerCredentials, options: ConnectionOptions, endpoint: Endpoint, onInvalidated: (@Sendable (EngineConnection) -> Void)?
    ) throws -> NotifyConnection {
        let watch = Mutex<ProcessWatcher.Watch?>(nil)
        let connection = try EngineConnection(channel: channel, peer: peer, options: options, label: "a notify connection to \(endpoint.name)") { connection in
            if let token = watch.withLock({ $0.take() }) { ProcessWatcher.shared.cancel(token) }
            onInvalidated?(connection)
        }
        do {
            // Strong: the watch is cancelled when the connection ends, which lets go of it (as
            // the event loop's registration does). A weak reference would give the connection
            // a side table, and send every retain of it down the runtime's slow path.
            let token = try ProcessWatcher.shared.watch(pid: peer.pid) {
                connection.invalidate(InvalidationReason(.peerDied, error: IPCError(code: .peerInvalidated, message: "process \(peer.pid) exited")))
            }
            watch.withLock { $0 = token }
            // Invalidated before the watch was stored (the peer was already gone): cancel it here.
            if connection.invalidationReason != nil, let token = watch.withLock({ $0.take() }) { ProcessWatcher.shared.cancel(token) }
        } catch {
            connection.invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
            throw error
        }
        checkPeriodically(connection, channel)
        return connection
    }

    /// How often an idle connection's store is looked at: anything of this user (a stray
    /// process, a debugger) that overwrites it rings no bell, and a connection that waits for
    /// a ring would not notice otherwise.
    static let integrityCheckPeriod: Duration = .seconds(1)

    private static func checkPeriodically(_ connection: EngineConnection, _ channel: NotifyChannel) {
        // Strong, for the reason the peer watch is: the last check after the end lets go of the
        // connection within a period.
        connection.eventLoop.schedule(at: monotonicNanoseconds() &+ integrityCheckPeriod.wholeNanoseconds) {
            guard connection.invalidationReason == nil else { return }
            guard channel.storeIsSound else {
                connection.invalidate(InvalidationReason(.protocolError, error: IPCError(
                    code: .malformedFrame, message: "the notify store was overwritten (its header or a ring's indexes are impossible)"
                )))
                return
            }
            checkPeriodically(connection, channel)
        }
    }
}

extension MessageTransport where Self == NotifyTransport {
    /// Doorbells plus a shared store.
    public static var notify: NotifyTransport { NotifyTransport() }
}
