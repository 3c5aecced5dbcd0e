import IPCCore

/// Area 6: the peer is a separate process killed with SIGKILL at the worst moments. The
/// survivor must report invalidation within the deadline (the time from the kill is recorded),
/// fail what was pending, release its resources, and, as a server, keep serving other clients.
enum PeerDeathCases {
    static let all: [ConformanceCase] = [idle, midRequest, midFrame, setUpServerSurvives, setUpClientSurvives, spawnedGrandchild, forkedGrandchild, otherClients, latency]

    static let idle = ConformanceCase("6.1", "Idle peer killed: the survivor is invalidated within the deadline, its message stream ends, later sends fail with invalidated, and the connection's descriptors are closed", requires: .peerDeathDetection) { context in
        let endpoint = try context.endpoint("idle")
        let peer = try await context.launchPeer(.server, at: endpoint)
        // A first connection creates whatever the transport shares between connections (a
        // process watcher, say), so that the snapshot below sees only this connection's own.
        let warmUp = try await context.connect(endpoint)
        warmUp.connection.invalidate()
        _ = await warmUp.invalidation(within: context.deadline)
        let before = DescriptorSnapshot.current()
        let connection = try await context.connect(endpoint)
        let opened = before.flatMap { DescriptorSnapshot.current()?.opened(since: $0) } ?? []
        let killedAt = peer.kill()
        let (delay, reason) = try await survivorInvalidated(connection, killedAt: killedAt, context, "the client of the killed peer")
        try check(await poll(within: context.deadline) { connection.streamFinishedAt != nil }, "the message stream did not finish")
        try await checkError([.invalidated], "a send after the peer's death was reported") {
            try connection.connection.send([1], msgid: 1, timeout: .seconds(1))
        }
        let leaked = await DescriptorSnapshot.waitUntilClosed(opened, within: .seconds(1))
        try check(leaked.isEmpty, "descriptors the connection opened are still open after invalidation: \(leaked.sorted().joined(separator: ", "))")
        let released = before == nil ? "descriptors not checked (no /proc/self/fd)" : "its \(opened.count) descriptors closed"
        return .passed("invalidated (\(reason)) \(delay.formattedMilliseconds) after the kill; \(released)")
    }

    static let midRequest = ConformanceCase("6.2", "Peer killed while requests are pending: each fails with peerInvalidated within the deadline", requires: .peerDeathDetection, .requestReply) { context in
        let (peer, connection) = try await context.connectToServerPeer("midrequest")
        let pending = (0..<3).map { _ in
            Task { try await connection.connection.request([1], msgid: ConformancePeer.Request.stall, sendTimeout: .seconds(5), receiveTimeout: .seconds(120)) }
        }
        try await Task.sleep(for: .milliseconds(200))
        let killedAt = peer.kill()
        var slowest = Duration.zero
        for (index, request) in pending.enumerated() {
            guard let outcome = await result(of: request, within: context.deadline) else {
                throw ConformanceFailure("pending request \(index) had not failed \(context.deadline) after the kill")
            }
            guard case .failure(let error as IPCError) = outcome, error.code == .peerInvalidated else {
                throw ConformanceFailure("pending request \(index) ended with \(outcome), not peerInvalidated")
            }
            slowest = max(slowest, ContinuousClock.now - killedAt)
        }
        context.record("killToFailureMilliseconds", slowest.milliseconds)
        _ = try await survivorInvalidated(connection, killedAt: killedAt, context, "the requester")
        return .passed("3 pending requests failed with peerInvalidated within \(slowest.formattedMilliseconds) of the kill")
    }

    static let midFrame = ConformanceCase("6.3", "Peer killed in the middle of writing a large message: the server drops that connection within the deadline, delivers nothing partial, and keeps serving", requires: .peerDeathDetection) { context in
        let listener = try context.listen(try context.endpoint("midframe"))
        let size = min(8 << 20, context.capabilities.maximumPayloadLength)
        let peer = try await context.launchPeer(.client, at: listener.endpoint, burst: (16, size))
        let connection = try await listener.nextConnection(within: .seconds(10), "the writing peer")
        // Kill as soon as the first message is in: the peer is then writing the next.
        _ = try await connection.messages(1, within: .seconds(30), "the first large message")
        let killedAt = peer.kill()
        let (delay, reason) = try await survivorInvalidated(connection, killedAt: killedAt, context, "the server's side of the killed writer")
        let delivered = connection.messages
        for (index, message) in delivered.enumerated() {
            try check(message.msgid == UInt32(index) && TestPayload.equal(message.payload, ConformancePeer.burstPayload(index, size: size)), "message \(index) of \(delivered.count) delivered was partial or altered (\(message.payload.count) bytes)")
        }
        try await checkServesNewClient(listener, context)
        return .passed("\(delivered.count) whole \(size.formattedBytes) messages delivered, then invalidated (\(reason)) \(delay.formattedMilliseconds) after the kill; a new client was served")
    }

    static let setUpServerSurvives = ConformanceCase("6.4.1", "Clients killed at moments throughout connection set-up leave no connection behind, and the server keeps serving", requires: .peerDeathDetection) { context in
        let listener = try context.listen(try context.endpoint("setup"))
        // How long a client takes from launch to being accepted, to spread the kills over it.
        let start = ContinuousClock.now
        _ = try await context.launchPeer(.client, at: listener.endpoint)
        let survivor = try await listener.nextConnection(within: .seconds(10), "the first client")
        let setUp = ContinuousClock.now - start
        // The last kills come after set-up, so that some connections are accepted and must go.
        let fractions = [0.3, 0.6, 0.8, 0.9, 1.0, 1.1, 1.3, 2.0]
        for fraction in fractions {
            let peer = try context.startPeer(.client, at: listener.endpoint)
            try await Task.sleep(for: setUp * fraction)
            peer.kill()
            await peer.shutDown()
        }
        let lastKill = ContinuousClock.now
        let killed = listener.takeAccepted()
        for (index, connection) in killed.enumerated() {
            _ = try await connection.invalidationDelay(since: lastKill, within: context.deadline, "accepted connection \(index) of a killed client")
        }
        try check(survivor.connection.invalidationReason == nil, "the first client's connection was invalidated: \(survivor.connection.invalidationReason!)")
        let cleared = await poll(within: context.deadline) { listener.listener.activeConnections().count == 1 }
        try check(cleared, "the listener still counts \(listener.listener.activeConnections().count) active connections for 1 live client")
        try await checkServesNewClient(listener, context)
        return .passed("\(fractions.count) clients killed between \(Int(fractions[0] * 100))% and \(Int(fractions.last! * 100))% of a \(setUp.formattedMilliseconds) set-up (\(killed.count) got accepted) left nothing behind; a new client was served")
    }

    static let setUpClientSurvives = ConformanceCase("6.4.2", "A server killed while a client connects: connect fails with a typed error or returns a connection that is invalidated; within the deadline (recommended), never hanging", requires: .peerDeathDetection) { context in
        var slowest = Duration.zero
        var outcomes: [String] = []
        for (index, delay) in [0, 1, 3].enumerated() {
            let endpoint = try context.endpoint("race\(index)")
            let server = try await context.launchPeer(.server, at: endpoint)
            let connecting = Task { try await context.connect(endpoint) }
            try await Task.sleep(for: .milliseconds(delay))
            let killedAt = server.kill()
            guard let outcome = await result(of: connecting, within: .seconds(15)) else {
                throw ConformanceFailure("connect to a server killed \(delay) ms into it had not returned 15 s later")
            }
            switch outcome {
            case .success(let connection):
                guard let invalidatedAt = await connection.invalidation(within: context.deadline + .seconds(15)) else {
                    throw ConformanceFailure("the connection to a server killed \(delay) ms into connect was never invalidated")
                }
                slowest = max(slowest, invalidatedAt - killedAt)
                outcomes.append("connected then invalidated")
            case .failure(let error as IPCError):
                slowest = max(slowest, ContinuousClock.now - killedAt)
                outcomes.append("connect failed with \(error.code)")
            case .failure(let error):
                throw ConformanceFailure("connect to a server killed during it threw \(error), not an IPCError")
            }
        }
        context.record("slowestKillToOutcomeMilliseconds", slowest.milliseconds)
        let summary = outcomes.joined(separator: "; ") + "; the slowest \(slowest.formattedMilliseconds) after the kill"
        return slowest <= context.deadline ? .passed(summary) : .nonStrict(summary + ", beyond the deadline of \(context.deadline)")
    }

    static let spawnedGrandchild = ConformanceCase("6.5.1", "Peer killed while a child it spawned lives on: the survivor is still invalidated within the deadline (the transport leaks no descriptor to children)", requires: .peerDeathDetection) { context in
        try await grandchildOutlivesPeer(.spawn, context)
    }

    static let forkedGrandchild = ConformanceCase("6.5.2", "Peer killed while a forked child holds all its descriptors: the survivor is still invalidated within the deadline (end of file is not death)", requires: .processWatch) { context in
        try await grandchildOutlivesPeer(.fork, context)
    }

    static let otherClients = ConformanceCase("6.6", "A client killed with SIGKILL does not disturb the server's other clients", requires: .peerDeathDetection) { context in
        let listener = try context.listen(try context.endpoint("others"))
        let doomed = try await context.launchPeer(.client, at: listener.endpoint)
        let doomedConnection = try await listener.nextConnection(within: .seconds(10), "the first client")
        _ = try await context.launchPeer(.client, at: listener.endpoint)
        let other = try await listener.nextConnection(within: .seconds(10), "the second client")
        let killedAt = doomed.kill()
        let (delay, _) = try await survivorInvalidated(doomedConnection, killedAt: killedAt, context, "the killed client's connection")
        try await other.connection.send(Array("still here".utf8), msgid: 5, timeout: .seconds(5))
        let echo = try await other.messages(1, within: .seconds(10), "the other client's echo")
        try check(echo[0].msgid == 5, "the other client echoed message \(echo[0].msgid)")
        let cleared = await poll(within: context.deadline) { listener.listener.activeConnections().count == 1 }
        try check(cleared, "the listener counts \(listener.listener.activeConnections().count) active connections for 1 live client")
        return .passed("the killed client's connection was invalidated \(delay.formattedMilliseconds) after the kill; the other client was still served")
    }

    static let latency = ConformanceCase("6.7", "Time from SIGKILL of an idle peer to the survivor's invalidation (recorded, not judged)", requires: .peerDeathDetection) { context in
        var delays: [Double] = []
        for index in 0..<5 {
            let (peer, connection) = try await context.connectToServerPeer("latency\(index)")
            let killedAt = peer.kill()
            guard let at = await connection.invalidation(within: .seconds(30)) else {
                return .informational("no invalidation within 30 s of kill \(index + 1)")
            }
            delays.append((at - killedAt).milliseconds)
        }
        delays.sort()
        context.record("minimumMilliseconds", delays[0])
        context.record("medianMilliseconds", delays[delays.count / 2])
        context.record("maximumMilliseconds", delays[delays.count - 1])
        let formatted = delays.map { Duration.milliseconds($0).formattedMilliseconds }
        return .informational("over \(delays.count) kills: min \(formatted[0]), median \(formatted[delays.count / 2]), max \(formatted[delays.count - 1])")
    }

    // MARK: Helpers

    /// Waits for the survivor's invalidation, checks it came within the deadline for a reason
    /// other than a local one, records the delay, and returns it with the reason.
    private static func survivorInvalidated(_ connection: ConnectionProbe, killedAt: ContinuousClock.Instant, _ context: CaseContext, _ what: String) async throws -> (Duration, InvalidationReason) {
        let delay = try await connection.invalidationDelay(since: killedAt, within: context.deadline, what)
        let reason = connection.firstInvalidation!.reason
        try check(reason.kind != .invalidatedLocally, "\(what) was invalidated locally, not for the peer's death")
        context.record("killToInvalidationMilliseconds", delay.milliseconds)
        return (delay, reason)
    }

    private static func grandchildOutlivesPeer(_ kind: ConformancePeer.Grandchild, _ context: CaseContext) async throws -> CaseOutcome {
        let listener = try context.listen(try context.endpoint("grandchild"))
        let peer = try await context.launchPeer(.client, at: listener.endpoint, grandchild: kind)
        guard let grandchild = peer.grandchildPID else {
            throw ConformanceFailure("the peer did not announce a grandchild")
        }
        let connection = try await listener.nextConnection(within: .seconds(10), "the peer")
        let killedAt = peer.kill()
        let (delay, reason) = try await survivorInvalidated(connection, killedAt: killedAt, context, "the server's side of the killed peer")
        try check(isAlive(grandchild), "the grandchild \(grandchild) had already exited, so the case proved nothing")
        return .passed("invalidated (\(reason)) \(delay.formattedMilliseconds) after the kill, while the \(kind == .fork ? "forked" : "spawned") grandchild \(grandchild) was still alive")
    }

    /// Checks that a new client process is accepted and served.
    private static func checkServesNewClient(_ listener: ListenerProbe, _ context: CaseContext) async throws {
        _ = try await context.launchPeer(.client, at: listener.endpoint)
        let connection = try await listener.nextConnection(within: .seconds(10), "a new client")
        try await connection.connection.send(Array("hello".utf8), msgid: 7, timeout: .seconds(5))
        let echo = try await connection.messages(1, within: .seconds(10), "the new client's echo")
        try check(echo[0].msgid == 7, "the new client echoed message \(echo[0].msgid)")
    }
}
