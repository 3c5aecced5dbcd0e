import Foundation
import IPCCore
import Synchronization

/// Area 5: endpoints have one live listener and outlive no dead one; a connection is
/// invalidated exactly once, and reports nothing after that.
enum LifecycleCases {
    static let all: [ConformanceCase] = [secondListener, staleEndpoint, nobodyListening, exactlyOnceAndLast, sendsAfterInvalidation, listenerClose, lateHandler, connectWithRetry, acceptFilter, refusalIsAccessDenied, slowAcceptFilter, connectionLimit]

    static let secondListener = ConformanceCase("5.1", "A second listener on a live endpoint is refused with endpointInUse, from another process or this one") { context in
        let endpoint = try context.endpoint("taken")
        _ = try await context.launchPeer(.server, at: endpoint)
        try await checkError([.endpointInUse], "listening where a peer process listens") { try context.listen(endpoint) }
        let own = try context.endpoint("own")
        _ = try context.listen(own)
        try await checkError([.endpointInUse], "listening twice in this process") { try context.listen(own) }
        return .passed("both second listeners were refused with endpointInUse")
    }

    static let staleEndpoint = ConformanceCase("5.2", "An endpoint left by a listener killed with SIGKILL is reclaimed by the next listener, and served") { context in
        let endpoint = try await staleEndpoint(context)
        let listener = try context.listen(endpoint)
        _ = try await context.launchPeer(.client, at: endpoint)
        _ = try await listener.nextConnection(within: .seconds(10), "a client of the new listener")
        return .passed("a new listener took over the dead listener's endpoint and accepted a client")
    }

    static let nobodyListening = ConformanceCase("5.3", "Connecting where nobody listens fails at once with endpointNotFound, also at an endpoint whose listener was killed") { context in
        for (name, endpoint) in [("a fresh endpoint", try context.endpoint("nobody")), ("a stale endpoint", try await staleEndpoint(context))] {
            let start = ContinuousClock.now
            try await checkError([.endpointNotFound], "connecting to \(name)") { try await context.connect(endpoint) }
            let elapsed = ContinuousClock.now - start
            try check(elapsed < context.deadline, "connecting to \(name) took \(elapsed.formattedMilliseconds) to fail")
        }
        return .passed("both connects failed with endpointNotFound within \(context.deadline)")
    }

    static let connectWithRetry = ConformanceCase(
        "5.8",
        "A client that connects with retry (ConnectRetry) before its server listens is connected once the server listens, and gives up with endpointNotFound at its deadline when nobody does"
    ) { context in
        let endpoint = try context.endpoint("later")
        let transport = context.transport
        let options = context.connectionOptions
        let attempts = Mutex(0)
        let connecting = Task {
            try await ConnectRetry(for: .seconds(60)).run {
                attempts.withLock { $0 += 1 }
                return try await transport.connectSuspending(endpoint, options)
            }
        }
        defer { connecting.cancel() }
        // The server starts once the client has been trying for a while.
        try await Task.sleep(for: .milliseconds(300))
        let triedBefore = attempts.withLock { $0 }
        try check(triedBefore >= 2, "the client tried \(triedBefore) times in the 300 ms before the server started")
        // The context keeps the peer until the case's tear-down.
        _ = try await context.launchPeer(.server, at: endpoint)
        let started = ContinuousClock.now
        let outcome = await result(of: connecting, within: context.deadline)
        guard case .some(.success(let connection)) = outcome else {
            throw ConformanceFailure("the retrying client was not connected within \(context.deadline) of the server listening: \(outcome.map { "\($0)" } ?? "still waiting")")
        }
        let probe = context.adopt(connection)
        try await context.checkEcho(probe, "the retrying client")
        let late = ContinuousClock.now - started
        // Nobody: endpointNotFound once the limit has passed, not before and not much after.
        let limit = Duration.milliseconds(500)
        let nobody = try context.endpoint("never")
        let start = ContinuousClock.now
        try await checkError([.endpointNotFound], "connecting with retry where nobody listens") {
            try await ConnectRetry(for: limit).run { try await transport.connectSuspending(nobody, options) }
        }
        let elapsed = ContinuousClock.now - start
        try check(elapsed >= limit && elapsed < limit + context.deadline, "giving up took \(elapsed.formattedMilliseconds), for a limit of \(limit.formattedMilliseconds)")
        return .passed("connected after \(triedBefore)+ attempts, \(late.formattedMilliseconds) after the server was ready; gave up with endpointNotFound after \(elapsed.formattedMilliseconds) where nobody listened")
    }

    static let acceptFilter = ConformanceCase(
        "5.9",
        "An accept filter decides on the kernel's credentials of the connecting process: it sees that process's pid, uid and gid; a refused client process does not connect and delivers nothing; an accepted one is the connection's peer",
        requires: .acceptFilter
    ) { context in
        let endpoint = try context.endpoint("filtered")
        let seen = Mutex<[PeerCredentials]>([])
        // The first client is refused, the later ones accepted.
        let listener = try context.listen(endpoint, acceptFilter: { credentials in
            seen.withLock { seen in
                seen.append(credentials)
                return seen.count > 1
            }
        })
        // A refused client may fail to connect (a rendezvous transport answers it) or see its
        // connection closed at once (a stream socket's connect completes before the accept);
        // either way the listener accepts nothing from it and nothing it sends is delivered.
        let refused = try context.startPeer(.client, at: endpoint, burst: (count: 8, size: 16))
        try check(await poll(within: context.deadline) { seen.withLock { !$0.isEmpty } }, "the accept filter was not asked about the first client within \(context.deadline)")
        try await Task.sleep(for: .milliseconds(300))
        let early = listener.takeAccepted().count
        try check(early == 0, "the refused client's connection was accepted")
        try check(seen.withLock { $0.count } == 1, "the filter was asked \(seen.withLock { $0.count }) times for one client")
        let accepted = try await context.launchPeer(.client, at: endpoint)
        let connection = try await listener.nextConnection(within: context.deadline, "the accepted client")
        let others = listener.takeAccepted().count
        try check(others == 0, "\(others + 1) connections were accepted, for one accepted client")
        let asked = seen.withLock { $0 }
        try check(asked.count == 2, "the filter was asked \(asked.count) times for two clients")
        try check(asked.map(\.pid) == [refused.pid, accepted.pid], "the filter saw pids \(asked.map(\.pid)), not the client processes \([refused.pid, accepted.pid])")
        let (uid, gid) = (currentUserID(), currentGroupID())
        try check(asked.allSatisfy { $0.uid == uid && $0.gid == gid }, "the filter saw uid/gid \(asked.map { "\($0.uid)/\($0.gid)" }), not \(uid)/\(gid)")
        try check(connection.connection.peer?.pid == accepted.pid, "the accepted connection's peer is \(connection.connection.peer.map { "pid \($0.pid)" } ?? "unknown"), not the client process \(accepted.pid)")
        return .passed("the filter saw both client processes' kernel credentials; nothing of the refused one was accepted, the accepted one is the connection's peer")
    }

    static let refusalIsAccessDenied = ConformanceCase(
        "5.10",
        "A client the accept filter refuses is told so, never left to guess a crash: its connect fails with accessDenied, or, where the connect completes before the listener decides (a stream socket), its first request does, and so do its later calls",
        requires: .acceptFilter, .requestReply
    ) { context in
        let endpoint = try context.endpoint("refusing")
        let listener = try context.listen(endpoint, acceptFilter: { _ in false })
        var outcomes: [String] = []
        // At once, and after the listener has surely refused and closed (the client's write
        // then meets a closed socket, and the refusal must still be what it reports).
        for (round, pause) in [Duration.zero, .milliseconds(300)].enumerated() {
            let connection: ConnectionProbe
            do {
                connection = try await context.connect(endpoint)
            } catch let error as IPCError where error.code == .accessDenied {
                outcomes.append("connect")
                continue
            } catch {
                throw ConformanceFailure("round \(round + 1): the refused connect failed with \(error), not accessDenied")
            }
            if pause > .zero { try await Task.sleep(for: pause) }
            do {
                _ = try await connection.connection.request([1], msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
                throw ConformanceFailure("round \(round + 1): a refused client's request was answered")
            } catch let error as IPCError {
                try check(error.code == .accessDenied, "round \(round + 1): the refused client's first request failed with \(error), not accessDenied")
            }
            try await checkError([.accessDenied], "round \(round + 1): a refused client's second request") {
                try await connection.connection.request([2], msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
            }
            try check(connection.connection.invalidationReason?.error?.code == .accessDenied, "round \(round + 1): the refused connection was invalidated for \(connection.connection.invalidationReason.map { "\($0)" } ?? "nothing"), not accessDenied")
            outcomes.append("first request")
        }
        try check(listener.takeAccepted().isEmpty, "the listener accepted a client its filter refused")
        return .passed("refused twice (at once, and after 300 ms): accessDenied from the \(Set(outcomes).sorted().joined(separator: " and ")), and from later calls")
    }

    static let slowAcceptFilter = ConformanceCase(
        "5.11",
        "An accept filter is the user's code and may take its time: while it decides on a connecting client, the connections already made are served (it runs off the thread that serves them), and that client is admitted once the filter says yes",
        requires: .acceptFilter, .requestReply
    ) { context in
        let endpoint = try context.endpoint("deliberating")
        let asked = Mutex(0)
        let (deciding, startsDeciding) = AsyncStream<Void>.makeStream()
        let decide = DispatchSemaphore(value: 0)
        // The first client passes at once; the filter holds the second until the case lets it
        // go, or for three deadlines (so that a transport that runs it where its connections are
        // served fails the round trip below rather than hanging).
        let patience = context.deadline * 3
        let listener = try context.listen(endpoint, acceptFilter: { _ in
            guard asked.withLock({ $0 += 1; return $0 }) > 1 else { return true }
            startsDeciding.yield()
            // blocking-call-check: allowed (the listener runs its filter off the thread that serves connections, not on the case's task; 5.11 fails a transport that does not)
            _ = decide.wait(timeout: .now() + .nanoseconds(Int(patience.wholeNanoseconds)))
            return true
        })
        defer { decide.signal(); startsDeciding.finish() }
        let first = try await context.launchPeer(.client, at: endpoint)
        let connection = try await listener.nextConnection(within: context.deadline, "the first client")
        try await context.checkEcho(connection, "the first client, before another connects")
        let second = try context.startPeer(.client, at: endpoint)
        let asking = Task<Void, any Error> { for await _ in deciding { return } }
        let reached = await result(of: asking, within: patience)
        try check(reached != nil, "the accept filter was not asked about the second client within \(patience)")
        // The filter is deciding now.
        let started = ContinuousClock.now
        let echo = Task { try await connection.connection.request([5, 11], msgid: ConformancePeer.Request.echo, sendTimeout: context.deadline, receiveTimeout: context.deadline) }
        let outcome = await result(of: echo, within: context.deadline + .seconds(1))
        let waited = ContinuousClock.now - started
        decide.signal()
        guard case .some(.success(let reply)) = outcome, reply == [5, 11] else {
            throw ConformanceFailure("the first client's round trip, made while the filter decided on another client, was not answered within \(context.deadline): \(outcome.map { "\($0)" } ?? "still waiting")")
        }
        let admitted = try await listener.nextConnection(within: context.deadline, "the second client, once the filter said yes")
        try check(admitted.connection.peer?.pid == second.pid, "the connection admitted after the filter's yes is \(admitted.connection.peer.map { "pid \($0.pid)" } ?? "of an unknown peer"), not the second client \(second.pid)")
        try check(first.pid != second.pid, "the two clients are one process")
        return .passed("a round trip took \(waited.formattedMilliseconds) while the filter held another client; that client was admitted once it said yes")
    }

    static let connectionLimit = ConformanceCase(
        "5.12",
        "A listener given maximumConnections 2 keeps two clients and serves them; a third is turned away as busy, with endpointNotFound from its connect or its first request (not accessDenied, not a hang) that says so (IPCError.isListenerBusy); once one of the two has gone, a new client is admitted",
        requires: .connectionLimit, .requestReply
    ) { context in
        let endpoint = try context.endpoint("full")
        var options = context.connectionOptions
        options.maximumConnections = 2
        let listener = try context.listen(endpoint, options: options)
        let first = try await context.launchPeer(.client, at: endpoint)
        let firstConnection = try await listener.nextConnection(within: context.deadline, "the first client")
        let second = try await context.launchPeer(.client, at: endpoint)
        let secondConnection = try await listener.nextConnection(within: context.deadline, "the second client")
        // The third, from this process (the listener answers no requests: one admitted by
        // mistake would time out, not fail with endpointNotFound).
        let turnedAway: String
        do {
            let third = try await context.connect(endpoint)
            do {
                _ = try await third.connection.request([3], msgid: ConformancePeer.Request.echo, sendTimeout: context.deadline, receiveTimeout: context.deadline * 2)
                throw ConformanceFailure("a third client's request was answered by a listener that keeps two connections")
            } catch let error as IPCError {
                try check(error.code == .endpointNotFound, "the third client's first request failed with \(error), not endpointNotFound")
                try check(error.isListenerBusy, Self.unmarkedBusy(error))
            }
            try await checkError([.endpointNotFound], "the third client's second request") {
                try await third.connection.request([4], msgid: ConformancePeer.Request.echo, sendTimeout: context.deadline, receiveTimeout: context.deadline)
            }
            turnedAway = "its first request"
        } catch let error as IPCError {
            try check(error.code == .endpointNotFound, "the third client's connect failed with \(error), not endpointNotFound")
            try check(error.isListenerBusy, Self.unmarkedBusy(error))
            turnedAway = "its connect"
        }
        try check(listener.takeAccepted().isEmpty, "the listener accepted a third connection past maximumConnections 2")
        try await context.checkEcho(firstConnection, "the first client, after a third was turned away")
        try await context.checkEcho(secondConnection, "the second client, after a third was turned away")
        await second.shutDown()
        try check(await secondConnection.invalidation(within: context.deadline) != nil, "the second client's connection did not end within \(context.deadline) of its process's exit")
        let fourth = try await context.launchPeer(.client, at: endpoint)
        let fourthConnection = try await listener.nextConnection(within: context.deadline, "a client after the second had gone")
        try check(fourthConnection.connection.peer.map { $0.pid == fourth.pid } ?? true, "the connection admitted after the second client left is not the new client's")
        try await context.checkEcho(fourthConnection, "the client admitted once there was room")
        try check(first.pid != fourth.pid, "the clients are one process")
        return .passed("a third client was turned away with endpointNotFound from \(turnedAway); the two kept were served, and a new client was admitted once one had gone")
    }

    /// Case 5.12's message for a busy answer without its mark.
    private static func unmarkedBusy(_ error: IPCError) -> String {
        "the third client was turned away with an endpointNotFound that reads as nobody listening (\(error)); a full listener's answer is made with IPCError.listenerBusy(_:answered:), so that a client (a ServiceConnection that starts its service on demand) can tell it"
    }

    static let exactlyOnceAndLast = ConformanceCase("5.4", "Invalidation runs the handler exactly once, last: after the state is invalid, pending requests have failed with peerInvalidated and the message stream has finished") { context in
        let (_, connection) = try await context.connectToServerPeer("once")
        let connectionUnderTest = connection.connection
        let pending = Task {
            try await connectionUnderTest.request([1], msgid: ConformancePeer.Request.stall, sendTimeout: .seconds(5), receiveTimeout: .seconds(120))
        }
        try await Task.sleep(for: .milliseconds(100))
        // What the handler sees: it must find the connection already invalid.
        let seen = Mutex<(runs: Int, stateInvalid: Bool, sendRefused: Bool)>((0, false, false))
        connectionUnderTest.setInvalidationHandler { _ in
            let stateInvalid = connectionUnderTest.invalidationReason != nil
            let sendRefused = (try? connectionUnderTest.send([1], msgid: 1, timeout: .seconds(1))) == nil
            seen.withLock { $0 = ($0.runs + 1, stateInvalid, sendRefused) }
        }
        let start = ContinuousClock.now
        // From several threads at once, then again: one invalidation.
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<4 { group.addTask { connectionUnderTest.invalidate() } }
        }
        connectionUnderTest.invalidate()
        let ran = await poll(within: context.deadline) { seen.withLock { $0.runs > 0 } }
        try check(ran, "the invalidation handler did not run within \(context.deadline) of invalidate()")
        context.record("invalidateToHandlerMilliseconds", (ContinuousClock.now - start).milliseconds)
        guard let outcome = await result(of: pending, within: context.deadline) else {
            throw ConformanceFailure("the pending request had not failed \(context.deadline) after invalidate()")
        }
        guard case .failure(let error as IPCError) = outcome, error.code == .peerInvalidated else {
            throw ConformanceFailure("the pending request ended with \(outcome), not peerInvalidated")
        }
        try check(await poll(within: context.deadline) { connection.streamFinishedAt != nil }, "the message stream did not finish")
        try await Task.sleep(for: .milliseconds(300))
        let (runs, stateInvalid, sendRefused) = seen.withLock { $0 }
        try check(runs == 1, "the invalidation handler ran \(runs) times")
        try check(stateInvalid, "the handler ran while invalidationReason was still nil")
        try check(sendRefused, "a send from inside the handler succeeded")
        let reason = connectionUnderTest.invalidationReason
        try check(reason?.kind == .invalidatedLocally, "the reason is \(reason.map(String.init(describing:)) ?? "nil"), not invalidatedLocally")
        return .passed("five invalidate() calls ran the handler once, after the pending request failed with peerInvalidated")
    }

    static let sendsAfterInvalidation = ConformanceCase("5.5", "Sends and requests after invalidation fail at once with invalidated") { context in
        let (_, connection) = try await context.connectToServerPeer("after")
        connection.connection.invalidate()
        _ = await connection.invalidation(within: context.deadline)
        try await checkError([.invalidated], "a send after invalidate()") {
            try connection.connection.send([1], msgid: 1, timeout: .seconds(1))
        }
        if context.capabilities.supportsRequestReply {
            try await checkError([.invalidated], "a request after invalidate()") {
                try await connection.connection.request([1], msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(1), receiveTimeout: .seconds(30))
            }
        }
        return .passed("send" + (context.capabilities.supportsRequestReply ? " and request" : "") + " failed with invalidated")
    }

    static let listenerClose = ConformanceCase("5.6", "Closing a listener invalidates its connections and frees the endpoint; the clients are told (recommended)") { context in
        let endpoint = try context.endpoint("closing")
        let listener = try context.listen(endpoint)
        let client = try await context.launchPeer(.client, at: endpoint)
        let accepted = try await listener.nextConnection(within: .seconds(10), "the peer client")
        listener.listener.close()
        _ = try await accepted.invalidationDelay(since: .now, within: context.deadline, "the accepted connection after close()")
        try check(accepted.firstInvalidation?.reason.kind == .invalidatedLocally, "the accepted connection was invalidated with \(accepted.firstInvalidation!.reason), not invalidatedLocally")
        try await checkError([.endpointNotFound], "connecting after close()") { try await context.connect(endpoint) }
        _ = try context.listen(endpoint)
        // The peer client exits once its connection is invalidated.
        let clientExited = await poll(within: context.deadline) { !isAlive(client.pid) }
        guard clientExited else {
            return .nonStrict("connections invalidated and the endpoint freed, but the client was not told within \(context.deadline)")
        }
        return .passed("the accepted connection was invalidated, the endpoint refused connects then took a new listener, and the client was told")
    }

    static let lateHandler = ConformanceCase("5.7", "An invalidation handler set after invalidation runs at once, on the calling thread, with the reason") { context in
        let (_, connection) = try await context.connectToServerPeer("late")
        connection.connection.invalidate()
        _ = await connection.invalidation(within: context.deadline)
        let reason = Mutex<InvalidationReason?>(nil)
        connection.connection.setInvalidationHandler { received in reason.withLock { $0 = received } }
        let received = reason.withLock { $0 }
        try check(received != nil, "the handler had not run when setInvalidationHandler returned")
        try check(received?.kind == .invalidatedLocally, "the handler got \(received!), not invalidatedLocally")
        return .passed("the late handler ran before setInvalidationHandler returned")
    }

    // MARK: Helpers

    /// An endpoint whose listener, a peer process, was killed.
    static func staleEndpoint(_ context: CaseContext) async throws -> Endpoint {
        let endpoint = try context.endpoint("stale")
        let peer = try await context.launchPeer(.server, at: endpoint)
        peer.kill()
        await peer.shutDown()
        return endpoint
    }
}

/// Whether a process exists and is not a zombie that nobody has reaped yet.
func isAlive(_ pid: Int32) -> Bool {
    guard kill(pid, 0) == 0 else { return false }
    guard let state = processState(pid) else { return true }
    return state != "Z"
}

/// Whether a process is stopped by a signal (SIGSTOP: state `T`).
func isStopped(_ pid: Int32) -> Bool {
    processState(pid) == "T"
}

/// A process's state letter in `/proc/<pid>/stat`, which follows the parenthesized command
/// name: "123 (cat) S ...".
private func processState(_ pid: Int32) -> Character? {
    let status = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
    guard let close = status.lastIndex(of: ")") else { return nil }
    return status[close...].dropFirst(2).first
}
