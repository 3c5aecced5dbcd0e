public import ArgumentParser
import CMallocCounter
import Glibc
import IPCBenchKit
import IPCConformance
import IPCCore
import IPCFraming
import IPCSystem

struct PeerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "peer",
        abstract: "Run the peer side of a measurement or test (started by ipcbench and its tests).",
        discussion: """
        Serves the echo service on an endpoint (server role) or on a connection to one (client \
        role). Prints 'READY <pid>' once listening or connected, and exits when its standard \
        input closes.

        Requests, by msgid: 1 echo (reply with the payload); 2 stall (never reply: holds its \
        own connection only, until the connection ends, which cancels it); 3 fail (answered with a \
        failure frame, the request's correlation id and a UTF-8 message: a Swift requester \
        gets transportFailure); 4 delayed echo (the payload's first 4 bytes, \
        big-endian, are the delay in milliseconds, at most 60000); 5 the number of handlers \
        cancelled so far (8 bytes, big-endian); 6 the event loop's stalls (JSON); any other \
        msgid is echoed. One-way messages are \
        echoed back with their msgid, except the throughput sink's (0xFFFFFF00 counted, \
        0xFFFFFF01 answered with a report). Payloads of up to 1 GiB are accepted (the \
        library's default is 64 MiB); a larger announced length ends the connection \
        (frameTooLarge). Wire format: docs/WIRE-FORMAT.md; the sink and every msgid: \
        docs/HARNESS.md.

        --serve chooses how requests are answered: 'task' (the default: the async request \
        handler, as tasks on the engine's serving threads), 'task-on-loop' (the async handler \
        started on the event loop's executor) or 'on-loop' (the synchronous fast path on the \
        loop, which answers echo and fail only); 'blocking-on-loop' is the way not to serve \
        (the on-loop path with a handler that blocks the loop's thread in stall and delayed \
        echo), for showing that the conformance suite's serving cases can fail.

        --refuse-clients (server role) listens with an accept filter that refuses every \
        client: a unix-socket client reads one failure frame with correlation 0 and msgid 0, \
        then the socket closes (docs/WIRE-FORMAT.md 1.1); the other transports' connects fail \
        with accessDenied.

        --maximum-connections N (server role) keeps at most N connections at once: a client \
        past them is turned away as busy (a unix-socket client reads one failure frame with \
        correlation 0 whose text begins 'endpointNotFound:'; the other transports' connects \
        fail with endpointNotFound), and may try again once a connection has ended.

        Socket activation (server role; unix-socket, notify, file-presenter): with \
        --socket-activated the listening socket comes from a launcher (systemd, or \
        systemd-socket-activate) through LISTEN_PID/LISTEN_FDS, and must be bound to the path \
        --print-activation-socket prints. Standard input is then not watched; the peer runs \
        until killed, or until --exit-when-idle SECONDS pass with no connection. \
        --idle-hand-over says how the socket is left then: keep-socket (the launcher holds it, \
        as systemd does: a connection arriving during the exit waits for the next instance) or \
        refuse (the socket dies with the peer, as under systemd-socket-activate: new connects \
        are refused first, which clients retry, and those already accepted are served).
        """
    )

    @Option(help: "Transport: \(TransportCatalog.names.joined(separator: ", ")).")
    var transport: String = "unix-socket"

    @Option(help: "Framing: binary, http or llbsd.")
    var framing: Framing = .binary

    @Option(help: "Group directory (absolute path).")
    var group: String

    @Option(help: "Endpoint name inside the group directory.")
    var endpoint: String

    @Option(help: "server, client, or coordinator (file-presenter: runs file coordination commands from standard input, for the conformance suite).")
    var role: PeerRole = .server

    @Option(help: "Pin this process to one CPU.")
    var cpu: Int?

    @Option(help: "Client role: send this many one-way messages as soon as connected (msgid = index).")
    var burstCount: Int = 0

    @Option(help: "Bytes per burst message (at least 4: the index, big-endian, then padding).")
    var burstSize: Int = 4

    @Option(help: "Start a child that outlives this process before announcing READY: spawn, fork or spawn-leaking-descriptors.")
    var grandchild: ConformancePeer.Grandchild?

    @Option(help: ArgumentHelp("Set this file mode creation mask (octal) first, as a careless parent might.", visibility: .hidden))
    var umask: String?

    @Option(help: "Spin this long (microseconds) polling for messages before blocking; 0 blocks at once.")
    var spinMicroseconds: Int64 = 0

    @Option(help: "Drop a connection whose frame stays half-read this long (seconds); 0 never drops one.")
    var stalledFrameSeconds: Int64 = ConnectionOptions.defaults.stalledFrameTimeout?.components.seconds ?? 0

    @Option(help: "How requests are answered: task, task-on-loop, on-loop or blocking-on-loop (see above).")
    var serve: ConformancePeer.Serving = .task

    @Option(help: "How many requests of one connection are handled at once (1: one at a time, in arrival order).")
    var requestConcurrency: Int = 1

    @Flag(help: "Server role: take the listening socket from a launcher (LISTEN_PID, LISTEN_FDS); see above.")
    var socketActivated = false

    @Option(help: "With --socket-activated: exit after this many seconds with no connection.")
    var exitWhenIdle: Double?

    @Option(help: "With --exit-when-idle: keep-socket (a launcher that holds the socket, like systemd) or refuse (one that execs the peer, like systemd-socket-activate).")
    var idleHandOver: IdleHandOver = .launcherKeepsSocket

    @Flag(help: "Server role: refuse every client with the listener's refusal (the accept filter's 'no'; on unix sockets one failure frame with correlation 0, WIRE-FORMAT.md 1.1).")
    var refuseClients = false

    @Option(help: "Server role: keep at most this many connections at once, turning the next clients away as busy (endpointNotFound; WIRE-FORMAT.md 1.1).")
    var maximumConnections: Int?

    @Flag(help: "Print the socket path a launcher must listen on for this transport and endpoint (creating the group directory, owner-only, if needed), and exit.")
    var printActivationSocket = false

    func validate() throws {
        if let exitWhenIdle {
            guard socketActivated else { throw ValidationError("--exit-when-idle needs --socket-activated") }
            guard exitWhenIdle > 0, exitWhenIdle <= 86_400 else { throw ValidationError("--exit-when-idle takes 0 < seconds <= 86400") }
        }
        if socketActivated, role != .server { throw ValidationError("--socket-activated is for the server role") }
        if refuseClients, role != .server { throw ValidationError("--refuse-clients is for the server role") }
        if let maximumConnections {
            guard role == .server else { throw ValidationError("--maximum-connections is for the server role") }
            guard (1...1_000_000).contains(maximumConnections) else { throw ValidationError("--maximum-connections takes 1 to 1000000") }
        }
        guard (1...1024).contains(requestConcurrency) else { throw ValidationError("--request-concurrency takes 1 to 1024") }
        guard spinMicroseconds >= 0 else { throw ValidationError("--spin-microseconds cannot be negative") }
        guard stalledFrameSeconds >= 0 else { throw ValidationError("--stalled-frame-seconds cannot be negative") }
    }

    func run() async throws {
        if let umask {
            guard let mask = mode_t(umask, radix: 8) else { throw ValidationError("--umask takes an octal mask, got \(umask)") }
            _ = Glibc.umask(mask)
        }
        if let cpu { try CPUAffinity.pinCurrentProcess(to: [cpu]) }
        let transport = try TransportCatalog.transport(named: transport, framing: framing)
        let endpoint = try Endpoint(group: GroupDirectory(path: group), name: endpoint)
        if printActivationSocket || socketActivated {
            guard let activatable = transport as? any SocketActivatedTransport else {
                throw ValidationError("\(transport.name) cannot be socket-activated: its endpoint is a POSIX message queue, which no launcher holds or passes; clients can start it on demand instead (ServiceConnection's startingOnDemand)")
            }
            if printActivationSocket {
                // The launcher binds there, so the directory must exist, owner-only, first.
                try GroupDirectories.prepare(endpoint.group)
                print(activatable.activationSocketPath(for: endpoint))
                return
            }
        }
        let service = PeerService(
            transport: transport,
            endpoint: endpoint,
            role: role,
            burstCount: burstCount,
            burstSize: burstSize,
            grandchild: grandchild,
            waitStrategy: WaitStrategy(spinFor: .microseconds(spinMicroseconds)),
            stalledFrameTimeout: stalledFrameSeconds == 0 ? nil : .seconds(stalledFrameSeconds),
            serving: serve,
            maximumConcurrentRequests: requestConcurrency,
            allocationCount: { (UInt64(pthread_self()), ipc_thread_allocation_count()) },
            activation: socketActivated ? .init(idleExit: exitWhenIdle.map { .milliseconds(Int64(($0 * 1000).rounded())) }, handOver: idleHandOver) : nil,
            refusesClients: refuseClients,
            maximumConnections: maximumConnections
        )
        try await service.run()
    }
}

extension PeerRole: ExpressibleByArgument {}
extension ConformancePeer.Grandchild: ExpressibleByArgument {}
extension ConformancePeer.Serving: ExpressibleByArgument {}
extension IdleHandOver: ExpressibleByArgument {}
