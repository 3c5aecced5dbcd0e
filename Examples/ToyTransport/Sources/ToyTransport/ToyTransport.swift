import IPCCore
import IPCEngine

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
            maximumPayloadLength: Self.maximumPayloadLength,
            preservesOrder: true,
            supportsRequestReply: true,
            supportsBroadcast: true,
            supportsAcceptFilter: false,
            peerDeathDetection: .connectionClosed
        )
    }

    /// - Throws: ``IPCError/Code/endpointInUse`` if a live listener holds the endpoint;
    ///   ``IPCError/Code/unsupportedOperation`` for an accept filter.
    public func listen(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> ToyListener {
        guard acceptFilter == nil else {
            throw IPCError(code: .unsupportedOperation, message: "the toy transport has no accept filter")
        }
        return try ToyListener(endpoint: endpoint, options: options)
    }

    /// - Throws: ``IPCError/Code/endpointNotFound`` if nobody listens.
    public func connect(to endpoint: Endpoint, options: ConnectionOptions) throws -> ToyConnection {
        let fd = try PacketSocket.connect(path: endpoint.path(suffix: ".toy"))
        return try EngineConnection(channel: ToyChannel(fd: fd, maximumPayloadLength: options.maximumPayloadLength), peer: nil, options: options)
    }
}
