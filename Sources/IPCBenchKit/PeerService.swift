import FilePresenterTransport
import Foundation
public import IPCConformance
public import IPCCore
import IPCEngine

/// What a peer process does. The benchmark and the tests start the `ipcbench` executable in
/// peer mode (`ipcbench peer ...`) so that every measurement and every peer-death test crosses a
/// real process boundary. The server and client roles are the conformance kit's
/// ``ConformancePeer``, so that the harness, the tests and the conformance suite talk to the
/// same peer.
///
/// Requests are answered according to their msgid; one-way messages are echoed back as one-way
/// messages with the same msgid, which lets a test check delivery order end to end.
public typealias PeerRequest = ConformancePeer.Request

public enum PeerRole: String, Sendable, CaseIterable {
    /// Listen on the endpoint and serve every client.
    case server
    /// Connect to the endpoint and serve that one connection.
    case client
    /// Run file coordination commands from standard input (see `FileCoordinationPeer`).
    case coordinator
}

/// Runs the peer side until the connection (client role) ends or standard input closes (the
/// parent went away), so an orphaned peer never lingers.
public struct PeerService: Sendable {
    public var transport: any MessageTransport
    public var endpoint: Endpoint
    public var role: PeerRole
    /// A burst to send as soon as a client is connected: one-way messages with msgids 0, 1, ...
    /// whose payload starts with the msgid (4 bytes, big-endian), padded to ``burstSize`` bytes.
    public var burstCount: Int
    public var burstSize: Int
    /// A process to start before announcing readiness, which outlives this one when it is killed.
    public var grandchild: ConformancePeer.Grandchild?
    /// How the peer's connections wait for messages.
    public var waitStrategy: WaitStrategy
    /// How long the peer's connections let a frame stall half-read (`nil`: forever).
    public var stalledFrameTimeout: Duration?
    /// How requests are answered (``ConformancePeer/Configuration/serving``).
    public var serving: ConformancePeer.Serving
    /// How many requests of one connection are handled at once.
    public var maximumConcurrentRequests: Int
    /// The calling thread's identity and heap allocations so far, reported with the
    /// one-way throughput counts (``ConformancePeer/Sink``).
    public var allocationCount: (@Sendable () -> (thread: UInt64, allocations: UInt64))?
    /// Server role: take the listening socket from a launcher (``ConformancePeer/Configuration/activation``).
    public var activation: ConformancePeer.Configuration.Activation?
    /// Server role: refuse every client (``ConformancePeer/Configuration/refusesClients``).
    public var refusesClients: Bool
    /// Server role: the listener's connection limit (``ConformancePeer/Configuration/maximumConnections``).
    public var maximumConnections: Int?

    public init(
        transport: any MessageTransport,
        endpoint: Endpoint,
        role: PeerRole,
        burstCount: Int = 0,
        burstSize: Int = 4,
        grandchild: ConformancePeer.Grandchild? = nil,
        waitStrategy: WaitStrategy = .blocking,
        stalledFrameTimeout: Duration? = ConnectionOptions.defaults.stalledFrameTimeout,
        serving: ConformancePeer.Serving = .task,
        maximumConcurrentRequests: Int = 1,
        allocationCount: (@Sendable () -> (thread: UInt64, allocations: UInt64))? = nil,
        activation: ConformancePeer.Configuration.Activation? = nil,
        refusesClients: Bool = false,
        maximumConnections: Int? = nil
    ) {
        self.maximumConnections = maximumConnections
        self.activation = activation
        self.refusesClients = refusesClients
        self.serving = serving
        self.maximumConcurrentRequests = maximumConcurrentRequests
        self.stalledFrameTimeout = stalledFrameTimeout
        self.allocationCount = allocationCount
        self.transport = transport
        self.endpoint = endpoint
        self.role = role
        self.burstCount = burstCount
        self.burstSize = burstSize
        self.grandchild = grandchild
        self.waitStrategy = waitStrategy
    }

    /// The payload of message `index` of a burst.
    public static func burstPayload(_ index: Int, size: Int) -> [UInt8] {
        ConformancePeer.burstPayload(index, size: size)
    }

    public func run() async throws {
        switch role {
        case .server, .client:
            let configuration = ConformancePeer.Configuration(
                endpoint: endpoint,
                role: role == .server ? .server : .client,
                burstCount: burstCount,
                burstSize: burstSize,
                grandchild: grandchild,
                waitStrategy: waitStrategy,
                stalledFrameTimeout: stalledFrameTimeout,
                serving: serving,
                maximumConcurrentRequests: maximumConcurrentRequests,
                activation: activation,
                refusesClients: refusesClients,
                maximumConnections: maximumConnections
            )
            try await ConformancePeer(
                transport: transport, configuration: configuration, allocationCount: allocationCount,
                loopStalls: { (try? EventLoop.shared()).flatMap { try? JSONEncoder().encode($0.stalls) }.map(Array.init) ?? [] }
            ).run()
        case .coordinator:
            var peer = FileCoordinationPeer(group: endpoint.group)
            peer.run()
        }
    }
}
