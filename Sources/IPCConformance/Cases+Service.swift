import IPCCore
import Synchronization
import Foundation

/// Area 7: the service semantics users of XPC and launchd rely on, over the subject's
/// transport: a ``ServiceConnection`` is interrupted, not invalidated, when its service dies,
/// and reaches the service again once it is back.
enum ServiceCases {
    static let all: [ConformanceCase] = [interruption, localInvalidationIsFinal, startedOnDemand, restartedAfterIdleExit, goneForGood, fullServiceWaitedFor, stoppedServiceNotStartedAgain]

    static let interruption = ConformanceCase(
        "7.1",
        "A service connection whose service process dies is interrupted, not invalidated: the interruption handler runs once per death, a pending request fails with interrupted, and the next request reaches the restarted service",
        requires: .requestReply, .peerDeathDetection
    ) { context in
        let endpoint = try context.endpoint("service")
        let transport = context.transport
        let options = context.connectionOptions
        let service = ServiceConnection { try transport.connect(endpoint, options) }
        defer { service.invalidate() }
        let interruptions = Mutex<[InvalidationReason]>([])
        let invalidations = Mutex(0)
        service.setInterruptionHandler { reason in interruptions.withLock { $0.append(reason) } }
        service.setInvalidationHandler { _ in invalidations.withLock { $0 += 1 } }
        var restarts: [String] = []
        var peer = try await context.launchPeer(.server, at: endpoint)
        for death in 1...2 {
            let echoed = try await service.request(Array("before \(death)".utf8), msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
            try check(echoed == Array("before \(death)".utf8), "death \(death): the echo before it came back different")
            let pending = Task {
                try await service.request([1], msgid: ConformancePeer.Request.stall, sendTimeout: .seconds(10), receiveTimeout: .seconds(120))
            }
            try await Task.sleep(for: .milliseconds(100))
            _ = peer.kill()
            let outcome = await result(of: pending, within: context.deadline)
            guard case .some(.failure(let error)) = outcome else {
                throw ConformanceFailure("death \(death): the pending request did not fail within \(context.deadline) (\(outcome.map { "\($0)" } ?? "still waiting"))")
            }
            try check((error as? IPCError)?.code == .interrupted, "death \(death): the pending request failed with \(error), not interrupted")
            try check(await poll(within: context.deadline) { interruptions.withLock { $0.count } == death }, "death \(death): the interruption handler ran \(interruptions.withLock { $0.count }) times in all")
            await peer.shutDown()
            try check(service.invalidationReason == nil && invalidations.withLock { $0 } == 0, "death \(death): the service connection was invalidated")
            // The service comes back on the same endpoint; the same service connection reaches it.
            peer = try await context.launchPeer(.server, at: endpoint)
            let after = try await service.request(Array("after \(death)".utf8), msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
            try check(after == Array("after \(death)".utf8), "death \(death): the echo after the restart came back different")
            try check(interruptions.withLock { $0.count } == death, "death \(death): \(interruptions.withLock { $0.count }) interruptions after reconnecting")
            restarts.append(interruptions.withLock { "\($0[death - 1].kind)" })
        }
        return .passed("two service deaths: each interrupted once (\(restarts.joined(separator: ", "))), the pending request failed with interrupted, and the next request reached the restarted service")
    }

    static let localInvalidationIsFinal = ConformanceCase(
        "7.2",
        "A service connection invalidated locally is final: its invalidation handler runs once, requests fail with invalidated at once, and it never reconnects",
        requires: .requestReply
    ) { context in
        let endpoint = try context.endpoint("ended")
        let transport = context.transport
        let options = context.connectionOptions
        let connects = Mutex(0)
        let service = ServiceConnection {
            connects.withLock { $0 += 1 }
            return try transport.connect(endpoint, options)
        }
        let invalidations = Mutex(0)
        let interruptions = Mutex(0)
        service.setInterruptionHandler { _ in interruptions.withLock { $0 += 1 } }
        service.setInvalidationHandler { _ in invalidations.withLock { $0 += 1 } }
        _ = try await context.launchPeer(.server, at: endpoint)
        let echoed = try await service.request(Array("hello".utf8), msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
        try check(echoed == Array("hello".utf8), "the echo came back different")
        let pending = Task {
            try await service.request([1], msgid: ConformancePeer.Request.stall, sendTimeout: .seconds(10), receiveTimeout: .seconds(120))
        }
        try await Task.sleep(for: .milliseconds(100))
        service.invalidate()
        service.invalidate()
        let outcome = await result(of: pending, within: context.deadline)
        guard case .some(.failure(let error)) = outcome else {
            throw ConformanceFailure("the pending request did not fail within \(context.deadline) of invalidate()")
        }
        try check((error as? IPCError)?.code == .invalidated, "the pending request failed with \(error), not invalidated")
        try await checkError([.invalidated], "a request after invalidate()") {
            try await service.request([2], msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
        }
        try await checkError([.invalidated], "a send after invalidate()") { try await service.send([3], msgid: 1, timeout: .seconds(10)) }
        try check(invalidations.withLock { $0 } == 1 && interruptions.withLock { $0 } == 0, "handlers ran: invalidation \(invalidations.withLock { $0 }), interruption \(interruptions.withLock { $0 })")
        try check(connects.withLock { $0 } == 1, "it connected \(connects.withLock { $0 }) times")
        return .passed("the invalidation handler ran once, the pending request and later ones failed with invalidated, and it never connected again")
    }

    static let startedOnDemand = ConformanceCase(
        "7.3",
        "A service connection to a service that is not running starts it on demand: the first request waits for it instead of failing with endpointNotFound, and the service is started once (again at most once a second while it has not come up), never while it runs",
        requires: .requestReply
    ) { context in
        let endpoint = try context.endpoint("ondemand")
        let (service, starts) = onDemandService(endpoint, context)
        defer { service.invalidate() }
        let began = ContinuousClock.now
        let echoed = try await service.request(Array("first".utf8), msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(20), receiveTimeout: .seconds(30))
        try check(echoed == Array("first".utf8), "the first echo came back different")
        try check(service.startCount == starts.count, "the service connection counted \(service.startCount) starts, the service was started \(starts.count) times")
        try checkStarts(starts.count, whileWaiting: ContinuousClock.now - began, "the first request")
        let started = starts.count
        for index in 0..<10 {
            let payload = Array("again \(index)".utf8)
            let reply = try await service.request(payload, msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
            try check(reply == payload, "request \(index) after the start came back different")
        }
        try check(starts.count == started, "a running service was started again")
        return .passed("the first request started the service (\(started == 1 ? "once" : "\(started) times, one a second while it came up")) and waited for it; 10 more reached the same process")
    }

    static let restartedAfterIdleExit = ConformanceCase(
        "7.4",
        "A service started on demand that exits when idle is started again by the next request, through the same service connection; every request is answered with its own reply",
        requires: .requestReply
    ) { context in
        let endpoint = try context.endpoint("idle")
        let (service, starts) = onDemandService(endpoint, context)
        defer { service.invalidate() }
        var startsPerRound: [Int] = []
        for round in 1...3 {
            let before = starts.count
            let began = ContinuousClock.now
            for index in 0..<5 {
                let payload = Array("round \(round) request \(index)".utf8)
                let reply = try await service.request(payload, msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(20), receiveTimeout: .seconds(30))
                try check(reply == payload, "round \(round), request \(index): another reply came back")
                if index == 0 {
                    try checkStarts(starts.count - before, whileWaiting: ContinuousClock.now - began, "round \(round)'s first request")
                    startsPerRound.append(starts.count - before)
                }
            }
            try check(starts.count - before == startsPerRound[round - 1], "round \(round): the running service was started again")
            // The service goes idle and exits, as a launchd service with an idle exit does. Every
            // peer this round started is stopped: the one serving is the first to have listened
            // (the others found the endpoint in use and exited), not necessarily the last.
            for peer in starts.peers(from: before) { await peer.shutDown() }
            try check(await poll(within: context.deadline) { service.interruptionCount == round }, "round \(round): the service's exit was not seen as an interruption")
        }
        try check(service.invalidationReason == nil, "the service connection was invalidated")
        return .passed("3 rounds of 5 requests, each round's first request starting the service again after it exited (starts a round: \(startsPerRound.map(String.init).joined(separator: ", ")))")
    }

    /// The on-demand start's promise (``ServiceConnection/init(connecting:startInterval:policy:startingOnDemand:)``):
    /// a request that finds the service gone starts it, and starts it again at most once per
    /// start interval (1 s) while it does not listen. More than one start means the service took
    /// longer than the interval to come up (a loaded machine); more than that allows is a
    /// connection that starts its service over and over.
    private static func checkStarts(_ count: Int, whileWaiting waited: Duration, _ what: String) throws {
        try check(count >= 1, "\(what) did not start the service")
        let allowed = 1 + Int(waited / .seconds(1))
        try check(count <= allowed, "\(what) started the service \(count) times in \(waited.formatted(.units(allowed: [.milliseconds]))); at most \(allowed) starts, one a second, were due")
    }

    static let goneForGood = ConformanceCase(
        "7.5",
        "A service connection whose service dies for good fails each request at once (interrupted) while it waits, and is invalidated once its policy's limit passes (serviceUnavailable, the handler once, no connect afterwards); so is one whose on-demand start fails",
        requires: .requestReply
    ) { context in
        let endpoint = try context.endpoint("gone")
        let transport = context.transport
        let options = context.connectionOptions
        let limit = Duration.seconds(2)
        let service = ServiceConnection(connecting: { try transport.connect(endpoint, options) }, policy: ServiceConnection.Policy(outageLimit: limit))
        defer { service.invalidate() }
        let invalidations = Mutex<[InvalidationReason]>([])
        service.setInvalidationHandler { reason in invalidations.withLock { $0.append(reason) } }
        let peer = try await context.launchPeer(.server, at: endpoint)
        let echoed = try await service.request(Array("hello".utf8), msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
        try check(echoed == Array("hello".utf8), "the echo came back different")
        _ = peer.kill()
        await peer.shutDown()
        // Each request may take 10 s to send; while the service is gone, none should. The first
        // may still go out on the old connection, before its end is noticed: it may take until
        // then (the peer-death deadline), the later ones must fail at once.
        let started = ContinuousClock.now
        var durations: [Duration] = []
        var codes: [String] = []
        var firstError: IPCError?
        while ContinuousClock.now - started < .seconds(60), codes.last != "invalidated" {
            let began = ContinuousClock.now
            do {
                _ = try await service.request([1], msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(10))
                throw ConformanceFailure("a request to the dead service was answered")
            } catch let error as IPCError {
                codes.append("\(error.code)")
                if firstError == nil { firstError = error }
            }
            durations.append(ContinuousClock.now - began)
            try await Task.sleep(for: .milliseconds(20))
        }
        let first = durations.first ?? .zero
        let slowest = durations.dropFirst().max() ?? .zero
        let gaveUpAfter = ContinuousClock.now - started
        try check(codes.last == "invalidated", "no invalidation within 60 s of the service's death (the policy allows \(limit)); errors: \(Set(codes))")
        try check(codes.dropLast().allSatisfy { $0 == "interrupted" || $0 == "peerInvalidated" }, "while the service was gone, requests failed with \(Set(codes.dropLast())), not interrupted")
        try check(first < max(context.deadline, .seconds(5)), "the first request after the death took \(first.formattedMilliseconds) to fail, with \(firstError.map { "\($0)" } ?? "nothing") (its send timeout is 10 s; a death must be seen within \(context.deadline))")
        try check(slowest < .seconds(2), "a request took \(slowest) to fail while the service was gone (its send timeout is 10 s; the first took \(first))")
        try check(service.invalidationReason?.kind == .serviceUnavailable, "invalidated for \(service.invalidationReason.map { "\($0)" } ?? "nothing"), not serviceUnavailable")
        try check(await poll(within: context.deadline) { invalidations.withLock { $0.count } == 1 }, "the invalidation handler ran \(invalidations.withLock { $0.count }) times")
        let attempts = service.connectAttempts
        try await checkError([.invalidated], "a request after the service was given up") {
            try await service.request([2], msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(10))
        }
        try check(service.connectAttempts == attempts, "it connected again after it was invalidated")

        // An on-demand start that fails gives the service up at once.
        let nobody = try context.endpoint("unstartable")
        let unstartable = ServiceConnection(connecting: { try transport.connect(nobody, options) }, startingOnDemand: {
            throw ConformanceFailure("this service cannot be started")
        })
        defer { unstartable.invalidate() }
        try await checkError([.invalidated], "a request whose service failed to start") {
            try await unstartable.request([3], msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(10))
        }
        try check(unstartable.invalidationReason?.kind == .serviceUnavailable, "a failed start invalidated for \(unstartable.invalidationReason.map { "\($0)" } ?? "nothing"), not serviceUnavailable")
        return .passed("\(codes.count - 1) requests failed with interrupted (the first in \(first.formatted(.units(allowed: [.milliseconds]))), the slowest of the others in \(slowest.formatted(.units(allowed: [.milliseconds])))), then the connection was invalidated with serviceUnavailable \(gaveUpAfter.formatted(.units(allowed: [.milliseconds]))) after the death; a failed on-demand start invalidated too")
    }

    static let fullServiceWaitedFor = ConformanceCase(
        "7.6",
        "A service connection that starts its service on demand does not start it when it runs but is full (its listener turns clients away as busy, IPCError.isListenerBusy): a request waits for room within its timeout, and the running service answers it once a connection has gone",
        requires: .requestReply, .connectionLimit
    ) { context in
        let endpoint = try context.endpoint("busy")
        _ = try await context.launchPeer(.server, at: endpoint) { $0.maximumConnections = 1 }
        // This process holds the service's one connection; the echo shows the service kept it.
        let holder = try await context.connect(endpoint)
        try await context.checkEcho(holder, "the connection that holds the service's one place")
        let (service, starts) = onDemandService(endpoint, context)
        defer { service.invalidate() }
        let payload = Array("waited for room".utf8)
        let ended = Mutex<ContinuousClock.Instant?>(nil)
        let request = Task {
            defer { ended.withLock { $0 = .now } }
            return try await service.request(payload, msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(60), receiveTimeout: .seconds(30))
        }
        defer { request.cancel() }
        // Three start intervals (1 s each): a connection that took the busy answer for nobody
        // listening would have started the service by now, and the request would have failed.
        try await Task.sleep(for: .seconds(3))
        try check(starts.count == 0, "the service connection started the service \(starts.count) times while it ran but was full")
        if ended.withLock({ $0 }) != nil {
            let outcome = await request.result
            throw ConformanceFailure("the request ended while the service was full, instead of waiting for room: \(outcome)")
        }
        let attempts = service.connectAttempts
        try check(attempts >= 1, "the service connection did not try to connect in 3 s")
        let released = ContinuousClock.now
        holder.connection.invalidate()
        let reply = try await request.value
        let waited = released.duration(to: ended.withLock { $0 } ?? .now)
        try check(reply == payload, "the request that waited for room came back as \(reply.count) different bytes")
        try check(starts.count == 0, "the service connection started the service once there was room")
        try check(service.invalidationReason == nil, "the service connection was invalidated: \(service.invalidationReason.map { "\($0)" } ?? "")")
        return .passed("the request waited through \(attempts) busy attempt(s) in 3 s without starting the service, and was answered \(waited.formattedMilliseconds) after a place came free")
    }

    static let stoppedServiceNotStartedAgain = ConformanceCase(
        "7.7",
        "A service connection that starts its service on demand does not start it while the service runs but does not answer (its process stopped): a request fails at its timeout without a start, and the service answers once it runs again; a connect that the listener does not answer in time is its busy answer (IPCError.isListenerBusy), not nobody listening",
        requires: .requestReply
    ) { context in
        let endpoint = try context.endpoint("stopped")
        let peer = try await context.launchPeer(.server, at: endpoint)
        let (service, starts) = onDemandService(endpoint, context)
        defer { service.invalidate() }
        // Stopped before the service connection's first connect, which the kernel may still
        // complete (a socket's backlog), but which nobody answers.
        peer.process.suspend()
        var stopped = true
        defer { if stopped { peer.process.resume() } }
        try check(await poll(within: context.deadline) { isStopped(peer.pid) }, "the service's process was not seen stopped")
        let payload = Array("while stopped".utf8)
        let timeout = Duration.seconds(3)
        let began = ContinuousClock.now
        let failure: IPCError
        do {
            _ = try await service.request(payload, msgid: ConformancePeer.Request.echo, sendTimeout: timeout, receiveTimeout: timeout)
            throw ConformanceFailure("a request to a service whose process is stopped was answered")
        } catch let error as IPCError {
            failure = error
        }
        let took = ContinuousClock.now - began
        // Where the kernel completes a connect (a stream socket), the request is what times out;
        // elsewhere the connect must say the service runs.
        try check(failure.isListenerBusy || failure.code == .receiveTimeout, "the request to the stopped service failed with \(failure): a connect that a listener holding its endpoint does not answer in time is a busy answer (IPCError.listenerBusy(_:answered: false)), and a request on a connection the kernel made times out with receiveTimeout")
        try check(starts.count == 0, "the service connection started the service \(starts.count) times while it ran, stopped (the request failed with \(failure)); a listener that does not answer a connect in time runs, and answers busy (IPCError.listenerBusy)")
        try check(service.invalidationReason == nil, "the service connection was invalidated while its service was stopped: \(service.invalidationReason.map { "\($0)" } ?? "")")
        // A connect waits for the transport's connect timeout (5 s for the built-in ones), which
        // may be longer than the request's own; the request must not hang.
        try check(took < timeout + .seconds(20), "the request to the stopped service took \(took.formattedMilliseconds) to fail (its timeouts are \(timeout.formattedMilliseconds))")
        peer.process.resume()
        stopped = false
        let reply = try await service.request(payload, msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(30), receiveTimeout: .seconds(30))
        try check(reply == payload, "the resumed service's echo came back as \(reply.count) different bytes")
        try check(starts.count == 0, "the service connection started the service once it ran again")
        return .passed("a request to the stopped service failed after \(took.formattedMilliseconds) with \(failure.code)\(failure.isListenerBusy ? " (busy)" : "") without starting it; resumed, the service answered")
    }

    /// A service connection to `endpoint` that starts a server peer there on demand, and the peers it started.
    private static func onDemandService(_ endpoint: Endpoint, _ context: CaseContext) -> (ServiceConnection, StartedPeers) {
        let transport = context.transport
        let options = context.connectionOptions
        let starts = StartedPeers()
        let service = ServiceConnection(connecting: { try transport.connect(endpoint, options) }, startingOnDemand: {
            starts.append(try context.startPeer(.server, at: endpoint))
        })
        return (service, starts)
    }

    /// The server peers an on-demand service connection started.
    private final class StartedPeers: Sendable {
        private let peers = Mutex<[PeerHandle]>([])

        func append(_ peer: PeerHandle) { peers.withLock { $0.append(peer) } }
        var count: Int { peers.withLock { $0.count } }
        /// The peers started from the `index`th on.
        func peers(from index: Int) -> [PeerHandle] { peers.withLock { Array($0[min(index, $0.count)...]) } }
    }
}

