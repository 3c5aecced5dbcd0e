import IPCCore

/// Area 4: each reply reaches its own request; failures and the two timeouts are distinct
/// errors; a reply too late, or from a dead peer, never reaches anyone.
enum RequestReplyCases {
    static let all: [ConformanceCase] = [correlation, handlerFailure, receiveTimeout, sendTimeout, lateReply, peerDiedBeforeReply]

    static let correlation = ConformanceCase("4.1", "Concurrent requests each get their own reply", requires: .requestReply) { context in
        let (_, connection) = try await context.connectToServerPeer("correlation")
        let count = 32
        let mismatches = try await withThrowingTaskGroup(of: Int?.self) { group in
            for index in 0..<count {
                group.addTask {
                    let payload = TestPayload.make(size: 1 + index * 131, seed: UInt8(index))
                    let reply = try await connection.connection.request(payload, msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
                    return TestPayload.equal(reply, payload) ? nil : index
                }
            }
            return try await group.reduce(into: [Int]()) { if let index = $1 { $0.append(index) } }
        }
        try check(mismatches.isEmpty, "\(mismatches.count) of \(count) requests got another request's reply, first request \(mismatches.sorted()[0])")
        return .passed("\(count) concurrent requests of different sizes each got their own reply")
    }

    static let handlerFailure = ConformanceCase("4.2", "A request the peer's handler fails ends with transportFailure, and the connection stays valid", requires: .requestReply) { context in
        let (_, connection) = try await context.connectToServerPeer("failure")
        try await checkError([.transportFailure], "a request the peer fails") {
            try await connection.connection.request([1], msgid: ConformancePeer.Request.fail, sendTimeout: .seconds(5), receiveTimeout: .seconds(30))
        }
        try check(connection.connection.invalidationReason == nil, "the failed request invalidated the connection")
        try await context.checkEcho(connection, "the next request")
        return .passed("the failed request ended with transportFailure; the next request was answered")
    }

    static let receiveTimeout = ConformanceCase("4.3", "A request with no reply ends with receiveTimeout (not sendTimeout) after its receive timeout, and the connection stays valid", requires: .requestReply) { context in
        let (_, connection) = try await context.connectToServerPeer("rtimeout")
        let timeout = Duration.milliseconds(300)
        let start = ContinuousClock.now
        try await checkError([.receiveTimeout], "a request the peer never answers") {
            try await connection.connection.request([1], msgid: ConformancePeer.Request.stall, sendTimeout: .seconds(5), receiveTimeout: timeout)
        }
        let elapsed = ContinuousClock.now - start
        try check(elapsed >= timeout, "the request timed out after \(elapsed.formattedMilliseconds), before its timeout of \(timeout.formattedMilliseconds)")
        try check(elapsed < timeout + context.deadline, "the request timed out only after \(elapsed.formattedMilliseconds)")
        try check(connection.connection.invalidationReason == nil, "the timeout invalidated the connection: \(connection.connection.invalidationReason!)")
        context.record("receiveTimeoutMilliseconds", elapsed.milliseconds)
        return .passed("receiveTimeout after \(elapsed.formattedMilliseconds) for a timeout of \(timeout.formattedMilliseconds); the connection stayed valid")
    }

    static let sendTimeout = ConformanceCase("4.4", "A send that cannot be queued in time ends with sendTimeout (not receiveTimeout)", requires: .requestReply) { context in
        let (peer, connection) = try await context.connectToServerPeer("stimeout")
        // A peer that reads nothing: its process stopped, its connection open.
        peer.process.suspend()
        defer { peer.process.resume() }
        let chunk = TestPayload.make(size: 64 * 1024)
        let cap = 256 << 20
        let outcome: (sent: Int, error: (any Error)?) = try await runBlocking {
            var sent = 0
            do {
                while sent < cap {
                    try connection.connection.send(chunk, msgid: 9, timeout: .milliseconds(200))
                    sent += chunk.count
                }
            } catch {
                return (sent, error)
            }
            return (sent, nil)
        }
        guard let error = outcome.error else {
            return .nonStrict("\(cap.formattedBytes) were queued to a peer that reads nothing without a send timeout; recommended: bounded buffering")
        }
        try check((error as? IPCError)?.code == .sendTimeout, "the send failed with \(error), not sendTimeout")
        return .passed("sendTimeout after \(outcome.sent.formattedBytes) queued to a peer that reads nothing")
    }

    static let lateReply = ConformanceCase("4.5", "A reply that arrives after its request timed out is discarded: it completes nothing and is not delivered as a message", requires: .requestReply) { context in
        let (_, connection) = try await context.connectToServerPeer("late")
        let delay: UInt32 = 400
        let delayed = withUnsafeBytes(of: delay.bigEndian, Array.init) + Array("late".utf8)
        try await checkError([.receiveTimeout], "a request answered after its timeout") {
            try await connection.connection.request(delayed, msgid: ConformancePeer.Request.delayedEcho, sendTimeout: .seconds(5), receiveTimeout: .milliseconds(100))
        }
        // Let the late reply arrive, then check that it reaches nobody.
        try await Task.sleep(for: .milliseconds(Int(delay) + 300))
        try await context.checkEcho(connection, "the request after the late reply", payload: Array("on time".utf8))
        try check(connection.messageCount == 0, "the late reply was delivered as a message")
        try check(connection.connection.invalidationReason == nil, "the late reply invalidated the connection")
        return .passed("the reply \(delay) ms late was discarded; the next request got its own reply")
    }

    static let peerDiedBeforeReply = ConformanceCase("4.6", "A request to a peer that died fails with peerInvalidated or invalidated within the deadline, never waiting out its receive timeout", requires: .requestReply) { context in
        let (peer, connection) = try await context.connectToServerPeer("diedfirst")
        let killedAt = peer.kill()
        let request = Task {
            try await connection.connection.request([1], msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(5), receiveTimeout: .seconds(60))
        }
        guard let outcome = await result(of: request, within: context.deadline) else {
            throw ConformanceFailure("a request sent just after the peer was killed had not failed \(context.deadline) later")
        }
        let elapsed = ContinuousClock.now - killedAt
        let error = try await checkError([.peerInvalidated, .invalidated], "a request sent just after the peer was killed") { try outcome.get() }
        context.record("killToFailureMilliseconds", elapsed.milliseconds)
        return .passed("failed with \(error.code) \(elapsed.formattedMilliseconds) after the kill")
    }
}
