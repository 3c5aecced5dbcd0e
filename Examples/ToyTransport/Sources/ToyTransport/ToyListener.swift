import IPCCore
import IPCEngine
import IPCSystem

/// A listening toy endpoint: the socket `G/name.toy`. Everything but the channel is the engine's
/// ``SocketEndpoint``: the group directory's checks, the endpoint's lock (a second listener is
/// refused, a dead one's socket reclaimed), accepting on the event loop, the accept filter on the
/// kernel's credentials, the registry of connections, broadcast and closing.
public final class ToyListener: SocketEndpointListener, Sendable {
    public let socketEndpoint: SocketEndpoint

    init(endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws {
        socketEndpoint = try SocketEndpoint(
            endpoint: endpoint, path: ToyTransport.socketPath(endpoint), kind: .sequencedPacket, acceptFilter: acceptFilter,
            // A refused client reads a failure frame with correlation 0 (no request has it), which
            // the engine reports as the end of the connection with `accessDenied`.
            accept: .immediately(refusal: ToyChannel.packet(Frame(kind: .failure, msgid: 0, correlation: 0, payload: Array("accessDenied: refused".utf8)))) { fd, peer, listener in
                listener.serve(ToyChannel(fd: fd, maximumPayloadLength: options.maximumPayloadLength), peer: peer, options: options, label: "a toy connection")
                return true
            }
        )
    }
}
