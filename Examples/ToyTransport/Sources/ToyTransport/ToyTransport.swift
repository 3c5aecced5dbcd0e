import IPCCore
import IPCEngine
import IPCSystem

/// A minimal transport written against ipcbench's protocol from outside the package: `AF_UNIX`
/// sequenced-packet sockets in the group directory, one packet per message, peer death seen as
/// end of stream. It exists to show how a transport author runs the conformance suite.
public struct ToyTransport: MessageTransport {
    public typealias Connection = ToyConnection
    public typealias Listener = ToyListener

    /// A packet must fit the socket's send buffer (about 208 KiB by default); stay well below.
    public static let maximumPayloadLength = 64 * 1024

    public init() {}

    public var name: String { "toy" }

    public var capabilities: TransportCapabilities {
        TransportCapabilities(
            maximumPayloadLength: Self.maximumPayloadLength, preservesOrder: true, supportsRequestReply: true,
            supportsBroadcast: true, supportsAcceptFilter: true, peerDeathDetection: .connectionClosed
        )
    }

    static func socketPath(_ endpoint: Endpoint) -> String { endpoint.path(suffix: ".toy") }

    /// - Throws: ``IPCError/Code/endpointInUse`` if a live listener holds the endpoint;
    ///   ``IPCError/Code/invalidEndpoint`` for a group directory others could change.
    public func listen(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> ToyListener {
        try ToyListener(endpoint: endpoint, options: options, acceptFilter: acceptFilter)
    }

    /// Checks the group directory, and that whoever listens is this user (or root), before a
    /// byte is sent. A client the accept filter refused is invalidated with `accessDenied`.
    /// A listener whose backlog is full (stopped, or hung) costs a connect at most 5 s: a
    /// blocking `connect(2)` would wait for it without end.
    /// - Throws: ``IPCError/Code/endpointNotFound`` if nobody listens, or (busy) if the
    ///   listener's backlog stayed full; ``IPCError/Code/invalidEndpoint``;
    ///   ``IPCError/Code/accessDenied``.
    public func connect(to endpoint: Endpoint, options: ConnectionOptions) throws -> ToyConnection {
        try GroupDirectories.verify(endpoint.group)
        let fd = try UnixSocket.connect(path: Self.socketPath(endpoint), kind: .sequencedPacket, timeout: .seconds(5)) {
            EndpointLock.owner(of: endpoint) != nil
        }
        let channel = ToyChannel(fd: fd, maximumPayloadLength: options.maximumPayloadLength)
        let peer = try UnixSocket.peerCredentials(fd)
        try GroupDirectories.verifyListener(peer, at: Self.socketPath(endpoint))
        return try EngineConnection(channel: channel, peer: peer, options: options)
    }
}
