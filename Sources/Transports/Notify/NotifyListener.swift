import CIPCShims
import Glibc
import IPCCore
public import IPCEngine
import IPCSystem
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
public final class NotifyListener: SocketEndpointListener, Sendable {
    /// Clients that connected and have not finished their hello, at most.
    public static let maximumPendingHandshakes = 64

    public let socketEndpoint: SocketEndpoint

    init(endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?, handshakeTimeout: Duration, activated: Bool = false) throws {
        socketEndpoint = try SocketEndpoint(
            endpoint: endpoint,
            path: NotifyRendezvous.socketPath(endpoint),
            acceptFilter: acceptFilter,
            activated: activated,
            accept: .afterHandshake(timeout: handshakeTimeout, maximumPending: Self.maximumPendingHandshakes) { fd, peer, listener in
                Self.takeHello(fd, peer: peer, options: options, listener: listener)
            },
            maximumConnections: options.maximumConnections
        )
    }

    /// Takes a client's hello when its socket is readable (loop thread): one message of
    /// ``NotifyRendezvous/helloLength`` bytes with the store and the two doorbells.
    private static func takeHello(_ fd: FileDescriptor, peer: PeerCredentials, options: ConnectionOptions, listener: SocketEndpoint) -> RendezvousHandshake {
        var hello = [UInt8](repeating: 0, count: NotifyRendezvous.helloLength)
        var descriptors = [CInt](repeating: -1, count: NotifyRendezvous.descriptorCount)
        var received: CInt = 0
        let count = hello.withUnsafeMutableBytes { bytes in
            descriptors.withUnsafeMutableBufferPointer { fds in
                ipc_receive_with_descriptors(fd.rawValue, bytes.baseAddress, UInt(bytes.count), fds.baseAddress, CInt(fds.count), &received)
            }
        }
        if count < 0, errno == EAGAIN || errno == EWOULDBLOCK { return .incomplete }
        let handed = Array(descriptors.prefix(Int(max(0, received))))
        // Whatever is wrong with it, the client gets an answer and nothing it handed over stays open.
        guard count == NotifyRendezvous.helloLength, handed.count == NotifyRendezvous.descriptorCount,
            let capacity = NotifyRendezvous.ringCapacity(ofHello: hello[...]),
            let channel = try? Self.channel(memfd: handed[0], ownBell: handed[1], peerBell: handed[2], ringCapacity: capacity, options: options)
        else {
            handed.forEach { try? FileDescriptor(rawValue: $0).close() }
            return .finished(.malformed)
        }
        try? FileDescriptor(rawValue: handed[0]).close()
        // Registered before the client hears it is accepted, so that a client that has
        // connected is among ``activeConnections``.
        let kept = listener.keep { onInvalidated in
            try NotifyTransport.serve(channel, peer: peer, options: options, endpoint: listener.endpoint, onInvalidated: onInvalidated)
        }
        return .finished(kept == nil ? .malformed : .accepted)
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
