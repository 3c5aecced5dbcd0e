public import IPCCore

extension ConformancePeer {
    /// Which side of an endpoint a peer takes.
    public enum Role: String, Sendable, Hashable, CaseIterable {
        /// Listen on the endpoint and serve every client.
        case server
        /// Connect to the endpoint and serve that one connection.
        case client
    }

    /// A process the peer starts just before it announces itself, which outlives the peer when
    /// the peer is killed: the peer-death cases check that the survivor still sees the death.
    public enum Grandchild: String, Sendable, Hashable, CaseIterable {
        /// Started with `posix_spawn`: it inherits exactly the descriptors that are not
        /// close-on-exec, so it holds a connection open only if the transport leaked one.
        case spawn
        /// Started with `fork` and no `exec`: it holds every descriptor the peer had, so end of
        /// file never comes and only a transport that watches the peer's process sees the death.
        case fork
        /// Like ``spawn``, after clearing close-on-exec on every descriptor: what a transport that
        /// leaks its descriptors into children does. For showing that the spawn case can fail.
        case spawnLeakingDescriptors = "spawn-leaking-descriptors"
    }

    /// How a peer answers requests.
    public enum Serving: String, Sendable, Hashable, CaseIterable {
        /// ``ConnectionOptions/requestHandler`` on the engine's serving threads (the default
        /// ``RequestHandlerExecutor/servingThreads``): the way to serve.
        case task
        /// ``ConnectionOptions/requestHandler`` started on the loop's executor
        /// (``RequestHandlerExecutor/eventLoop``).
        case taskOnLoop = "task-on-loop"
        /// The fast path, ``ConnectionOptions/onLoopRequestHandler``: answers echoes and failures
        /// only (``ConformancePeer/onLoopRequestHandler``).
        case onLoop = "on-loop"
        /// The way not to serve, for showing that the serving cases (area 11) can fail: the
        /// on-loop fast path with a handler that blocks the loop's thread in a stall and a
        /// delayed echo, as a synchronous handler that sleeps would.
        case blockingOnLoop = "blocking-on-loop"
    }

    /// What a peer process does, and the command-line arguments that say it:
    /// `--group DIR --endpoint NAME --role server|client [--burst-count N --burst-size BYTES]
    /// [--grandchild spawn|fork|spawn-leaking-descriptors] [--spin-microseconds N]
    /// [--stalled-frame-seconds N] [--serve task|task-on-loop|on-loop] [--request-concurrency N]
    /// [--socket-activated [--exit-when-idle SECONDS] [--idle-hand-over keep-socket|refuse]]`.
    public struct Configuration: Sendable, Hashable {
        /// A server started by a launcher that holds its listening socket (systemd socket
        /// activation: ``SocketActivatedTransport``). Its standard input is the launcher's
        /// (often `/dev/null`), so it does not end with it: it runs until it is idle for
        /// ``idleExit``, or until it is killed.
        public struct Activation: Sendable, Hashable {
            /// Exit after this long with no connection (`nil`: never).
            public var idleExit: Duration?
            /// How the socket is left at an idle exit.
            public var handOver: IdleHandOver

            public init(idleExit: Duration? = nil, handOver: IdleHandOver = .launcherKeepsSocket) {
                self.idleExit = idleExit
                self.handOver = handOver
            }
        }

        public var endpoint: Endpoint
        public var role: Role
        /// Client role: one-way messages sent as soon as connected, msgid = index, payload from
        /// ``ConformancePeer/burstPayload(_:size:)``.
        public var burstCount: Int
        /// Bytes per burst message (at least 4).
        public var burstSize: Int
        public var grandchild: Grandchild?
        /// How the peer's connections wait (``ConnectionOptions/waitStrategy``).
        public var waitStrategy: WaitStrategy
        /// How long the peer's connections let a frame stall half-read
        /// (``ConnectionOptions/stalledFrameTimeout``; `nil`: forever). `--stalled-frame-seconds`,
        /// 0 for forever.
        public var stalledFrameTimeout: Duration?
        /// How requests are answered. `--serve`.
        public var serving: Serving
        /// How many requests of one connection are handled at once
        /// (``ConnectionOptions/maximumConcurrentRequests``). `--request-concurrency`.
        public var maximumConcurrentRequests: Int
        /// Server role: take the listening socket from a launcher. `--socket-activated`.
        public var activation: Activation?
        /// Server role: an accept filter that refuses every client, so that a client can meet
        /// the listener's refusal (WIRE-FORMAT.md 1.1 on unix sockets). `--refuse-clients`.
        public var refusesClients: Bool
        /// Server role: the listener's ``ConnectionOptions/maximumConnections``, so that a client
        /// can meet a full listener's refusal (WIRE-FORMAT.md 1.1). `--maximum-connections`.
        public var maximumConnections: Int?

        public init(
            endpoint: Endpoint, role: Role, burstCount: Int = 0, burstSize: Int = 4, grandchild: Grandchild? = nil, waitStrategy: WaitStrategy = .blocking,
            stalledFrameTimeout: Duration? = ConnectionOptions.defaults.stalledFrameTimeout, serving: Serving = .task, maximumConcurrentRequests: Int = 1,
            activation: Activation? = nil, refusesClients: Bool = false, maximumConnections: Int? = nil
        ) {
            self.maximumConnections = maximumConnections
            self.activation = activation
            self.refusesClients = refusesClients
            self.serving = serving
            self.maximumConcurrentRequests = maximumConcurrentRequests
            self.endpoint = endpoint
            self.role = role
            self.burstCount = burstCount
            self.burstSize = burstSize
            self.grandchild = grandchild
            self.waitStrategy = waitStrategy
            self.stalledFrameTimeout = stalledFrameTimeout
        }

        /// The arguments that describe this configuration, for a peer executable's command line.
        public var arguments: [String] {
            var arguments = ["--group", endpoint.group.path, "--endpoint", endpoint.name, "--role", role.rawValue]
            if burstCount > 0 { arguments += ["--burst-count", String(burstCount), "--burst-size", String(burstSize)] }
            if let grandchild { arguments += ["--grandchild", grandchild.rawValue] }
            if waitStrategy.spins { arguments += ["--spin-microseconds", String(waitStrategy.spinNanoseconds / 1000)] }
            if stalledFrameTimeout != ConnectionOptions.defaults.stalledFrameTimeout {
                arguments += ["--stalled-frame-seconds", String(stalledFrameTimeout?.components.seconds ?? 0)]
            }
            if serving != .task { arguments += ["--serve", serving.rawValue] }
            if maximumConcurrentRequests != 1 { arguments += ["--request-concurrency", String(maximumConcurrentRequests)] }
            if let activation {
                arguments.append("--socket-activated")
                if let idle = activation.idleExit { arguments += ["--exit-when-idle", Self.seconds(idle)] }
                if activation.handOver != .launcherKeepsSocket { arguments += ["--idle-hand-over", activation.handOver.rawValue] }
            }
            if refusesClients { arguments.append("--refuse-clients") }
            if let maximumConnections { arguments += ["--maximum-connections", String(maximumConnections)] }
            return arguments
        }

        /// Parses arguments of the form ``arguments`` writes.
        /// - Throws: ``IPCError/Code/invalidEndpoint`` for a bad group or endpoint;
        ///   ``IPCError/Code/unsupportedOperation`` for an unknown, missing or malformed option.
        public init(arguments: some Sequence<String>) throws {
            var values: [String: String] = [:]
            var iterator = arguments.makeIterator()
            var activated = false
            var refusing = false
            while let option = iterator.next() {
                if option == "--socket-activated" {
                    activated = true
                    continue
                }
                if option == "--refuse-clients" {
                    refusing = true
                    continue
                }
                let known = ["--group", "--endpoint", "--role", "--burst-count", "--burst-size", "--grandchild", "--spin-microseconds", "--stalled-frame-seconds", "--serve", "--request-concurrency", "--exit-when-idle", "--idle-hand-over", "--maximum-connections"]
                guard known.contains(option), let value = iterator.next() else {
                    throw IPCError(code: .unsupportedOperation, message: "unexpected peer argument \(option.debugDescription); expected \(known.joined(separator: ", ")), each with a value")
                }
                values[option] = value
            }
            func value<T>(_ option: String, _ parse: (String) -> T?) throws -> T? {
                guard let text = values[option] else { return nil }
                guard let parsed = parse(text) else {
                    throw IPCError(code: .unsupportedOperation, message: "bad value \(text.debugDescription) for \(option)")
                }
                return parsed
            }
            guard let group = values["--group"], let name = values["--endpoint"] else {
                throw IPCError(code: .unsupportedOperation, message: "a peer needs --group and --endpoint")
            }
            self.init(
                endpoint: try Endpoint(group: GroupDirectory(path: group), name: name),
                role: try value("--role", Role.init(rawValue:)) ?? .server,
                burstCount: try value("--burst-count") { Int($0) } ?? 0,
                burstSize: try value("--burst-size") { Int($0) } ?? 4,
                grandchild: try value("--grandchild", Grandchild.init(rawValue:)),
                waitStrategy: WaitStrategy(spinFor: .microseconds(try value("--spin-microseconds") { Int64($0).flatMap { $0 >= 0 ? $0 : nil } } ?? 0)),
                stalledFrameTimeout: try value("--stalled-frame-seconds") { Int64($0).flatMap { $0 >= 0 ? $0 : nil } }
                    .map { $0 == 0 ? nil : .seconds($0) } ?? ConnectionOptions.defaults.stalledFrameTimeout,
                serving: try value("--serve", Serving.init(rawValue:)) ?? .task,
                maximumConcurrentRequests: try value("--request-concurrency") { Int($0).flatMap { (1...1024).contains($0) ? $0 : nil } } ?? 1,
                activation: activated ? Activation(
                    idleExit: try value("--exit-when-idle") { Double($0).flatMap { $0 > 0 && $0 <= 86_400 ? Duration.milliseconds(Int64(($0 * 1000).rounded())) : nil } },
                    handOver: try value("--idle-hand-over", IdleHandOver.init(rawValue:)) ?? .launcherKeepsSocket
                ) : nil,
                refusesClients: refusing,
                maximumConnections: try value("--maximum-connections") { Int($0).flatMap { (1...1_000_000).contains($0) ? $0 : nil } }
            )
            if refusing, role != .server {
                throw IPCError(code: .unsupportedOperation, message: "--refuse-clients is for the server role")
            }
            if maximumConnections != nil, role != .server {
                throw IPCError(code: .unsupportedOperation, message: "--maximum-connections is for the server role")
            }
            if !activated, values["--exit-when-idle"] != nil || values["--idle-hand-over"] != nil {
                throw IPCError(code: .unsupportedOperation, message: "--exit-when-idle and --idle-hand-over need --socket-activated")
            }
        }

        /// `duration` in seconds, as `--exit-when-idle` takes it (milliseconds kept).
        static func seconds(_ duration: Duration) -> String {
            let milliseconds = duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
            return milliseconds % 1000 == 0 ? String(milliseconds / 1000) : String(Double(milliseconds) / 1000)
        }
    }
}
