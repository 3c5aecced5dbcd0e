import IPCCore
import IPCFraming
import IPCTestSupport
import Testing

/// A message the HTTP decoder must refuse, and the byte at which it must do so.
struct HTTPRefusal: Sendable, CustomTestStringConvertible {
    var name: String
    var text: String
    var code: IPCError.Code
    /// The refusal happens when the last byte of the first occurrence of this text arrives.
    var failsAfter: String

    var testDescription: String { name }

    var bytes: [UInt8] { Array(text.utf8) }

    var failingByteCount: Int? {
        let bytes = self.bytes, marker = Array(failsAfter.utf8)
        guard marker.count <= bytes.count else { return nil }
        return (0...bytes.count - marker.count).first { bytes[$0..<$0 + marker.count].elementsEqual(marker) }.map { $0 + marker.count }
    }
}

@Suite(.offTheCooperativePool) struct HTTPFramingTests {
    static let maximumPayloadLength = 1000

    func reassembler(maximumHeaderLength: Int = HTTPWireFormat.defaultMaximumHeaderLength) -> FrameReassembler<HTTPFrameDecoder> {
        FrameReassembler(decoder: HTTPFrameDecoder(maximumPayloadLength: Self.maximumPayloadLength, maximumHeaderLength: maximumHeaderLength))
    }

    /// Decodes a whole stream and checks that it ends at a frame boundary.
    func decode(_ text: String) throws -> [Frame] {
        let reassembler = reassembler()
        reassembler.append(Array(text.utf8))
        let frames = try reassembler.drain()
        try reassembler.finish()
        return frames
    }

    // MARK: Encoding

    @Test func encodesRequestsAndResponsesAsExactHTTP11() throws {
        let encoder = HTTPFrameEncoder(maximumPayloadLength: 100)
        func text(_ frame: Frame) throws -> String { String(decoding: try encoder.encode(frame), as: UTF8.self) }

        #expect(try text(Frame(kind: .request, msgid: 7, correlation: 42, payload: Array("hello".utf8))) ==
            "POST /ipc HTTP/1.1\r\nHost: ipcbench\r\nContent-Length: 5\r\nIPC-Kind: request\r\nIPC-Msgid: 7\r\nIPC-Correlation: 42\r\n\r\nhello")
        #expect(try text(Frame(kind: .message, msgid: 0, correlation: 0)) ==
            "POST /ipc HTTP/1.1\r\nHost: ipcbench\r\nContent-Length: 0\r\nIPC-Kind: message\r\nIPC-Msgid: 0\r\nIPC-Correlation: 0\r\n\r\n")
        #expect(try text(Frame(kind: .reply, msgid: 7, correlation: 42, payload: Array("ok".utf8))) ==
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nIPC-Kind: reply\r\nIPC-Msgid: 7\r\nIPC-Correlation: 42\r\n\r\nok")
        #expect(try text(Frame(kind: .failure, msgid: UInt32.max, correlation: UInt64.max, payload: Array("no".utf8))) ==
            "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\nIPC-Kind: failure\r\nIPC-Msgid: 4294967295\r\nIPC-Correlation: 18446744073709551615\r\n\r\nno")
    }

    // MARK: LLBSD-compatible mode

    /// Decodes with the LLBSD-compatible decoder (WIRE-FORMAT 3.7).
    func decodeLLBSD(_ text: String) throws -> [Frame] {
        let reassembler = FrameReassembler(decoder: HTTPFrameDecoder(maximumPayloadLength: Self.maximumPayloadLength, llbsdCompatible: true))
        reassembler.append(Array(text.utf8))
        let frames = try reassembler.drain()
        try reassembler.finish()
        return frames
    }

    @Test func anLLBSDPeersFrameIsAMessageInLLBSDModeAndAStrayReplyOtherwise() throws {
        let llbsd = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
        #expect(try decodeLLBSD(llbsd) == [Frame(kind: .message, msgid: 0, correlation: 0, payload: Array("hello".utf8))])
        #expect(try decode(llbsd) == [Frame(kind: .reply, msgid: 0, correlation: 0, payload: Array("hello".utf8))])
        // Replies and failures that say so stay replies and failures; requests stay requests.
        let ours = "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nIPC-Kind: reply\r\nIPC-Correlation: 9\r\n\r\nr" +
            "HTTP/1.1 500 No\r\nContent-Length: 0\r\nIPC-Kind: failure\r\nIPC-Correlation: 9\r\n\r\n" +
            "POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
        #expect(try decodeLLBSD(ours) == [
            Frame(kind: .reply, msgid: 0, correlation: 9, payload: Array("r".utf8)),
            Frame(kind: .failure, msgid: 0, correlation: 9),
            Frame(kind: .request),
        ])
    }

    @Test func inLLBSDModeAResponseWithoutIPCKindMustBe2xx() throws {
        let error = #expect(throws: IPCError.self) { try decodeLLBSD("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n") }
        #expect(error?.code == .malformedFrame)
    }

    @Test func inLLBSDModeAMessageIsWrittenAsA200ResponseWithoutIPCKind() throws {
        let encoder = HTTPFrameEncoder(maximumPayloadLength: 100, llbsdCompatible: true)
        let message = String(decoding: try encoder.encode(Frame(kind: .message, msgid: 3, payload: Array("hi".utf8))), as: UTF8.self)
        #expect(message == "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nIPC-Msgid: 3\r\nIPC-Correlation: 0\r\n\r\nhi")
        #expect(try decodeLLBSD(message) == [Frame(kind: .message, msgid: 3, payload: Array("hi".utf8))])
        let request = String(decoding: try encoder.encode(Frame(kind: .request, msgid: 3, correlation: 4)), as: UTF8.self)
        #expect(request.hasPrefix("POST /ipc HTTP/1.1\r\n") && request.contains("IPC-Kind: request"))
    }

    // MARK: Accepted messages

    @Test func curlRequestIsARequestWithItsBody() throws {
        let curl = "POST /echo HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\nContent-Length: 5\r\nContent-Type: application/x-www-form-urlencoded\r\n\r\nhello"
        #expect(try decode(curl) == [Frame(kind: .request, msgid: 0, correlation: 0, payload: Array("hello".utf8))])
        try expectEveryChunkingDecodes(curl)
    }

    @Test func requestWithoutContentLengthHasAnEmptyBody() throws {
        let text = "GET /status HTTP/1.1\r\nHost: x\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\nIPC-Kind: message\r\n\r\nz"
        #expect(try decode(text) == [
            Frame(kind: .request),
            Frame(kind: .message, payload: Array("z".utf8)),
        ])
    }

    @Test func fieldNamesIgnoreCaseAndValuesIgnoreSurroundingWhitespace() throws {
        let text = "PUT * HTTP/1.1\r\ncontent-LENGTH: \t3 \r\nipc-kind:message\r\nIPC-MSGID:  9\r\nIpc-Correlation: 0000000000000000000012\t\r\nX-Name: caf\u{e9}\r\n\r\nabc"
        #expect(try decode(text) == [Frame(kind: .message, msgid: 9, correlation: 12, payload: Array("abc".utf8))])
    }

    /// Field names are compared ignoring case by setting bit 5 of each byte: a name that differs
    /// from a known one in any other way, one token byte at a time, is an unknown field (ignored),
    /// not the known one.
    @Test func aNameThatDiffersInOneByteIsAnotherField() throws {
        let tchar = Array("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ".utf8)
        for known in ["content-length", "ipc-msgid"] {
            for position in known.utf8.indices {
                let original = known.utf8[position]
                for byte in tchar where byte | 0x20 != original | 0x20 {
                    var name = Array(known.utf8)
                    name[known.utf8.distance(from: known.utf8.startIndex, to: position)] = byte
                    // A response needs Content-Length; a request's IPC-Msgid defaults to 0.
                    let text = known == "content-length"
                        ? Array("HTTP/1.1 200 OK\r\n".utf8) + name + Array(": 1\r\n\r\nx".utf8)
                        : Array("POST / HTTP/1.1\r\nContent-Length: 0\r\n".utf8) + name + Array(": 5\r\n\r\n".utf8)
                    let reassembler = reassembler()
                    reassembler.append(text)
                    let frames = try? reassembler.drain()
                    let label = String(decoding: name, as: UTF8.self)
                    if known == "content-length" {
                        #expect(frames == nil, "\(label) was taken for Content-Length")
                    } else {
                        #expect(frames?.first?.msgid == 0, "\(label) was taken for IPC-Msgid")
                    }
                }
            }
        }
    }

    /// `tchar` (RFC 9110 5.6.2), byte by byte: a field name or a method of that one byte is
    /// accepted exactly when the byte is in the set.
    @Test func tokensAreExactlyTheRFCsCharacters() throws {
        let tchar = Set(Array("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ".utf8))
        for byte in UInt8(0x21)...UInt8(0xFF) where byte != UInt8(ascii: ":") {
            let field = Array("POST / HTTP/1.1\r\n".utf8) + [byte] + Array(": v\r\nContent-Length: 0\r\n\r\n".utf8)
            let reassembler = reassembler()
            reassembler.append(field)
            #expect(((try? reassembler.drain())?.count == 1) == tchar.contains(byte), "field name 0x\(String(byte, radix: 16))")
            let method = [byte] + Array(" / HTTP/1.1\r\n\r\n".utf8)
            let methodReassembler = self.reassembler()
            methodReassembler.append(method)
            #expect(((try? methodReassembler.drain())?.count == 1) == tchar.contains(byte), "method 0x\(String(byte, radix: 16))")
        }
    }

    @Test(arguments: [
        ("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", Frame.Kind.reply),
        ("HTTP/1.1 204 \r\nContent-Length: 0\r\n\r\n", .reply),
        ("HTTP/1.1 299 Whatever it says\r\nContent-Length: 0\r\nIPC-Kind: reply\r\n\r\n", .reply),
        ("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", .failure),
        ("HTTP/1.1 302 Found\r\nContent-Length: 0\r\nLocation: /x\r\n\r\n", .failure),
        ("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nIPC-Kind: failure\r\n\r\n", .failure),
    ])
    func responseKindFollowsTheStatusClass(text: String, kind: Frame.Kind) throws {
        #expect(try decode(text).map(\.kind) == [kind])
    }

    @Test func headerBlockOfExactlyTheLimitIsAccepted() throws {
        let prefix = "POST / HTTP/1.1\r\nX-Pad: "
        let limit = 100
        let text = prefix + String(repeating: "a", count: limit - prefix.utf8.count - 4) + "\r\n\r\n"
        #expect(text.utf8.count == limit)
        let reassembler = reassembler(maximumHeaderLength: limit)
        let outcome = feedByteByByte(Array(text.utf8), into: reassembler)
        #expect(outcome.failure == nil)
        #expect(outcome.frames == [Frame(kind: .request)])
    }

    @Test func decoderAsksForOneMoreByteUntilTheHeaderEnds() throws {
        var decoder = HTTPFrameDecoder(maximumPayloadLength: 100)
        let partial = Array("POST / HTTP/1.1\r\nContent-Length: 4\r\n\r".utf8)
        let step = try partial.withUnsafeBytes { try decoder.decode($0) }
        #expect(step == .needMoreBytes(atLeast: partial.count + 1))
        let whole = partial + Array("\nbody".utf8)
        #expect(try whole.withUnsafeBytes { try decoder.decode($0) } == .frame(Frame(kind: .request, payload: Array("body".utf8)), consumed: whole.count))
    }

    /// A reassembler that gathers a large body straight into the frame's array reads the head
    /// with `decodeHeader` before the body is there; the decoder's scan is shared with `decode`,
    /// and forgotten when the caller consumes the frame itself.
    @Test func headIsReadBeforeItsBodyAndForgottenOnceTheCallerTakesTheFrame() throws {
        let body = patternedPayload(100_000)
        let frame = Frame(kind: .request, msgid: 7, correlation: 11, payload: body)
        let encoded = try HTTPFrameEncoder(maximumPayloadLength: 1 << 20).encode(frame)
        let headLength = encoded.count - body.count
        var decoder = HTTPFrameDecoder(maximumPayloadLength: 1 << 20)
        // Half a head: nothing yet.
        #expect(try encoded.withUnsafeBytes { try decoder.decodeHeader(UnsafeRawBufferPointer(rebasing: $0[..<(headLength / 2)])) } == nil)
        let partial = Array(encoded[..<(headLength + 10)])
        let header = try #require(try partial.withUnsafeBytes { try decoder.decodeHeader($0) })
        #expect(header.header == FrameHeader(kind: .request, msgid: 7, correlation: 11, payloadLength: body.count))
        #expect(header.headerLength == headLength)
        // Not taken yet: decode goes on from the same head.
        #expect(try partial.withUnsafeBytes { try decoder.decode($0) } == .needMoreBytes(atLeast: encoded.count))
        #expect(try encoded.withUnsafeBytes { try decoder.decode($0) } == .frame(frame, consumed: encoded.count))
        // Taken by the caller: the next bytes are the next frame's.
        _ = try #require(try encoded.withUnsafeBytes { try decoder.decodeHeader($0) })
        decoder.forgetFrame()
        let next = try HTTPFrameEncoder(maximumPayloadLength: 100).encode(Frame(kind: .reply, msgid: 7, correlation: 11, payload: [1, 2, 3]))
        #expect(try next.withUnsafeBytes { try decoder.decode($0) } == .frame(Frame(kind: .reply, msgid: 7, correlation: 11, payload: [1, 2, 3]), consumed: next.count))
    }

    /// A bad head in bytes appended in a large piece (which a reassembler probes for a header,
    /// to gather the body) is refused as it is when decoded: the error is not lost, nor a frame
    /// made of what follows it.
    @Test func aBadHeadFoundWhileProbingForABodyToGatherIsRefused() throws {
        let reassembler = FrameReassembler(decoder: HTTPFrameDecoder(maximumPayloadLength: 1 << 20))
        let head = "POST / HTTP/1.1\r\nContent-Length: 100000\r\nContent-Length: 100000\r\n\r\n"
        reassembler.append(Array(head.utf8) + patternedPayload(100_000))
        let error = #expect(throws: IPCError.self) { try reassembler.nextFrame() }
        #expect(error?.code == .malformedFrame)
        #expect(throws: IPCError.self) { try reassembler.nextFrame() }
    }

    // MARK: Refused messages

    static let refusals: [HTTPRefusal] = [
        .init(name: "equal Content-Length twice", text: "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", code: .malformedFrame, failsAfter: "Content-Length: 5\r\nContent-Length: 5\r\n"),
        .init(name: "conflicting Content-Length", text: "POST / HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 6\r\n\r\nhello!", code: .malformedFrame, failsAfter: "content-length: 6\r\n"),
        .init(name: "Content-Length list", text: "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello", code: .malformedFrame, failsAfter: "5, 5\r\n"),
        .init(name: "Content-Length with sign", text: "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello", code: .malformedFrame, failsAfter: "+5\r\n"),
        .init(name: "Content-Length hex", text: "POST / HTTP/1.1\r\nContent-Length: 0x5\r\n\r\nhello", code: .malformedFrame, failsAfter: "0x5\r\n"),
        .init(name: "empty Content-Length", text: "POST / HTTP/1.1\r\nContent-Length: \r\n\r\n", code: .malformedFrame, failsAfter: "Content-Length: \r\n"),
        .init(name: "Content-Length overflowing Int", text: "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", code: .malformedFrame, failsAfter: "99\r\n"),
        .init(name: "Content-Length of Int.max + 1", text: "POST / HTTP/1.1\r\nContent-Length: 9223372036854775808\r\n\r\n", code: .malformedFrame, failsAfter: "808\r\n"),
        .init(name: "Content-Length of Int.max", text: "POST / HTTP/1.1\r\nContent-Length: 9223372036854775807\r\n\r\n", code: .frameTooLarge, failsAfter: "807\r\n"),
        .init(name: "Content-Length above the maximum", text: "POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", code: .frameTooLarge, failsAfter: "1001\r\n"),
        .init(name: "Content-Length 2^32-1", text: "HTTP/1.1 200 OK\r\nContent-Length: 4294967295\r\n\r\n", code: .frameTooLarge, failsAfter: "4294967295\r\n"),
        .init(name: "Transfer-Encoding chunked", text: "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", code: .unsupportedFraming, failsAfter: "chunked\r\n"),
        .init(name: "Transfer-Encoding after Content-Length", text: "POST / HTTP/1.1\r\nContent-Length: 5\r\ntransfer-encoding: identity\r\n\r\nhello", code: .unsupportedFraming, failsAfter: "identity\r\n"),
        .init(name: "NUL in a field value", text: "POST / HTTP/1.1\r\nX-Note: a\0b\r\n\r\n", code: .malformedFrame, failsAfter: "a\0"),
        .init(name: "NUL in the start line", text: "POST /\0 HTTP/1.1\r\n\r\n", code: .malformedFrame, failsAfter: "/\0"),
        .init(name: "escape in a field value", text: "POST / HTTP/1.1\r\nX-Note: \u{1B}[2J\r\n\r\n", code: .malformedFrame, failsAfter: "\u{1B}"),
        .init(name: "DEL in a field name", text: "POST / HTTP/1.1\r\nX\u{7F}: 1\r\n\r\n", code: .malformedFrame, failsAfter: "X\u{7F}"),
        .init(name: "bare LF after the start line", text: "POST / HTTP/1.1\nHost: x\r\n\r\n", code: .malformedFrame, failsAfter: "HTTP/1.1\n"),
        .init(name: "bare LF ending the head", text: "POST / HTTP/1.1\r\nHost: x\r\n\n", code: .malformedFrame, failsAfter: "x\r\n\n"),
        .init(name: "CR without LF", text: "POST / HTTP/1.1\rHost: x\r\n\r\n", code: .malformedFrame, failsAfter: "HTTP/1.1\rH"),
        .init(name: "obs-fold with SP", text: "POST / HTTP/1.1\r\nX-Long: a\r\n b\r\n\r\n", code: .malformedFrame, failsAfter: "a\r\n "),
        .init(name: "obs-fold with HTAB", text: "POST / HTTP/1.1\r\nX-Long: a\r\n\tb\r\n\r\n", code: .malformedFrame, failsAfter: "a\r\n\t"),
        .init(name: "whitespace before the start line", text: " POST / HTTP/1.1\r\n\r\n", code: .malformedFrame, failsAfter: " "),
        .init(name: "empty line before the start line", text: "\r\nPOST / HTTP/1.1\r\n\r\n", code: .malformedFrame, failsAfter: "\r\n"),
        .init(name: "HTTP/1.0 request", text: "POST / HTTP/1.0\r\nContent-Length: 0\r\n\r\n", code: .malformedFrame, failsAfter: "HTTP/1.0\r\n"),
        .init(name: "HTTP/1.0 response", text: "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", code: .malformedFrame, failsAfter: "OK\r\n"),
        .init(name: "HTTP/2.0 request", text: "POST / HTTP/2.0\r\n\r\n", code: .malformedFrame, failsAfter: "HTTP/2.0\r\n"),
        .init(name: "lower-case version", text: "POST / http/1.1\r\n\r\n", code: .malformedFrame, failsAfter: "http/1.1\r\n"),
        .init(name: "HTTP/0.9 request line", text: "GET /\r\n\r\n", code: .malformedFrame, failsAfter: "GET /\r\n"),
        .init(name: "two spaces in the request line", text: "POST  / HTTP/1.1\r\n\r\n", code: .malformedFrame, failsAfter: "HTTP/1.1\r\n"),
        .init(name: "method that is not a token", text: "PO(ST / HTTP/1.1\r\n\r\n", code: .malformedFrame, failsAfter: "HTTP/1.1\r\n"),
        .init(name: "status code of two digits", text: "HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n", code: .malformedFrame, failsAfter: "OK\r\n"),
        .init(name: "status code without reason SP", text: "HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", code: .malformedFrame, failsAfter: "200\r\n"),
        .init(name: "status code 600", text: "HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n", code: .malformedFrame, failsAfter: "Odd\r\n"),
        .init(name: "interim response", text: "HTTP/1.1 100 Continue\r\n\r\n", code: .unsupportedFraming, failsAfter: "Continue\r\n"),
        .init(name: "response without Content-Length", text: "HTTP/1.1 200 OK\r\nIPC-Kind: reply\r\n\r\nhello", code: .malformedFrame, failsAfter: "reply\r\n\r\n"),
        .init(name: "field without a colon", text: "POST / HTTP/1.1\r\nHost localhost\r\n\r\n", code: .malformedFrame, failsAfter: "localhost\r\n"),
        .init(name: "whitespace before the colon", text: "POST / HTTP/1.1\r\nContent-Length : 0\r\n\r\n", code: .malformedFrame, failsAfter: ": 0\r\n"),
        .init(name: "empty field name", text: "POST / HTTP/1.1\r\n: x\r\n\r\n", code: .malformedFrame, failsAfter: ": x\r\n"),
        .init(name: "unknown IPC-Kind", text: "POST / HTTP/1.1\r\nIPC-Kind: ping\r\n\r\n", code: .malformedFrame, failsAfter: "ping\r\n"),
        .init(name: "IPC-Kind in upper case", text: "POST / HTTP/1.1\r\nIPC-Kind: MESSAGE\r\n\r\n", code: .malformedFrame, failsAfter: "MESSAGE\r\n"),
        .init(name: "reply kind on a request", text: "POST / HTTP/1.1\r\nIPC-Kind: reply\r\n\r\n", code: .malformedFrame, failsAfter: "reply\r\n"),
        .init(name: "reply kind on a 500 response", text: "HTTP/1.1 500 Oops\r\nIPC-Kind: reply\r\nContent-Length: 0\r\n\r\n", code: .malformedFrame, failsAfter: "reply\r\n"),
        .init(name: "request kind on a response", text: "HTTP/1.1 200 OK\r\nIPC-Kind: request\r\nContent-Length: 0\r\n\r\n", code: .malformedFrame, failsAfter: "request\r\n"),
        .init(name: "IPC-Kind twice", text: "POST / HTTP/1.1\r\nIPC-Kind: request\r\nIPC-Kind: request\r\n\r\n", code: .malformedFrame, failsAfter: "request\r\nIPC-Kind: request\r\n"),
        .init(name: "negative IPC-Msgid", text: "POST / HTTP/1.1\r\nIPC-Msgid: -1\r\n\r\n", code: .malformedFrame, failsAfter: "-1\r\n"),
        .init(name: "IPC-Msgid above 2^32-1", text: "POST / HTTP/1.1\r\nIPC-Msgid: 4294967296\r\n\r\n", code: .malformedFrame, failsAfter: "4294967296\r\n"),
        .init(name: "IPC-Msgid not a number", text: "POST / HTTP/1.1\r\nIPC-Msgid: seven\r\n\r\n", code: .malformedFrame, failsAfter: "seven\r\n"),
        .init(name: "IPC-Msgid twice", text: "POST / HTTP/1.1\r\nIPC-Msgid: 1\r\nIPC-Msgid: 1\r\n\r\n", code: .malformedFrame, failsAfter: "IPC-Msgid: 1\r\nIPC-Msgid: 1\r\n"),
        .init(name: "IPC-Correlation above 2^64-1", text: "POST / HTTP/1.1\r\nIPC-Correlation: 18446744073709551616\r\n\r\n", code: .malformedFrame, failsAfter: "616\r\n"),
        .init(name: "empty IPC-Correlation", text: "POST / HTTP/1.1\r\nIPC-Correlation:\r\n\r\n", code: .malformedFrame, failsAfter: "Correlation:\r\n"),
    ]

    @Test(arguments: refusals)
    func malformedMessageIsRefusedWhenItsBadByteArrives(refusal: HTTPRefusal) throws {
        let failingByteCount = try #require(refusal.failingByteCount, "marker not found in the text")
        let outcome = feedByteByByte(refusal.bytes, into: reassembler())
        #expect(outcome.frames.isEmpty)
        #expect(outcome.failure?.error.code == refusal.code)
        #expect(outcome.failure?.byteCount == failingByteCount)

        // All at once, the same error comes out.
        let whole = reassembler()
        whole.append(refusal.bytes)
        let error = #expect(throws: IPCError.self) { try whole.nextFrame() }
        #expect(error == outcome.failure?.error)
    }

    @Test(arguments: ["POST / HTTP/1.1\r\nContent-Length: 4294967295\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 1001\r\n\r\n"])
    func hostileContentLengthIsRefusedBeforeTheBodyIsBuffered(head: String) throws {
        let reassembler = reassembler()
        reassembler.append(Array(head.utf8))
        let error = #expect(throws: IPCError.self) { try reassembler.nextFrame() }
        #expect(error?.code == .frameTooLarge)
        #expect(reassembler.bufferedByteCount == head.utf8.count)
        var offered = 0
        _ = reassembler.receive { free in
            offered = free.count
            return 0
        }
        // Not grown for the announced body: header plus free space is one chunk.
        #expect(offered + head.utf8.count <= FrameReassembler<HTTPFrameDecoder>.chunkSize)
    }

    @Test func headerBlockLongerThanTheLimitIsRefusedWhenTheLimitIsReached() throws {
        let limit = HTTPWireFormat.defaultMaximumHeaderLength
        // A head that never ends: one long field value, as a slow-loris peer would send.
        let bytes = Array("POST / HTTP/1.1\r\nX-Filler: ".utf8) + Array(repeating: UInt8(ascii: "a"), count: limit)
        let outcome = feedByteByByte(bytes, into: reassembler())
        #expect(outcome.failure?.error.code == .frameTooLarge)
        #expect(outcome.failure?.byteCount == limit)

        // Many short fields reach the same limit.
        let manyFields = Array("POST / HTTP/1.1\r\n".utf8) + Array(repeating: Array("X-A: b\r\n".utf8), count: limit / 8).flatMap { $0 }
        let fieldsOutcome = feedByteByByte(manyFields, into: reassembler())
        #expect(fieldsOutcome.failure?.error.code == .frameTooLarge)
        #expect(fieldsOutcome.failure?.byteCount == limit)
    }

    @Test func headerBlockOneByteOverASmallLimitIsRefused() throws {
        let prefix = "POST / HTTP/1.1\r\nX-Pad: "
        let limit = 100
        let text = prefix + String(repeating: "a", count: limit - prefix.utf8.count - 3) + "\r\n\r\n"
        let outcome = feedByteByByte(Array(text.utf8), into: reassembler(maximumHeaderLength: limit))
        #expect(outcome.failure?.error.code == .frameTooLarge)
        #expect(outcome.failure?.byteCount == limit)
    }

    func expectEveryChunkingDecodes(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let bytes = Array(text.utf8)
        let expected = try decode(text)
        for split in 1..<bytes.count {
            let reassembler = reassembler()
            reassembler.append(Array(bytes[..<split]))
            var frames = try reassembler.drain()
            reassembler.append(Array(bytes[split...]))
            frames += try reassembler.drain()
            #expect(frames == expected, "split at \(split)", sourceLocation: sourceLocation)
        }
    }
}
