public import IPCCore
public import IPCEngine
public import IPCFraming
import IPCSystem
import SystemPackage

/// `AF_UNIX` stream sockets in the group directory: the Linux counterpart of LLBSDMessaging's
/// BSD sockets. The endpoint `name` in group `G` is the socket file `G/name.sock`, guarded by
/// the lock file `G/name.lock` that its listener holds for its lifetime.
public struct UnixSocketTransport: MessageTransport, FramedTransport, SocketActivatedTransport {
    public typealias Connection = UnixSocketConnection
    public typealias Listener = UnixSocketListener

    public var framing: Framing
    /// How long a connect waits for room in the listener's backlog. The kernel queues a
    /// connection there without the listener's help, so a connect to a listener that is
    /// stopped, hung or flooded returns at once until the backlog (`SOMAXCONN`) is full; after
    /// that it fails with this timeout (``IPCError/listenerBusy(_:answered:)``, not answered).
    public var connectTimeout: Duration

    public init(framing: Framing = .binary, connectTimeout: Duration = .seconds(5)) {
        self.framing = framing
        self.connectTimeout = connectTimeout
    }

    public var name: String { "unix-socket" }

    public var capabilities: TransportCapabilities {
        TransportCapabilities(
            maximumPayloadLength: ConnectionOptions.defaults.maximumPayloadLength,
            preservesOrder: true,
            supportsRequestReply: true,
            supportsBroadcast: true,
            supportsAcceptFilter: true,
            peerDeathDetection: .connectionClosed,
            supportsSpinning: true,
            supportsConnectionLimit: true
        )
    }

    public func listen(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> UnixSocketListener {
        try UnixSocketListener(endpoint: endpoint, framing: framing, options: options, acceptFilter: acceptFilter)
    }

    public func activationSocketPath(for endpoint: Endpoint) -> String { Self.socketPath(endpoint) }

    public func listenActivated(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> UnixSocketListener {
        try UnixSocketListener(endpoint: endpoint, framing: framing, options: options, acceptFilter: acceptFilter, activated: true)
    }

    public func connect(to endpoint: Endpoint, options: ConnectionOptions) throws -> UnixSocketConnection {
        try GroupDirectories.verify(endpoint.group)
        let fd = try UnixSocket.connect(path: Self.socketPath(endpoint), timeout: connectTimeout) { EndpointLock.owner(of: endpoint) != nil }
        let peer: PeerCredentials
        do {
            peer = try UnixSocket.peerCredentials(fd)
            try GroupDirectories.verifyListener(peer, at: Self.socketPath(endpoint))
        } catch {
            try? fd.close()
            throw error
        }
        let channel = UnixSocketChannel(fd: fd, framing: framing, maximumPayloadLength: options.maximumPayloadLength)
        return try EngineConnection(channel: channel, peer: peer, options: options, label: "a unix-socket connection to \(endpoint.name)")
    }

    /// What a listener writes to a client its accept filter refused, before it closes the
    /// socket: a `failure` frame with correlation 0 (no request has it) and msgid 0, whose
    /// payload says why, in the listener's framing (docs/WIRE-FORMAT.md, "Refusal"). The client
    /// reads it as the end of its connection, invalidated with `accessDenied`.
    static func refusal(framing: Framing, text: String = refusalText) -> [UInt8] {
        let frame = Frame(kind: .failure, msgid: 0, correlation: 0, payload: Array(text.utf8))
        return (try? framing.makeEncoder(maximumPayloadLength: 1 << 10).encode(frame)) ?? []
    }

    static let refusalText = "accessDenied: the listener's accept filter refused this process"
    /// The refusal of a client that came while the listener kept as many connections as its
    /// ``IPCCore/ConnectionOptions/maximumConnections``: the client reads it as `endpointNotFound`.
    static let busyText = ConnectionCore.busyRefusalPrefix + " the listener has as many connections as it keeps (maximumConnections); try again later"

    /// The socket file of `endpoint`: `<group>/<name>.sock`.
    public static func socketPath(_ endpoint: Endpoint) -> String {
        endpoint.path(suffix: ".sock")
    }
}

extension MessageTransport where Self == UnixSocketTransport {
    /// `AF_UNIX` stream sockets with the given framing.
    public static func unixSocket(framing: Framing = .binary) -> UnixSocketTransport {
        UnixSocketTransport(framing: framing)
    }
}
