import IPCCore
import Synchronization

/// Area 1: what is sent arrives, once, intact, in order. The peer echoes every one-way
/// message, so each message crosses the process boundary twice.
enum DeliveryCases {
    static let all: [ConformanceCase] = [order, exactlyOnce, everySize, aboveMaximum, burst, concurrentSenders, broadcast, borrowingHandler, borrowingHandlerOnClient, sendsOnConnectionExecutor]

    static let order = ConformanceCase("1.1", "One-way messages from one sender arrive in the order they were sent", requires: .preservesOrder) { context in
        let (_, connection) = try await context.connectToServerPeer("order")
        let received = try await sendAndCollectEchoes(1000, on: connection)
        if let (index, message) = received.enumerated().first(where: { $0.element.msgid != UInt32($0.offset) }) {
            throw ConformanceFailure("echo \(index) is message \(message.msgid), not \(index): the order was not kept")
        }
        return .passed("1000 messages of 0-96 bytes came back from the peer in the order sent")
    }

    static let exactlyOnce = ConformanceCase("1.2", "Every one-way message arrives exactly once: none lost, none duplicated, none altered") { context in
        let (_, connection) = try await context.connectToServerPeer("once")
        let count = 1000
        _ = try await sendAndCollectEchoes(count, on: connection)
        // Anything that arrives after the last expected echo is a duplicate.
        try await Task.sleep(for: .milliseconds(300))
        let received = connection.messages
        let byID = Dictionary(grouping: received, by: \.msgid)
        let missing = (0..<UInt32(count)).filter { byID[$0] == nil }
        let duplicated = byID.filter { $0.value.count > 1 }.keys.sorted()
        let altered = received.filter { !TestPayload.equal($0.payload, payload(Int($0.msgid))) }.map(\.msgid)
        try check(missing.isEmpty, "\(missing.count) messages lost, first \(missing.prefix(5))")
        try check(duplicated.isEmpty, "\(duplicated.count) messages delivered more than once, first \(duplicated.prefix(5))")
        try check(received.count == count, "\(received.count) messages arrived for \(count) sent")
        try check(altered.isEmpty, "\(altered.count) payloads altered, first in message \(altered.first ?? 0)")
        return .passed("\(count) messages each came back once, intact")
    }

    static let everySize = ConformanceCase("1.3", "Payloads of every size up to the declared maximum arrive intact") { context in
        let (_, connection) = try await context.connectToServerPeer("sizes")
        let declared = context.capabilities.maximumPayloadLength
        let largest = min(declared, context.options.largestSampledPayload)
        let sizes = TestPayload.sizes(upTo: largest)
        for (index, size) in sizes.enumerated() {
            let sent = TestPayload.make(size: size, seed: UInt8(truncatingIfNeeded: index))
            let echoed = try await roundTrip(sent, msgid: UInt32(index), on: connection, context: context)
            try check(TestPayload.equal(echoed, sent), "a payload of \(size) bytes came back as \(echoed.count) bytes that differ")
        }
        let scope = largest == declared ? "the declared maximum, \(declared.formattedBytes)" : "\(largest.formattedBytes) of the declared \(declared.formattedBytes)"
        return .passed("\(sizes.count) sizes from 0 B to \(scope) came back intact")
    }

    static let aboveMaximum = ConformanceCase("1.4", "A payload above the declared maximum is refused by send with payloadTooLarge, and the connection stays valid") { context in
        let declared = context.capabilities.maximumPayloadLength
        guard declared < 1 << 30 else {
            return .notApplicable("the declared maximum, \(declared.formattedBytes), is too large to allocate one byte more")
        }
        let (_, connection) = try await context.connectToServerPeer("toolarge")
        let oversized = TestPayload.make(size: declared + 1)
        try await checkError([.payloadTooLarge], "sending \(declared + 1) bytes") {
            try connection.connection.send(oversized, msgid: 1, timeout: .seconds(5))
        }
        try check(connection.connection.invalidationReason == nil, "the refused send invalidated the connection (\(connection.connection.invalidationReason!))")
        let small = TestPayload.make(size: 16)
        try check(TestPayload.equal(try await roundTrip(small, msgid: 2, on: connection, context: context), small), "the connection no longer echoes correctly")
        return .passed("\(declared + 1) bytes refused with payloadTooLarge; the connection still works")
    }

    static let burst = ConformanceCase("1.5", "A burst of messages written back to back by the peer arrives complete and in order") { context in
        let listener = try context.listen(try context.endpoint("burst"))
        let count = 2000
        let size = 100
        _ = try await context.launchPeer(.client, at: listener.endpoint, burst: (count, size))
        let connection = try await listener.nextConnection(within: .seconds(10), "the bursting peer")
        let received = try await connection.messages(count, within: .seconds(60), "the burst")
        for (index, message) in received.enumerated() {
            let expected = context.capabilities.preservesOrder ? UInt32(index) : message.msgid
            try check(message.msgid == expected, "message \(index) of the burst is \(message.msgid)")
            try check(message.payload == ConformancePeer.burstPayload(Int(message.msgid), size: size), "message \(message.msgid) of the burst was altered")
        }
        try check(Set(received.map(\.msgid)).count == count, "the burst arrived with duplicates")
        return .passed("\(count) messages of \(size) B sent back to back arrived complete" + (context.capabilities.preservesOrder ? " and in order" : ""))
    }

    static let concurrentSenders = ConformanceCase("1.6", "Messages sent concurrently from several threads on one connection all arrive, each sender's in order") { context in
        let (_, connection) = try await context.connectToServerPeer("concurrent")
        let senders = 4
        let perSender = 250
        try await withThrowingTaskGroup(of: Void.self) { group in
            for sender in 0..<senders {
                group.addTask {
                    try await runBlocking {
                        for sequence in 0..<perSender {
                            let msgid = UInt32(sender << 16 | sequence)
                            try connection.connection.send(payload(Int(msgid) % 4099), msgid: msgid, timeout: .seconds(10))
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        let received = try await connection.messages(senders * perSender, within: .seconds(30), "the echoes")
        try check(Set(received.map(\.msgid)).count == senders * perSender, "some messages arrived twice and others not at all")
        for sender in 0..<senders {
            let sequences = received.filter { Int($0.msgid >> 16) == sender }.map { Int($0.msgid & 0xFFFF) }
            try check(sequences.count == perSender, "sender \(sender): \(sequences.count) of \(perSender) messages arrived")
            if context.capabilities.preservesOrder {
                try check(sequences == Array(0..<perSender), "sender \(sender)'s messages arrived out of order")
            }
        }
        return .passed("\(senders) threads × \(perSender) messages all arrived" + (context.capabilities.preservesOrder ? ", each thread's in order" : ""))
    }

    static let broadcast = ConformanceCase("1.7", "A listener's broadcast reaches every connected client once", requires: .broadcast) { context in
        let listener = try context.listen(try context.endpoint("broadcast"))
        var accepted: [ConnectionProbe] = []
        for index in 0..<2 {
            _ = try await context.launchPeer(.client, at: listener.endpoint)
            accepted.append(try await listener.nextConnection(within: .seconds(10), "client \(index)"))
        }
        let payload = Array("to everyone".utf8)
        let delivered = listener.listener.broadcast(payload, 77, .seconds(5))
        try check(delivered == 2, "broadcast reported \(delivered) deliveries to 2 clients")
        for (index, connection) in accepted.enumerated() {
            let echoes = try await connection.messages(1, within: .seconds(10), "client \(index)'s echo of the broadcast")
            try check(echoes[0].msgid == 77 && echoes[0].payload == payload, "client \(index) received a different message")
        }
        try await Task.sleep(for: .milliseconds(200))
        try check(accepted.allSatisfy { $0.messageCount == 1 }, "a client received the broadcast more than once")
        return .passed("both clients received the broadcast once")
    }

    static let borrowingHandler = ConformanceCase(
        "1.8", "A borrowing message handler on a listener's connection is offered every one-way message once, in order, with its bytes; what it declines reaches messages"
    ) { context in
        .passed(try await offerToBorrowingHandlerInTwoSizes(on: .listener, context: context))
    }

    static let borrowingHandlerOnClient = ConformanceCase(
        "1.9", "A borrowing message handler on a client's connection is offered every one-way message once, in order, with its bytes; what it declines reaches messages"
    ) { context in
        .passed(try await offerToBorrowingHandlerInTwoSizes(on: .client, context: context))
    }

    /// Small messages, which a transport can lend from where they arrived (one read, one queue
    /// message, one record), and large ones: above the size from which a stream reassembler
    /// gathers payloads into arrays of their own, and from which a message port fragments.
    /// A listener's connection and a client's are separate cases: transports implement the
    /// two receive paths apart.
    private static func offerToBorrowingHandlerInTwoSizes(on receiver: BorrowingReceiver, context: CaseContext) async throws -> String {
        let sizes = [min(context.capabilities.maximumPayloadLength, 64), min(context.capabilities.maximumPayloadLength, 20_000)]
        var summaries: [String] = []
        for (index, size) in sizes.enumerated() {
            do {
                summaries.append(try await offerToBorrowingHandler(size: size, on: receiver, endpoint: "borrow\(receiver.rawValue)\(index)", context: context))
            } catch let error where !(error is CancellationError) {
                // Every failure names the end it happened on.
                throw ConformanceFailure("\(receiver.rawValue): \(error)")
            }
        }
        return summaries.joined(separator: "; ")
    }

    /// Which end of a connection cases 1.8 and 1.9 receive on.
    private enum BorrowingReceiver: String {
        case listener
        case client
    }

    /// Has 600 messages of `size` bytes arrive on `receiver`'s end, whose borrowing handler takes
    /// the even ones, and checks what the handler was offered and what reached messages. The
    /// listener's end receives a client peer's burst; the client's end receives a server peer's
    /// echoes of the same messages, sent to it one by one.
    private static func offerToBorrowingHandler(size: Int, on receiver: BorrowingReceiver, endpoint name: String, context: CaseContext) async throws -> String {
        let count = 600
        let offered = Mutex<[(msgid: UInt32, intact: Bool)]>([])
        var options = context.connectionOptions
        options.makeOnLoopBorrowingMessageHandler = {
            { msgid, payload, _ in
                let intact = payload.withUnsafeBytes { $0.elementsEqual(ConformancePeer.burstPayload(Int(msgid), size: size)) }
                offered.withLock { $0.append((msgid, intact)) }
                // Takes the even ones.
                return msgid % 2 == 0
            }
        }
        let connection: ConnectionProbe
        var listener: ListenerProbe?
        switch receiver {
        case .listener:
            let probe = try context.listen(try context.endpoint(name), options: options)
            listener = probe
            _ = try await context.launchPeer(.client, at: probe.endpoint, burst: (count, size))
            connection = try await probe.nextConnection(within: .seconds(10), "the bursting peer")
        case .client:
            let endpoint = try context.endpoint(name)
            _ = try await context.launchPeer(.server, at: endpoint)
            connection = try await context.connect(endpoint, options: options)
            do {
                try await runBlocking { [connection] in
                    for index in 0..<count {
                        try connection.connection.send(ConformancePeer.burstPayload(index, size: size), msgid: UInt32(index), timeout: .seconds(60))
                    }
                }
            } catch {
                throw ConformanceFailure("sending the \(size)-byte messages for the echoing peer to return failed: \(error)")
            }
        }
        // Released as soon as this size is done, not at the end of the case: a message port's
        // queues count against a small per-user quota.
        defer {
            connection.connection.invalidate()
            listener?.listener.close()
        }
        let declined = try await connection.messages(count / 2, within: .seconds(60), "the \(size)-byte messages the handler declined")
        _ = await poll(within: .seconds(30)) { offered.withLock { $0.count } >= count }
        try await Task.sleep(for: .milliseconds(200))
        let seen = offered.withLock { $0 }
        try check(seen.count == count, "the handler was offered \(seen.count) messages of \(size) bytes of the \(count) sent")
        try check(Set(seen.map(\.msgid)) == Set(0..<UInt32(count)), "the handler was offered some \(size)-byte messages twice and others never")
        if context.capabilities.preservesOrder {
            try check(seen.map(\.msgid) == Array(0..<UInt32(count)), "the handler was offered the \(size)-byte messages out of order")
        }
        if let altered = seen.first(where: { !$0.intact }) {
            throw ConformanceFailure("message \(altered.msgid) of \(size) bytes was offered to the handler with altered bytes")
        }
        try check(connection.messageCount == count / 2, "\(connection.messageCount) messages of \(size) bytes reached messages; the handler declined \(count / 2)")
        try check(declined.map(\.msgid).allSatisfy { $0 % 2 == 1 }, "a \(size)-byte message the handler took also reached messages")
        try check(Set(declined.map(\.msgid)).count == count / 2, "a declined \(size)-byte message reached messages twice")
        if let altered = declined.first(where: { $0.payload != ConformancePeer.burstPayload(Int($0.msgid), size: size) }) {
            throw ConformanceFailure("declined message \(altered.msgid) of \(size) bytes reached messages altered")
        }
        return "\(receiver.rawValue): \(count) messages of \(size.formattedBytes) each offered once" + (context.capabilities.preservesOrder ? " in order" : "") + "; the \(count / 2) declined reached messages intact"
    }

    static let sendsOnConnectionExecutor = ConformanceCase(
        "1.10", "One-way messages sent back to back with the suspending send from a task that prefers the connection's executor arrive once each, intact and in order", requires: .preservesOrder
    ) { context in
        // The path of an application that sends from the connection's own executor (the
        // harness's main stream rows): a transport may hold such sends back and write them
        // together (the engine does, over a unix socket), and must still deliver each once, in
        // order, the ones before a pause as well as those in a long run.
        let (_, connection) = try await context.connectToServerPeer("executor-sends")
        let count = 1000
        let sender = connection.connection
        do {
            try await withTaskExecutorPreference(sender.preferredTaskExecutor) {
                for index in 0..<count {
                    try await sender.send(payload(index), msgid: UInt32(index), timeout: .seconds(10))
                    // A pause now and then: the sends before it go on their own.
                    if index % 97 == 96 { try await Task.sleep(for: .milliseconds(2)) }
                }
            }
        } catch {
            throw ConformanceFailure("sending from a task that prefers the connection's executor failed: \(error)")
        }
        let received = try await connection.messages(count, within: .seconds(30), "the peer's echoes of the messages sent from the connection's executor")
        if let (index, message) = received.enumerated().first(where: { $0.element.msgid != UInt32($0.offset) }) {
            throw ConformanceFailure("echo \(index) is message \(message.msgid), not \(index): the order was not kept")
        }
        if let altered = received.first(where: { !TestPayload.equal($0.payload, payload(Int($0.msgid))) }) {
            throw ConformanceFailure("message \(altered.msgid) came back altered")
        }
        // Anything after the last expected echo is a duplicate.
        try await Task.sleep(for: .milliseconds(300))
        try check(connection.messageCount == count, "\(connection.messageCount) messages arrived for \(count) sent")
        return .passed("\(count) messages of 0-96 bytes sent from the connection's executor came back once each, intact, in order")
    }

    // MARK: Helpers

    /// The payload of message `index`: 0-96 bytes, distinct per index.
    static func payload(_ index: Int) -> [UInt8] {
        TestPayload.make(size: index % 97, seed: UInt8(truncatingIfNeeded: index))
    }

    /// Sends `count` one-way messages (msgid = index) from a thread, and waits for their echoes.
    static func sendAndCollectEchoes(_ count: Int, on connection: ConnectionProbe) async throws -> [ReceivedMessage] {
        try await runBlocking {
            for index in 0..<count {
                try connection.connection.send(payload(index), msgid: UInt32(index), timeout: .seconds(10))
            }
        }
        return try await connection.messages(count, within: .seconds(30), "the peer's echoes")
    }

    /// Sends `payload` to the peer's echo service and returns what comes back: through a
    /// request where the transport has request/reply, as a one-way message otherwise.
    static func roundTrip(_ payload: [UInt8], msgid: UInt32, on connection: ConnectionProbe, context: CaseContext) async throws -> [UInt8] {
        if context.capabilities.supportsRequestReply {
            return try await connection.connection.request(payload, msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(30), receiveTimeout: .seconds(60))
        }
        let before = connection.messageCount
        try await runBlocking { try connection.connection.send(payload, msgid: msgid, timeout: .seconds(30)) }
        return try await connection.messages(before + 1, within: .seconds(60), stall: .seconds(60), "the echo of \(payload.count) bytes")[before].payload
    }
}
