import IPCCore
import IPCFraming
import Foundation

/// Area 2: a stream transport's receiver reassembles frames from any chunking, and refuses
/// hostile input with the right error, dropping only the offending connection. Raw bytes are
/// written at a listener in this process, whose accepted connections show what it made of them.
enum FramingCases {
    static let all: [ConformanceCase] = [splitPoints, severalFramesInOneWrite, hostileLength, garbage, truncation, llbsdPeer]

    /// The payload limit of the listener these cases write at.
    static let maximumPayloadLength = 1 << 20

    static let splitPoints = ConformanceCase("2.1", "A frame split at any byte of its header or payload is reassembled", requires: .rawByteStream) { context in
        let (listener, access) = try setUp(context, "split")
        let stream = try RawByteStream(path: access.socketPath(listener.endpoint))
        let payload = Array("split me anywhere".utf8)
        let length = try frame(access.framing, msgid: 0, payload: payload).count
        // One frame for each split point (msgid = the point), then one written a byte at a time.
        for point in 1..<length {
            let bytes = try frame(access.framing, msgid: UInt32(point), payload: payload)
            try stream.write(Array(bytes[..<point]))
            // A pause, so that the receiver reads the two parts separately.
            try await Task.sleep(for: .milliseconds(1))
            try stream.write(Array(bytes[point...]))
        }
        for byte in try frame(access.framing, msgid: UInt32(length), payload: payload) {
            try stream.write([byte])
            try await Task.sleep(for: .microseconds(200))
        }
        let connection = try await listener.nextConnection(within: .seconds(5), "the raw stream")
        let received = try await connection.messages(length, within: .seconds(10), "the split frames")
        for (index, message) in received.enumerated() {
            try check(message.msgid == UInt32(index + 1) && message.payload == payload, "the frame split at byte \(index + 1) arrived as message \(message.msgid) of \(message.payload.count) bytes")
        }
        try check(connection.connection.invalidationReason == nil, "the connection was invalidated: \(connection.connection.invalidationReason!)")
        return .passed("a \(length)-byte \(access.framing) frame split at each of its \(length - 1) points, and written byte by byte, arrived whole")
    }

    static let severalFramesInOneWrite = ConformanceCase("2.2", "Several frames arriving in one read are all delivered, in order", requires: .rawByteStream) { context in
        let (listener, access) = try setUp(context, "batch")
        let stream = try RawByteStream(path: access.socketPath(listener.endpoint))
        let count = 64
        var bytes: [UInt8] = []
        for index in 0..<count {
            bytes += try frame(access.framing, msgid: UInt32(index), payload: TestPayload.make(size: index * 7, seed: UInt8(index)))
        }
        try stream.write(bytes)
        let connection = try await listener.nextConnection(within: .seconds(5), "the raw stream")
        let received = try await connection.messages(count, within: .seconds(10), "the batched frames")
        for (index, message) in received.enumerated() {
            try check(message.msgid == UInt32(index) && TestPayload.equal(message.payload, TestPayload.make(size: index * 7, seed: UInt8(index))), "frame \(index) of the batch arrived as message \(message.msgid)")
        }
        return .passed("\(count) frames (\(bytes.count) bytes) written at once all arrived in order")
    }

    static let hostileLength = ConformanceCase("2.3", "A frame announcing more than the receiver's maximum is refused from its header (frameTooLarge); the server keeps serving", requires: .rawByteStream) { context in
        let (listener, access) = try setUp(context, "hostile")
        // At the maximum: accepted.
        let atMaximum = try RawByteStream(path: access.socketPath(listener.endpoint))
        try atMaximum.write(try frame(access.framing, msgid: 1, payload: TestPayload.make(size: maximumPayloadLength)))
        let accepted = try await listener.nextConnection(within: .seconds(5), "the raw stream")
        _ = try await accepted.messages(1, within: .seconds(10), "a frame of exactly the maximum")
        // Above it: only the header is sent, so the receiver must decide from the header alone.
        for announced in [maximumPayloadLength + 1, Int(UInt32.max)] {
            let stream = try RawByteStream(path: access.socketPath(listener.endpoint))
            try stream.write(try header(access.framing, payloadLength: announced) + [1, 2, 3])
            try await checkDropped(stream, listener: listener, code: .frameTooLarge, context: context, "a header announcing \(announced) bytes")
        }
        try await checkServesAnotherClient(listener, context: context)
        return .passed("a payload of exactly \(maximumPayloadLength.formattedBytes) was accepted; headers announcing one byte more and 4 GiB were refused at once; the server kept serving")
    }

    static let garbage = ConformanceCase("2.4", "Bytes that are not a frame are refused (malformedFrame) and drop only that connection", requires: .rawByteStream) { context in
        let (listener, access) = try setUp(context, "garbage")
        // Every byte value once, scrambled (167 is odd, so this is a permutation).
        let scrambled = (0..<256).map { UInt8(truncatingIfNeeded: $0 &* 167 &+ 13) }
        var zeroedFirstByte = try frame(access.framing, msgid: 1, payload: [1, 2, 3])
        zeroedFirstByte[0] = 0
        let samples: [(String, [UInt8])] = [
            ("all 256 byte values, scrambled", scrambled),
            ("0xFF bytes and an empty line", [UInt8](repeating: 0xFF, count: 64) + Array("\r\n\r\n".utf8)),
            ("a frame whose first byte is zero", zeroedFirstByte),
        ]
        for (name, bytes) in samples {
            let stream = try RawByteStream(path: access.socketPath(listener.endpoint))
            try stream.write(bytes)
            try await checkDropped(stream, listener: listener, code: .malformedFrame, context: context, name)
        }
        // A good frame followed by garbage: the frame is delivered, then the connection dropped.
        let stream = try RawByteStream(path: access.socketPath(listener.endpoint))
        try stream.write(try frame(access.framing, msgid: 42, payload: [4, 2]) + [UInt8](repeating: 0, count: 32))
        let connection = try await checkDropped(stream, listener: listener, code: .malformedFrame, context: context, "a frame followed by zeros")
        // What the connection delivered is all in the probe once its message stream has ended
        // (the probe's reader may not have taken the frame yet when the invalidation is seen).
        try check(await poll(within: context.deadline) { connection.streamFinishedAt != nil }, "the dropped connection's message stream did not end within \(context.deadline)")
        try check(connection.messages.map(\.msgid) == [42], "the good frame before the garbage was not delivered alone (got \(connection.messages.map(\.msgid)))")
        try await checkServesAnotherClient(listener, context: context)
        return .passed("\(samples.count + 1) kinds of garbage each dropped their connection with malformedFrame; the server kept serving")
    }

    static let truncation = ConformanceCase("2.5", "A stream that ends inside a frame is an error (truncatedFrame), and the partial frame is not delivered", requires: .rawByteStream) { context in
        let (listener, access) = try setUp(context, "truncated")
        let whole = try frame(access.framing, msgid: 5, payload: TestPayload.make(size: 100))
        for (name, cut) in [("inside the header", 5), ("inside the payload", whole.count - 3)] {
            let stream = try RawByteStream(path: access.socketPath(listener.endpoint))
            try stream.write(Array(whole[..<cut]))
            stream.shutDownWriting()
            let connection = try await checkDropped(stream, listener: listener, code: .truncatedFrame, context: context, "a stream ending \(name)")
            try check(connection.messages.isEmpty, "a frame cut \(name) was delivered")
        }
        try await checkServesAnotherClient(listener, context: context)
        return .passed("streams ending inside a header and inside a payload were reported as truncatedFrame; nothing partial was delivered")
    }

    static let llbsdPeer = ConformanceCase(
        "2.6",
        "An LLBSDMessaging peer's frames (HTTP/1.1 200 responses with Content-Length and no IPC- fields) arrive as one-way messages, and a one-way message reaches it as such a response",
        requires: .rawByteStream, .llbsdFraming
    ) { context in
        let (listener, access) = try setUp(context, "llbsd")
        let stream = try RawByteStream(path: access.socketPath(listener.endpoint))
        // Written as docs/WIRE-FORMAT.md (section 3.7) describes an LLBSD peer's frames, not with
        // this package's encoder: a status line, Content-Length, the empty line, the body.
        let payloads: [[UInt8]] = [Array("hello".utf8), [], Array("\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 9\r\n".utf8) + [0, 0xFF]]
        for payload in payloads {
            try stream.write(Array("HTTP/1.1 200 OK\r\nContent-Length: \(payload.count)\r\n\r\n".utf8) + payload)
        }
        let connection = try await listener.nextConnection(within: .seconds(5), "the LLBSD peer")
        let received = try await connection.messages(payloads.count, within: .seconds(10), "the LLBSD peer's messages")
        for (index, message) in received.enumerated() {
            try check(
                !message.isRequest && message.msgid == 0 && message.payload == payloads[index],
                "the LLBSD peer's message \(index) arrived as \(message.isRequest ? "a request" : "a message") with msgid \(message.msgid) and \(message.payload.count) bytes"
            )
        }
        // The other way: a message, then the end of the connection; an LLBSD peer must be able
        // to read what came as one 200 response with Content-Length.
        let outgoing = Array("from the listener".utf8) + [0, 0x0D, 0x0A]
        try await connection.connection.send(outgoing, msgid: 7, timeout: .seconds(5))
        connection.connection.invalidate()
        let (bytes, closed) = try await runBlocking { stream.readUntilClosed(within: context.deadline) }
        try check(closed, "the listener's side did not close within \(context.deadline)")
        guard let response = LLBSDResponse(parsing: bytes) else {
            throw ConformanceFailure("what the LLBSD peer read is not one HTTP/1.1 response with Content-Length: \(String(decoding: bytes.prefix(120), as: UTF8.self).debugDescription)")
        }
        try check(response.status == 200, "the message reached the LLBSD peer as a \(response.status) response, not 200")
        try check(response.body == outgoing, "the LLBSD peer read a body of \(response.body.count) bytes, not the \(outgoing.count) sent")
        try check(connection.connection.invalidationReason?.kind == .invalidatedLocally, "the LLBSD peer's connection ended with \(connection.connection.invalidationReason.map(String.init(describing:)) ?? "nothing") before it was closed locally")
        return .passed("\(payloads.count) LLBSD frames (one empty, one whose body looks like a header) arrived as messages; a message reached the peer as a 200 response of \(response.body.count) bytes")
    }

    /// An HTTP/1.1 response as an LLBSDMessaging peer reads one (CFHTTPMessage): a status line,
    /// header fields up to the empty line, a `Content-Length`, that many body bytes, and nothing
    /// after them. `nil` if `bytes` are anything else.
    private struct LLBSDResponse {
        var status: Int
        var body: [UInt8]

        init?(parsing bytes: [UInt8]) {
            let separator = Array("\r\n\r\n".utf8)
            guard let end = (0...max(0, bytes.count - separator.count)).first(where: { Array(bytes[$0..<min(bytes.count, $0 + separator.count)]) == separator }) else { return nil }
            let lines = String(decoding: bytes[..<end], as: UTF8.self).components(separatedBy: "\r\n")
            let statusLine = lines[0].split(separator: " ", maxSplits: 2)
            guard statusLine.count >= 2, statusLine[0] == "HTTP/1.1", let status = Int(statusLine[1]) else { return nil }
            let lengths = lines.dropFirst().compactMap { line -> Int? in
                let parts = line.split(separator: ":", maxSplits: 1)
                guard parts.count == 2, parts[0].lowercased() == "content-length" else { return nil }
                let value = parts[1].drop { $0 == " " || $0 == "\t" }
                return Int(String(value.reversed().drop { $0 == " " || $0 == "\t" }.reversed()))
            }
            let bodyStart = end + separator.count
            guard lengths.count == 1, bytes.count == bodyStart + lengths[0] else { return nil }
            self.status = status
            body = Array(bytes[bodyStart...])
        }
    }

    // MARK: Helpers

    private static func setUp(_ context: CaseContext, _ name: String) throws -> (ListenerProbe, RawStreamAccess) {
        var options = context.connectionOptions
        options.maximumPayloadLength = maximumPayloadLength
        let listener = try context.listen(try context.endpoint(name), options: options)
        return (listener, context.subject.rawStream!)
    }

    /// The encoder of `framing` with no limit of its own, so it can write hostile headers.
    private static func encoder(_ framing: Framing) -> any FrameEncoder {
        framing.makeEncoder(maximumPayloadLength: Int(UInt32.max))
    }

    static func frame(_ framing: Framing, msgid: UInt32, payload: [UInt8]) throws -> [UInt8] {
        try encoder(framing).encode(Frame(kind: .message, msgid: msgid, payload: payload))
    }

    private static func header(_ framing: Framing, payloadLength: Int) throws -> [UInt8] {
        var bytes: [UInt8] = []
        try encoder(framing).encodeHeader(FrameHeader(kind: .message, msgid: 1, correlation: 0, payloadLength: payloadLength), into: &bytes)
        return bytes
    }

    /// Checks that the listener closed `stream` within the deadline and invalidated its side
    /// with a protocol error of `code`; returns that side.
    @discardableResult
    private static func checkDropped(_ stream: RawByteStream, listener: ListenerProbe, code: IPCError.Code, context: CaseContext, _ what: String) async throws -> ConnectionProbe {
        let connection = try await listener.nextConnection(within: .seconds(5), what)
        let closed = try await runBlocking { stream.readUntilClosed(within: context.deadline).closed }
        try check(closed, "\(what): the connection was not closed within \(context.deadline)")
        _ = await connection.invalidation(within: context.deadline)
        let reason = connection.firstInvalidation?.reason
        try check(reason?.kind == .protocolError && reason?.error?.code == code, "\(what): the connection was invalidated with \(reason.map(String.init(describing:)) ?? "nothing"), not a protocol error \(code)")
        return connection
    }

    /// Checks that a well-behaved client of the transport is still served.
    static func checkServesAnotherClient(_ listener: ListenerProbe, context: CaseContext) async throws {
        let client = try await context.connect(listener.endpoint)
        try await client.connection.send(Array("still there?".utf8), msgid: 99, timeout: .seconds(5))
        let accepted = try await listener.nextConnection(within: .seconds(5), "a well-behaved client after the hostile ones")
        let messages = try await accepted.messages(1, within: .seconds(5), "a well-behaved client's message")
        try check(messages[0].msgid == 99, "the well-behaved client's message arrived as \(messages[0].msgid)")
    }
}
