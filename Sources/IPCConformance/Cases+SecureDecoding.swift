import IPCCore
import IPCSecureCoding

/// Area 3: a receiver that decodes payloads with a secure codec refuses hostile ones with a
/// typed error, and the connection that carried them survives. Each payload goes to the peer
/// and comes back (one-way echo), so it crossed the transport twice before it is decoded here.
enum SecureDecodingCases {
    static let all: [ConformanceCase] = [disallowedType, disallowedElement, truncated, malformed, deepNesting, refusedInHandler]

    static let disallowedType = ConformanceCase("3.1", "A payload of a type outside the allow-list is refused with disallowedType; the connection survives", requires: .payloadCodecs) { context in
        try await refuse(\.disallowedType, with: .disallowedType, context)
    }

    static let disallowedElement = ConformanceCase("3.2", "A container holding one element of a disallowed type is refused with disallowedType; the connection survives", requires: .payloadCodecs) { context in
        try await refuse(\.disallowedElement, with: .disallowedType, context)
    }

    static let truncated = ConformanceCase("3.3", "A truncated payload is refused with malformedPayload; the connection survives", requires: .payloadCodecs) { context in
        try await refuse({ $0.truncations }, with: .malformedPayload, context)
    }

    static let malformed = ConformanceCase("3.4", "Bytes that are no payload are refused with malformedPayload; the connection survives", requires: .payloadCodecs) { context in
        try await refuse({ _ in SecureDecodingFixtures.malformed }, with: .malformedPayload, context)
    }

    static let deepNesting = ConformanceCase("3.5", "A payload nested deeper than the limit is refused with nestingTooDeep, without unbounded recursion; the connection survives", requires: .payloadCodecs) { context in
        try await refuse(\.deeplyNested, with: .nestingTooDeep, context)
    }

    static let refusedInHandler = ConformanceCase("3.6", "A request handler that refuses a payload fails that request only: the requester gets transportFailure naming the error, and the connection serves the next request", requires: .payloadCodecs, .requestReply) { context in
        let fixtures = try SecureDecodingFixtures(codec: context.subject.payloadCodecs[0])
        var options = context.connectionOptions
        options.requestHandler = { [fixtures] _, payload in
            _ = try fixtures.codec.decode(payload, allowing: fixtures.allowList)
            return Array("accepted".utf8)
        }
        let listener = try context.listen(try context.endpoint("handler"), options: options)
        let connection = try await context.connect(listener.endpoint)
        let error = try await checkError([.transportFailure], "a request with a disallowed type") {
            try await connection.connection.request(fixtures.disallowedType, msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
        }
        try check(error.message.contains(IPCError.Code.disallowedType.description), "the failure does not name the error: \(error.message)")
        let reply = try await connection.connection.request(fixtures.valid, msgid: 2, sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
        try check(reply == Array("accepted".utf8), "the next request was not served")
        return .passed("\(fixtures.codec.name): the refused request failed with \(error.code) naming disallowedType; the next was served")
    }

    // MARK: Helpers

    private static func refuse(_ payload: KeyPath<SecureDecodingFixtures, [UInt8]>, with code: IPCError.Code, _ context: CaseContext) async throws -> CaseOutcome {
        try await refuse({ [$0[keyPath: payload]] }, with: code, context)
    }

    /// For each codec: sends each payload of `payloads` through the peer's echo, checks that
    /// decoding it fails with `code`, then that a valid payload still arrives and decodes.
    private static func refuse(_ payloads: (SecureDecodingFixtures) -> [[UInt8]], with code: IPCError.Code, _ context: CaseContext) async throws -> CaseOutcome {
        let (_, connection) = try await context.connectToServerPeer("decoding")
        var msgid: UInt32 = 0
        var summaries: [String] = []
        for codec in context.subject.payloadCodecs {
            let fixtures = try SecureDecodingFixtures(codec: codec)
            let hostile = payloads(fixtures)
            for bytes in hostile {
                let arrived = try await echo(bytes, msgid: &msgid, on: connection)
                try await checkError([code], "\(codec.name): decoding a hostile payload of \(bytes.count) bytes") {
                    try codec.decode(arrived, allowing: fixtures.allowList)
                }
            }
            let valid = try await echo(fixtures.valid, msgid: &msgid, on: connection)
            do {
                _ = try codec.decode(valid, allowing: fixtures.allowList)
            } catch {
                throw ConformanceFailure("\(codec.name): a valid payload after the hostile ones did not decode: \(error)")
            }
            try check(connection.connection.invalidationReason == nil, "\(codec.name): the connection did not survive: \(connection.connection.invalidationReason!)")
            summaries.append("\(codec.name) (\(hostile.count))")
        }
        return .passed("refused with \(code) by " + summaries.joined(separator: ", ") + "; a valid payload then decoded on the same connection")
    }

    /// Sends `bytes` to the peer as a one-way message and returns the echo.
    private static func echo(_ bytes: [UInt8], msgid: inout UInt32, on connection: ConnectionProbe) async throws -> [UInt8] {
        defer { msgid += 1 }
        try await connection.connection.send(bytes, msgid: msgid, timeout: .seconds(10))
        let echoed = try await connection.messages(Int(msgid) + 1, within: .seconds(10), "the echo of a \(bytes.count)-byte payload")[Int(msgid)]
        try check(echoed.payload == bytes, "the payload was altered in transit")
        return echoed.payload
    }
}
