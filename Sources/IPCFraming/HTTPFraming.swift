public import IPCCore
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// HTTP/1.1 framing: each frame is one HTTP/1.1 message whose body is the payload, so that a stock
/// HTTP client can talk to an endpoint. `docs/WIRE-FORMAT.md` is the specification:
///
///     POST /ipc HTTP/1.1            .message, .request      HTTP/1.1 200 OK          .reply
///     Host: ipcbench                                        (500 Internal Server Error for .failure)
///     Content-Length: 5                                     Content-Length: 5
///     IPC-Kind: request                                     IPC-Kind: reply
///     IPC-Msgid: 7                                          IPC-Msgid: 7
///     IPC-Correlation: 42                                   IPC-Correlation: 42
///     (empty line, then 5 payload bytes)                    (empty line, then 5 payload bytes)
public enum HTTPWireFormat {
    /// The header block limit a decoder uses unless told otherwise.
    public static let defaultMaximumHeaderLength = 16 * 1024
}

/// Writes frame headers as HTTP/1.1 messages: `.message` and `.request` as `POST /ipc` requests,
/// `.reply` as a `200 OK` response and `.failure` as a `500 Internal Server Error` response, each
/// with `Content-Length`, `IPC-Kind`, `IPC-Msgid` and `IPC-Correlation` fields.
///
/// LLBSD-compatible (``llbsdCompatible``): a `.message` is written as an LLBSDMessaging peer
/// writes every message, a `HTTP/1.1 200 OK` response with `Content-Length`, and without
/// `IPC-Kind` (it keeps `IPC-Msgid` and `IPC-Correlation`, which such a peer ignores), so that it
/// can read it. The other kinds are written as usual.
public struct HTTPFrameEncoder: FrameEncoder {
    public var maximumPayloadLength: Int
    public var llbsdCompatible: Bool

    public init(maximumPayloadLength: Int, llbsdCompatible: Bool = false) {
        self.maximumPayloadLength = maximumPayloadLength
        self.llbsdCompatible = llbsdCompatible
    }

    /// - Throws: ``IPCError/Code/payloadTooLarge`` if the payload length is negative or above
    ///   ``maximumPayloadLength``.
    public func encodeHeader(_ header: FrameHeader, into buffer: inout [UInt8]) throws {
        let layout = try self.layout(header)
        // The buffer grows once, by the header's exact length, and the header is written
        // straight into it (appending piece by piece grew it several times per frame).
        let start = buffer.count
        buffer.append(contentsOf: repeatElement(0, count: layout.length))
        buffer.withUnsafeMutableBytes { raw in
            var cursor = raw.baseAddress! + start
            layout.write(header, at: &cursor)
        }
    }

    /// The length ``encodeHeader(_:into:)`` appends for `header`, computed without encoding it.
    /// - Throws: as ``encodeHeader(_:into:)``.
    public func encodedHeaderLength(_ header: FrameHeader) throws -> Int {
        try layout(header).length
    }

    /// Which lines a header has and its length on the wire.
    private func layout(_ header: FrameHeader) throws -> Layout {
        guard header.payloadLength >= 0, header.payloadLength <= maximumPayloadLength else {
            throw IPCError(code: .payloadTooLarge, message: "payload of \(header.payloadLength) bytes is outside 0...\(maximumPayloadLength)")
        }
        let llbsdMessage = llbsdCompatible && header.kind == .message
        let startLine: StaticString
        switch header.kind {
        case .message where llbsdMessage: startLine = HTTPHeaderText.okStatusLine
        case .message, .request: startLine = HTTPHeaderText.requestLines
        case .reply: startLine = HTTPHeaderText.okStatusLine
        case .failure: startLine = HTTPHeaderText.failureStatusLine
        }
        var length = startLine.utf8CodeUnitCount
            + HTTPHeaderText.contentLength.utf8CodeUnitCount + decimalDigits(UInt64(header.payloadLength))
            + HTTPHeaderText.msgid.utf8CodeUnitCount + decimalDigits(UInt64(header.msgid))
            + HTTPHeaderText.correlation.utf8CodeUnitCount + decimalDigits(header.correlation)
            + HTTPHeaderText.end.utf8CodeUnitCount
        if !llbsdMessage {
            length += HTTPHeaderText.kind.utf8CodeUnitCount + header.kind.httpToken.utf8CodeUnitCount
        }
        return Layout(startLine: startLine, writesKind: !llbsdMessage, length: length)
    }

    private struct Layout {
        let startLine: StaticString
        let writesKind: Bool
        let length: Int

        /// Writes the header's `length` bytes at `cursor` and advances it past them.
        func write(_ header: FrameHeader, at cursor: inout UnsafeMutableRawPointer) {
            put(startLine, at: &cursor)
            put(HTTPHeaderText.contentLength, at: &cursor)
            putDecimal(UInt64(header.payloadLength), at: &cursor)
            if writesKind {
                put(HTTPHeaderText.kind, at: &cursor)
                put(header.kind.httpToken, at: &cursor)
            }
            put(HTTPHeaderText.msgid, at: &cursor)
            putDecimal(UInt64(header.msgid), at: &cursor)
            put(HTTPHeaderText.correlation, at: &cursor)
            putDecimal(header.correlation, at: &cursor)
            put(HTTPHeaderText.end, at: &cursor)
        }
    }
}

/// The fixed text of the headers ``HTTPFrameEncoder`` writes, in order: a start line (with `Host`
/// for a request), then `Content-Length`, `IPC-Kind` (not in an LLBSD message), `IPC-Msgid`,
/// `IPC-Correlation`, each value followed by the next field's CRLF, and the empty line.
enum HTTPHeaderText {
    static let requestLines: StaticString = "POST /ipc HTTP/1.1\r\nHost: ipcbench\r\n"
    static let okStatusLine: StaticString = "HTTP/1.1 200 OK\r\n"
    static let failureStatusLine: StaticString = "HTTP/1.1 500 Internal Server Error\r\n"
    static let contentLength: StaticString = "Content-Length: "
    static let kind: StaticString = "\r\nIPC-Kind: "
    static let msgid: StaticString = "\r\nIPC-Msgid: "
    static let correlation: StaticString = "\r\nIPC-Correlation: "
    static let end: StaticString = "\r\n\r\n"
}

@inline(__always)
private func put(_ text: StaticString, at cursor: inout UnsafeMutableRawPointer) {
    let count = text.utf8CodeUnitCount
    cursor.copyMemory(from: text.utf8Start, byteCount: count)
    cursor += count
}

/// The number of decimal digits of `value` (1 for 0).
private func decimalDigits(_ value: UInt64) -> Int {
    var count = 1
    var rest = value
    while rest >= 10 {
        rest /= 10
        count += 1
    }
    return count
}

/// Writes `value` in decimal, without leading zeros, and advances `cursor` past it.
private func putDecimal(_ value: UInt64, at cursor: inout UnsafeMutableRawPointer) {
    let count = decimalDigits(value)
    var rest = value
    for offset in stride(from: count - 1, through: 0, by: -1) {
        cursor.storeBytes(of: ASCII.zero + UInt8(rest % 10), toByteOffset: offset, as: UInt8.self)
        rest /= 10
    }
    cursor += count
}

/// Decodes HTTP/1.1 messages into frames, strictly: anything that two HTTP parsers could read
/// differently is refused rather than guessed at.
///
/// A request (`method SP request-target SP HTTP/1.1`) is a `.request`, or a `.message` if its
/// `IPC-Kind` says so; a response (`HTTP/1.1 SP 3DIGIT SP reason`) is a `.reply` for 2xx and a
/// `.failure` otherwise. `IPC-Msgid` and `IPC-Correlation` default to 0; method, target, reason
/// and unknown header fields are ignored.
///
/// LLBSD-compatible (``llbsdCompatible``): a response without `IPC-Kind` is a `.message`, as an
/// LLBSDMessaging peer means every frame it writes (a `200` response with `Content-Length` and a
/// body); without `IPC-Kind` a response must then be 2xx (an LLBSD peer writes nothing else).
///
/// Each call resumes the scan where the previous one stopped and each line is parsed once, when its
/// CRLF arrives, so a header fed one byte at a time costs linear time, and a bad byte or line is
/// refused as soon as it arrives.
///
/// Errors (all final):
/// - ``IPCError/Code/malformedFrame``: a line not ending in CRLF, a control character (NUL
///   included) in the header block, obs-fold, a start line or header field that does not parse, an
///   HTTP version other than 1.1, a status outside 100...599, more than one `Content-Length` (even
///   if equal) or `IPC-*` field, a `Content-Length` that is not digits or does not fit in `Int`,
///   an `IPC-Msgid` or `IPC-Correlation` that is not a decimal of 32 or 64 bits, an `IPC-Kind` that
///   is unknown or contradicts the start line, a response without `Content-Length`; in LLBSD mode,
///   a non-2xx response without `IPC-Kind`.
/// - ``IPCError/Code/unsupportedFraming``: `Transfer-Encoding` (any value), or a 1xx interim response.
/// - ``IPCError/Code/frameTooLarge``: a `Content-Length` above ``maximumPayloadLength`` (before any
///   of the body is buffered), or ``maximumHeaderLength`` bytes without the end of the header block.
public struct HTTPFrameDecoder: FrameDecoder {
    public var maximumPayloadLength: Int
    /// The longest header block accepted, from the first byte of the start line through the empty
    /// line that ends it.
    public var maximumHeaderLength: Int

    /// Whether a response without `IPC-Kind` is a one-way message (see the type's notes).
    public let llbsdCompatible: Bool

    private var head: Head

    public init(maximumPayloadLength: Int, maximumHeaderLength: Int = HTTPWireFormat.defaultMaximumHeaderLength, llbsdCompatible: Bool = false) {
        self.maximumPayloadLength = maximumPayloadLength
        self.maximumHeaderLength = maximumHeaderLength
        self.llbsdCompatible = llbsdCompatible
        head = Head(llbsdCompatible: llbsdCompatible)
    }

    /// - Throws: the errors listed on the type.
    public mutating func decode(_ bytes: UnsafeRawBufferPointer) throws -> DecodeStep {
        switch try inPlace(bytes) {
        case .frame(let header, let headerLength):
            let total = headerLength + header.payloadLength
            return .frame(
                Frame(
                    kind: header.kind, msgid: header.msgid, correlation: header.correlation,
                    payload: Array(UnsafeRawBufferPointer(rebasing: bytes[headerLength..<total]))
                ),
                consumed: total
            )
        case .needMoreBytes(let atLeast):
            return .needMoreBytes(atLeast: atLeast)
        }
    }

    /// - Throws: the errors listed on the type.
    public mutating func decodeInPlace(_ bytes: UnsafeRawBufferPointer) throws -> InPlaceDecodeStep? {
        try inPlace(bytes)
    }

    /// The head at the front of `bytes` and its length, once the whole head is there (the body
    /// need not be), for a reassembler that gathers the body itself; `nil` while the head is
    /// incomplete. What has arrived is scanned once, whether this or ``decode(_:)`` looks at it
    /// next. A caller that consumes the frame itself calls ``forgetFrame()``.
    /// - Throws: the errors listed on the type, as ``decode(_:)`` throws them.
    public mutating func decodeHeader(_ bytes: UnsafeRawBufferPointer) throws -> (header: FrameHeader, headerLength: Int)? {
        guard let (headLength, bodyLength) = try scannedHead(bytes) else { return nil }
        return (header(bodyLength: bodyLength), headLength)
    }

    /// Forgets the head read: the caller consumed its frame (``decodeHeader(_:)``).
    public mutating func forgetFrame() {
        head = Head(llbsdCompatible: llbsdCompatible)
    }

    private mutating func inPlace(_ bytes: UnsafeRawBufferPointer) throws -> InPlaceDecodeStep {
        guard let (headLength, bodyLength) = try scannedHead(bytes) else {
            return .needMoreBytes(atLeast: bytes.count + 1)
        }
        let total = headLength + bodyLength
        guard bytes.count >= total else {
            return .needMoreBytes(atLeast: total)
        }
        let header = header(bodyLength: bodyLength)
        forgetFrame()
        return .frame(header, headerLength: headLength)
    }

    /// The frame header the head read says.
    @inline(__always)
    private func header(bodyLength: Int) -> FrameHeader {
        FrameHeader(kind: head.kind, msgid: head.msgid ?? 0, correlation: head.correlation ?? 0, payloadLength: bodyLength)
    }

    /// Reads the head at the front of `bytes` as far as it has arrived: its length and the
    /// body's once it has ended, else `nil`.
    /// - Throws: the errors listed on the type; ``IPCError/Code/frameTooLarge`` once
    ///   ``maximumHeaderLength`` bytes hold no end of the head.
    @inline(__always)
    private mutating func scannedHead(_ bytes: UnsafeRawBufferPointer) throws -> (headLength: Int, bodyLength: Int)? {
        if head.end == nil {
            // A head laid out as this package's encoder writes them (see `canonicalHead`), all
            // here at the first look, is read in one pass; anything else, or a head that arrives
            // in parts, is scanned.
            if head.scanIndex == 0, let canonical = canonicalHead(bytes) {
                head = canonical
            } else {
                try scanHead(bytes)
            }
        }
        guard let end = head.end else {
            guard bytes.count < maximumHeaderLength else {
                throw IPCError(code: .frameTooLarge, message: "no end of the header block within \(maximumHeaderLength) bytes")
            }
            return nil
        }
        return end
    }

    /// The head at the front of `bytes` if it is laid out as ``HTTPFrameEncoder`` writes heads
    /// (the fixed text of ``HTTPHeaderText``, in its order; WIRE-FORMAT 3.1, and 3.7's LLBSD
    /// message), with any digits in its numbers and `IPC-Kind` optional, and is whole within
    /// ``maximumHeaderLength``: read as ``scanHead(_:)`` would read it. `nil` for any other bytes,
    /// including every head ``scanHead(_:)`` would refuse, which it then reads (and refuses) from
    /// the start. Such a head has no byte ``scanHead(_:)`` checks for (control bytes, bare LF,
    /// folding) and each field once; what is left to check here is each value, as
    /// ``Head/parseLine(_:maximumPayloadLength:)`` does. Like ``scanHead(_:)``, it never examines
    /// a byte past ``maximumHeaderLength``.
    private func canonicalHead(_ whole: UnsafeRawBufferPointer) -> Head? {
        let bytes = UnsafeRawBufferPointer(rebasing: whole[..<min(whole.count, max(0, maximumHeaderLength))])
        var cursor = 0
        var parsed = Head(llbsdCompatible: llbsdCompatible)
        if skip(HTTPHeaderText.requestLines, in: bytes, at: &cursor) {
            parsed.startLine = .request
        } else if skip(HTTPHeaderText.okStatusLine, in: bytes, at: &cursor) {
            parsed.startLine = .response(status: 200)
        } else if skip(HTTPHeaderText.failureStatusLine, in: bytes, at: &cursor) {
            parsed.startLine = .response(status: 500)
        } else {
            return nil
        }
        guard skip(HTTPHeaderText.contentLength, in: bytes, at: &cursor),
            let digits = decimal(in: bytes, at: &cursor, as: UInt64.self), let length = Int(exactly: digits), length >= 0, length <= maximumPayloadLength
        else { return nil }
        parsed.contentLength = length
        if skip(HTTPHeaderText.kind, in: bytes, at: &cursor) {
            let tokenStart = cursor
            while cursor < bytes.count, bytes[cursor] != ASCII.cr { cursor += 1 }
            guard let kind = Frame.Kind(httpToken: bytes[tokenStart..<cursor]), parsed.allows(kind) else { return nil }
            parsed.ipcKind = kind
        }
        guard skip(HTTPHeaderText.msgid, in: bytes, at: &cursor), let msgid = decimal(in: bytes, at: &cursor, as: UInt32.self),
            skip(HTTPHeaderText.correlation, in: bytes, at: &cursor), let correlation = decimal(in: bytes, at: &cursor, as: UInt64.self),
            skip(HTTPHeaderText.end, in: bytes, at: &cursor)
        else { return nil }
        if llbsdCompatible, parsed.ipcKind == nil, case .response(let status) = parsed.startLine, !(200...299).contains(status) {
            return nil
        }
        parsed.msgid = msgid
        parsed.correlation = correlation
        parsed.lineStart = cursor
        parsed.scanIndex = cursor
        parsed.end = (cursor, length)
        return parsed
    }

    /// The length of the head at the front of `bytes` if ``canonicalHead(_:)`` reads it (for tests).
    func canonicalHeadLength(_ bytes: UnsafeRawBufferPointer) -> Int? {
        canonicalHead(bytes)?.end?.headLength
    }

    /// Examines the bytes not examined by earlier calls and parses each line when its CRLF arrives.
    private mutating func scanHead(_ bytes: UnsafeRawBufferPointer) throws {
        // Bytes past the limit are never examined: a head that has not ended by then is refused.
        let end = min(bytes.count, maximumHeaderLength)
        var index = head.scanIndex
        defer { head.scanIndex = index }
        while index < end {
            let byte = bytes[index]
            // The usual byte (visible ASCII, or obs-text above it) needs no decision: one
            // comparison each, then the rare ones below.
            if byte > ASCII.space, byte != ASCII.delete {
                index += 1
                continue
            }
            if byte == ASCII.cr {
                guard index + 1 < end else { return }
                guard bytes[index + 1] == ASCII.lf else {
                    throw malformed("CR not followed by LF at offset \(index)")
                }
                let line = bytes[head.lineStart..<index]
                index += 2
                head.lineStart = index
                if try head.parseLine(line, maximumPayloadLength: maximumPayloadLength) {
                    head.end = (index, head.contentLength ?? 0)
                    return
                }
            } else if byte == ASCII.lf {
                throw malformed("bare LF at offset \(index); lines must end in CRLF")
            } else if index == head.lineStart, byte == ASCII.space || byte == ASCII.tab {
                throw malformed(
                    head.startLine == nil
                        ? "whitespace before the start line"
                        : "header line folded onto the previous one (obs-fold) at offset \(index)"
                )
            } else if (byte < ASCII.space && byte != ASCII.tab) || byte == ASCII.delete {
                throw malformed("control byte 0x\(hex([byte])) at offset \(index) in the header block")
            } else {
                index += 1
            }
        }
    }
}

/// What the decoder has learned about the message whose header block it is reading.
private struct Head {
    enum StartLine {
        case request
        case response(status: Int)
    }

    /// A response without `IPC-Kind` is a message (LLBSD mode).
    let llbsdCompatible: Bool
    /// Offset of the first byte of the line being read.
    var lineStart = 0
    /// Offset of the first byte not yet examined.
    var scanIndex = 0
    var startLine: StartLine?
    var ipcKind: Frame.Kind?
    var msgid: UInt32?
    var correlation: UInt64?
    var contentLength: Int?
    /// Set once the empty line is read: the header block's length and the body's.
    var end: (headLength: Int, bodyLength: Int)?

    /// The frame kind, from `IPC-Kind` or else from the start line.
    var kind: Frame.Kind {
        if let ipcKind { return ipcKind }
        switch startLine {
        case .response where llbsdCompatible: return .message
        case .response(let status): return (200...299).contains(status) ? .reply : .failure
        case .request, nil: return .request
        }
    }

    /// Parses one line, without its CRLF. Returns `true` for the empty line that ends the head.
    mutating func parseLine(_ line: Slice<UnsafeRawBufferPointer>, maximumPayloadLength: Int) throws -> Bool {
        guard startLine != nil else {
            startLine = try Self.parseStartLine(line)
            return false
        }
        guard !line.isEmpty else {
            if case .response(let status) = startLine {
                if contentLength == nil { throw malformed("response without Content-Length") }
                if llbsdCompatible, ipcKind == nil, !(200...299).contains(status) {
                    throw malformed("LLBSD mode: a response without IPC-Kind (a message) has status \(status), not 2xx")
                }
            }
            return true
        }
        try parseField(line, maximumPayloadLength: maximumPayloadLength)
        return false
    }

    private static func parseStartLine(_ line: Slice<UnsafeRawBufferPointer>) throws -> StartLine {
        guard let firstSpace = line.firstIndex(of: ASCII.space) else {
            throw malformed("start line \(quoted(line)) is neither a request line nor a status line")
        }
        let first = line[..<firstSpace]
        let rest = line[(firstSpace + 1)...]
        if first.count >= 5, spells(first.prefix(5), "HTTP/") {
            try requireVersion(first)
            // status-code SP reason-phrase; the reason may be empty but its SP may not.
            guard rest.count >= 4, rest.prefix(3).allSatisfy(isDigit), rest[rest.startIndex + 3] == ASCII.space else {
                throw malformed("status line \(quoted(line)) lacks a 3-digit status code followed by SP")
            }
            let status = rest.prefix(3).reduce(0) { $0 * 10 + Int($1 - ASCII.zero) }
            guard (100...599).contains(status) else {
                throw malformed("status code \(status) is outside 100...599")
            }
            guard status >= 200 else {
                throw IPCError(code: .unsupportedFraming, message: "interim (1xx) response \(status) is not supported")
            }
            return .response(status: status)
        }
        guard !first.isEmpty, first.allSatisfy(isTokenByte) else {
            throw malformed("request method \(quoted(first)) is not a token")
        }
        guard let secondSpace = rest.firstIndex(of: ASCII.space) else {
            throw malformed("request line \(quoted(line)) lacks an HTTP version")
        }
        let target = rest[..<secondSpace]
        guard !target.isEmpty, target.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            throw malformed("request target \(quoted(target)) is empty or has bytes outside visible ASCII")
        }
        try requireVersion(rest[(secondSpace + 1)...])
        return .request
    }

    private static func requireVersion(_ version: Slice<UnsafeRawBufferPointer>) throws {
        guard spells(version, "HTTP/1.1") else {
            throw malformed("HTTP version \(quoted(version)) is not supported; only HTTP/1.1 is")
        }
    }

    private mutating func parseField(_ line: Slice<UnsafeRawBufferPointer>, maximumPayloadLength: Int) throws {
        // One pass over the name, which ends at the first ':' and must be a token (so no
        // whitespace before the colon, RFC 9112 5.1). Indices into the line's buffer, which
        // the scan has already bounded: no slice operations on the hot path.
        let bytes = line.base
        var colon = line.startIndex
        // Bit 0 stays set while every byte is a token byte: no branch per byte.
        var nameIsToken: UInt8 = 1
        while colon < line.endIndex, bytes[colon] != ASCII.colon {
            nameIsToken &= tokenBit(bytes[colon])
            colon += 1
        }
        guard colon < line.endIndex else {
            throw malformed("header line \(quoted(line)) has no ':'")
        }
        let name = line[..<colon]
        guard colon > line.startIndex, nameIsToken == 1 else {
            throw malformed("header name \(quoted(name)) is not a token")
        }
        var valueStart = colon + 1
        var valueEnd = line.endIndex
        while valueStart < valueEnd, bytes[valueStart] == ASCII.space || bytes[valueStart] == ASCII.tab { valueStart += 1 }
        while valueEnd > valueStart, bytes[valueEnd - 1] == ASCII.space || bytes[valueEnd - 1] == ASCII.tab { valueEnd -= 1 }
        let value = line[valueStart..<valueEnd]

        // The fields this decoder reads differ in length: one comparison picks the candidate.
        let field: KnownField?
        switch name.count {
        case 14: field = matches(name, lowercased: "content-length") ? .contentLength : nil
        case 17: field = matches(name, lowercased: "transfer-encoding") ? .transferEncoding : nil
        case 8: field = matches(name, lowercased: "ipc-kind") ? .ipcKind : nil
        case 9: field = matches(name, lowercased: "ipc-msgid") ? .ipcMsgid : nil
        case 15: field = matches(name, lowercased: "ipc-correlation") ? .ipcCorrelation : nil
        default: field = nil
        }
        guard let field else { return }

        switch field {
        case .contentLength:
            guard contentLength == nil else {
                throw malformed("more than one Content-Length")
            }
            guard let digits = parseDecimal(value, as: UInt64.self), let length = Int(exactly: digits) else {
                throw malformed("Content-Length \(quoted(value)) is not a decimal that fits in Int")
            }
            guard length <= maximumPayloadLength else {
                throw IPCError(code: .frameTooLarge, message: "Content-Length \(length) is above the maximum of \(maximumPayloadLength)")
            }
            contentLength = length
        case .transferEncoding:
            throw IPCError(code: .unsupportedFraming, message: "Transfer-Encoding \(quoted(value)) is not supported; use Content-Length")
        case .ipcKind:
            guard ipcKind == nil else { throw malformed("more than one IPC-Kind") }
            guard let kind = Frame.Kind(httpToken: value) else {
                throw malformed("unknown IPC-Kind \(quoted(value))")
            }
            guard allows(kind) else {
                throw malformed("IPC-Kind \(quoted(value)) contradicts the start line")
            }
            ipcKind = kind
        case .ipcMsgid:
            guard msgid == nil else { throw malformed("more than one IPC-Msgid") }
            guard let parsed = parseDecimal(value, as: UInt32.self) else {
                throw malformed("IPC-Msgid \(quoted(value)) is not a decimal in 0...\(UInt32.max)")
            }
            msgid = parsed
        case .ipcCorrelation:
            guard correlation == nil else { throw malformed("more than one IPC-Correlation") }
            guard let parsed = parseDecimal(value, as: UInt64.self) else {
                throw malformed("IPC-Correlation \(quoted(value)) is not a decimal in 0...\(UInt64.max)")
            }
            correlation = parsed
        }
    }

    /// Whether `IPC-Kind` may say `kind` after this start line: it may only refine what the
    /// start line says (request or response, and a response's status class).
    func allows(_ kind: Frame.Kind) -> Bool {
        switch startLine {
        case .response(let status): kind == ((200...299).contains(status) ? .reply : .failure)
        case .request, nil: kind == .message || kind == .request
        }
    }

    /// The header fields the decoder acts on; every other field is ignored.
    private enum KnownField {
        case contentLength, transferEncoding, ipcKind, ipcMsgid, ipcCorrelation
    }
}

private enum ASCII {
    static let tab: UInt8 = 0x09
    static let lf: UInt8 = 0x0A
    static let cr: UInt8 = 0x0D
    static let space: UInt8 = 0x20
    static let zero: UInt8 = 0x30
    static let colon: UInt8 = 0x3A
    static let delete: UInt8 = 0x7F
}

extension Frame.Kind {
    /// The value of the `IPC-Kind` field.
    fileprivate var httpToken: StaticString {
        switch self {
        case .message: "message"
        case .request: "request"
        case .reply: "reply"
        case .failure: "failure"
        }
    }

    /// The kind whose `IPC-Kind` value `value` is exactly (case matters), or `nil`.
    fileprivate init?(httpToken value: Slice<UnsafeRawBufferPointer>) {
        if spells(value, Self.message.httpToken) {
            self = .message
        } else if spells(value, Self.request.httpToken) {
            self = .request
        } else if spells(value, Self.reply.httpToken) {
            self = .reply
        } else if spells(value, Self.failure.httpToken) {
            self = .failure
        } else {
            return nil
        }
    }
}

private func malformed(_ message: String) -> IPCError {
    IPCError(code: .malformedFrame, message: message)
}

private func isDigit(_ byte: UInt8) -> Bool {
    byte >= ASCII.zero && byte <= ASCII.zero + 9
}

/// `tchar` of RFC 9110 5.6.2: letters, digits and fifteen punctuation characters.
private func isTokenByte(_ byte: UInt8) -> Bool {
    tokenBit(byte) == 1
}

/// 1 if `byte` is a `tchar`, else 0.
@inline(__always)
private func tokenBit(_ byte: UInt8) -> UInt8 {
    // One bit per byte value below 128, in two words: a shift and a test instead of a
    // chain of comparisons (a header line's name is checked byte by byte).
    let word = byte < 64 ? TokenBytes.low : TokenBytes.high
    let inRange: UInt8 = byte < 128 ? 1 : 0
    return UInt8(truncatingIfNeeded: word >> UInt64(byte & 63)) & inRange
}

private enum TokenBytes {
    /// Bits 0-63: the digits and ! # $ % & ' * + - .
    static let low: UInt64 = 0x03FF_6CFA_0000_0000
    /// Bits 64-127: the letters and ^ _ ` | ~
    static let high: UInt64 = 0x57FF_FFFF_C7FF_FFFE
}

/// Whether `bytes` spell `name` (given in lower case) ignoring ASCII case, as field names compare.
/// `bytes` must be a token and `name` small letters, digits and `-`: then setting bit 5 of each
/// byte (`| 0x20`) folds a capital to its small letter and changes no byte that could match
/// otherwise (the only other bytes it maps onto `-` or a digit are control bytes, not token bytes).
@inline(__always)
private func matches(_ bytes: Slice<UnsafeRawBufferPointer>, lowercased name: StaticString) -> Bool {
    let count = bytes.count
    guard count == name.utf8CodeUnitCount else { return false }
    let expected = name.utf8Start
    let base = bytes.base
    let start = bytes.startIndex
    var differences: UInt8 = 0
    for offset in 0..<count {
        differences |= (base[start + offset] | 0x20) ^ expected[offset]
    }
    return differences == 0
}

/// Whether `bytes` are exactly `text`. Lengths first: most candidates differ in length.
@inline(__always)
private func spells(_ bytes: Slice<UnsafeRawBufferPointer>, _ text: StaticString) -> Bool {
    let count = bytes.count
    guard count == text.utf8CodeUnitCount else { return false }
    let expected = text.utf8Start
    let base = bytes.base
    let start = bytes.startIndex
    for offset in 0..<count where base[start + offset] != expected[offset] {
        return false
    }
    return true
}

/// One or more ASCII digits whose value fits in `T`; `nil` for anything else (sign, space, empty).
private func parseDecimal<T: FixedWidthInteger & UnsignedInteger>(_ bytes: Slice<UnsafeRawBufferPointer>, as: T.Type) -> T? {
    guard !bytes.isEmpty else { return nil }
    var value: T = 0
    let base = bytes.base
    for index in bytes.startIndex..<bytes.endIndex {
        let byte = base[index]
        guard isDigit(byte) else { return nil }
        let (shifted, overflow) = value.multipliedReportingOverflow(by: 10)
        let (sum, carry) = shifted.addingReportingOverflow(T(byte - ASCII.zero))
        guard !overflow, !carry else { return nil }
        value = sum
    }
    return value
}

/// Whether `text` is at `cursor` in `bytes`; if it is, moves `cursor` past it.
@inline(__always)
private func skip(_ text: StaticString, in bytes: UnsafeRawBufferPointer, at cursor: inout Int) -> Bool {
    let count = text.utf8CodeUnitCount
    guard bytes.count - cursor >= count, memcmp(bytes.baseAddress! + cursor, text.utf8Start, count) == 0 else { return false }
    cursor += count
    return true
}

/// The digits at `cursor` as a value of `T` (see ``parseDecimal(_:as:)``), moving `cursor` past
/// them; `nil` if there are none or they do not fit.
@inline(__always)
private func decimal<T: FixedWidthInteger & UnsignedInteger>(in bytes: UnsafeRawBufferPointer, at cursor: inout Int, as type: T.Type) -> T? {
    let start = cursor
    while cursor < bytes.count, isDigit(bytes[cursor]) { cursor += 1 }
    return parseDecimal(bytes[start..<cursor], as: type)
}

/// Header bytes quoted for an error message, cut short so a hostile header cannot bloat it.
private func quoted(_ bytes: Slice<UnsafeRawBufferPointer>) -> String {
    let limit = 64
    let text = String(decoding: bytes.prefix(limit), as: UTF8.self).debugDescription
    return bytes.count > limit ? text + "..." : text
}
