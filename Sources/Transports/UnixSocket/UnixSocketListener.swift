import IPCCore
public import IPCEngine
import IPCFraming
import IPCSystem

/// A listening `AF_UNIX` socket: accepts clients on the event loop (draining the accept queue on
/// each wake-up; backlog `SOMAXCONN`), passes each through the accept filter with its
/// kernel-verified credentials, and keeps the valid connections for broadcast and per-client
/// sends. The bookkeeping is the engine's ``SocketEndpoint``; this listener adds the channel.
public final class UnixSocketListener: SocketEndpointListener, Sendable {
    public let socketEndpoint: SocketEndpoint

    init(endpoint: Endpoint, framing: Framing, options: ConnectionOptions, acceptFilter: AcceptFilter?, activated: Bool = false) throws {
        socketEndpoint = try SocketEndpoint(
            endpoint: endpoint,
            path: UnixSocketTransport.socketPath(endpoint),
            acceptFilter: acceptFilter,
            activated: activated,
            accept: .immediately(refusal: UnixSocketTransport.refusal(framing: framing)) { fd, peer, listener in
                let channel = UnixSocketChannel(fd: fd, framing: framing, maximumPayloadLength: options.maximumPayloadLength)
                listener.serve(channel, peer: peer, options: options, label: "a unix-socket connection to \(endpoint.name)")
                return true
            },
            maximumConnections: options.maximumConnections,
            busyRefusal: UnixSocketTransport.refusal(framing: framing, text: UnixSocketTransport.busyText)
        )
    }
}
