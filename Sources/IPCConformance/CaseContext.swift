import Foundation
import IPCCore
import Synchronization

/// What one case runs in: a private group directory, and the peers, listeners and connections
/// it starts, all released when the case ends however it ends.
final class CaseContext: Sendable {
    let subject: ConformanceSubject
    let options: ConformanceOptions
    let group: GroupDirectory

    private struct State {
        var peers: [PeerHandle] = []
        /// Endpoints a server peer listened on, to reclaim at the end if it was killed.
        var servedEndpoints: Set<Endpoint> = []
        var listeners: [ListenerProbe] = []
        var connections: [ConnectionProbe] = []
        var measurements: [String: Double] = [:]
        var cleanups: [@Sendable () -> Void] = []
    }

    private let state = Mutex(State())

    /// - Throws: ``IPCError/Code/transportFailure`` if the group directory cannot be created.
    init(subject: ConformanceSubject, options: ConformanceOptions, caseID: String) throws {
        self.subject = subject
        self.options = options
        // Short: socket paths inside it must fit in sun_path's 108 bytes.
        let prefix = subject.temporaryDirectory.hasSuffix("/") ? subject.temporaryDirectory : subject.temporaryDirectory + "/"
        var template = Array((prefix + "ipcc-XXXXXX").utf8CString)
        guard let path = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw IPCError(code: .transportFailure, message: "cannot create a group directory in \(prefix): errno \(errno)")
        }
        group = GroupDirectory(path: String(cString: path))
    }

    var transport: ErasedTransport { subject.transport }
    var capabilities: TransportCapabilities { subject.capabilities }
    var deadline: Duration { options.invalidationDeadline }
    var measurements: [String: Double] { state.withLock { $0.measurements } }

    /// Records a number the report shows with the case's result.
    func record(_ name: String, _ value: Double) {
        state.withLock { $0.measurements[name] = value }
    }

    /// The endpoint called `name` in this case's group, as the subject makes endpoints.
    func endpoint(_ name: String) throws -> Endpoint {
        try subject.makeEndpoint(group, name)
    }

    /// Options for the suite's own connections: the declared maximum, and an echo handler. The
    /// echo computes its reply at once, so its tasks start on the loop's executor: served
    /// without a thread hand-over, and whatever else this process's cooperative threads are
    /// busy with (a test runner's, say).
    var connectionOptions: ConnectionOptions {
        .defaults {
            $0.maximumPayloadLength = capabilities.maximumPayloadLength
            $0.requestHandler = { _, payload in payload }
            $0.requestHandlerExecutor = .eventLoop
        }
    }

    /// Runs `cleanup` when the case ends, before its peers are shut down.
    func onTearDown(_ cleanup: @escaping @Sendable () -> Void) {
        state.withLock { $0.cleanups.append(cleanup) }
    }

    // MARK: Peers

    /// Starts a peer and returns at once, before it is ready.
    /// `configure` adjusts the rest of the peer's configuration (how it serves).
    func startPeer(
        _ role: ConformancePeer.Role, at endpoint: Endpoint, burst: (count: Int, size: Int)? = nil, grandchild: ConformancePeer.Grandchild? = nil,
        configure: (inout ConformancePeer.Configuration) -> Void = { _ in }
    ) throws -> PeerHandle {
        var configuration = ConformancePeer.Configuration(
            endpoint: endpoint, role: role, burstCount: burst?.count ?? 0, burstSize: burst?.size ?? 4, grandchild: grandchild
        )
        configure(&configuration)
        let peer = PeerHandle(try subject.peers.launch(configuration))
        state.withLock { state in
            state.peers.append(peer)
            if role == .server { state.servedEndpoints.insert(endpoint) }
        }
        return peer
    }

    /// Starts a peer and waits until it listens or is connected.
    func launchPeer(
        _ role: ConformancePeer.Role, at endpoint: Endpoint, burst: (count: Int, size: Int)? = nil, grandchild: ConformancePeer.Grandchild? = nil,
        configure: (inout ConformancePeer.Configuration) -> Void = { _ in }
    ) async throws -> PeerHandle {
        let peer = try startPeer(role, at: endpoint, burst: burst, grandchild: grandchild, configure: configure)
        try await peer.waitUntilReady()
        return peer
    }

    // MARK: This process's side

    /// Listens with the subject's transport in this process.
    func listen(_ endpoint: Endpoint, options: ConnectionOptions? = nil, acceptFilter: AcceptFilter? = nil) throws -> ListenerProbe {
        let listener = ListenerProbe(try transport.listen(endpoint, options ?? connectionOptions, acceptFilter))
        state.withLock { $0.listeners.append(listener) }
        return listener
    }

    /// Connects with the subject's transport's `async` connect.
    func connect(_ endpoint: Endpoint, options: ConnectionOptions? = nil) async throws -> ConnectionProbe {
        adopt(try await transport.connectSuspending(endpoint, options ?? connectionOptions))
    }

    /// Observes a connection made outside ``connect(_:options:)`` and invalidates it at the end.
    func adopt(_ connection: any MessageConnection) -> ConnectionProbe {
        let probe = ConnectionProbe(connection)
        state.withLock { $0.connections.append(probe) }
        return probe
    }

    /// A server peer on a fresh endpoint, and this process connected to it.
    func connectToServerPeer(_ name: String) async throws -> (peer: PeerHandle, connection: ConnectionProbe) {
        let endpoint = try endpoint(name)
        let peer = try await launchPeer(.server, at: endpoint)
        return (peer, try await connect(endpoint))
    }

    /// Sends a request to the peer's echo service and checks the reply.
    /// - Throws: ``ConformanceFailure`` if the reply differs; the request's error otherwise.
    func checkEcho(_ connection: ConnectionProbe, _ what: String, payload: [UInt8] = Array("echo".utf8)) async throws {
        let reply = try await connection.connection.request(payload, msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
        try check(reply == payload, "\(what): the echo of \(payload.count) bytes came back as \(reply.count) different bytes")
    }

    /// Releases everything the case started, newest first.
    ///
    /// What a killed server peer left behind (a socket file, a queue) outlives its group
    /// directory in some transports, so each endpoint a server peer served is reclaimed by
    /// listening on it once, as the transport allows for a stale endpoint, and closed.
    func tearDown() async {
        let (peers, listeners, connections, servedEndpoints, cleanups) = state.withLock { state in
            defer { state = State() }
            return (state.peers, state.listeners, state.connections, state.servedEndpoints, state.cleanups)
        }
        for cleanup in cleanups.reversed() { cleanup() }
        for connection in connections.reversed() { connection.connection.invalidate() }
        for listener in listeners.reversed() { listener.listener.close() }
        for peer in peers.reversed() { await peer.shutDown() }
        for endpoint in servedEndpoints {
            (try? transport.listen(endpoint, connectionOptions, nil))?.close()
        }
        subject.removeLeftovers?(group)
        try? FileManager.default.removeItem(atPath: group.path)
    }
}
