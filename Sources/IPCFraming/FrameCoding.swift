public import IPCCore

/// The outcome of one decode attempt.
public enum DecodeStep: Sendable, Equatable {
    /// A whole frame was decoded from the first `consumed` bytes.
    case frame(Frame, consumed: Int)
    /// More bytes are needed. `atLeast` is the total number of bytes (from the start of the
    /// frame) that the next attempt needs, when the decoder knows it; a reader may use it to
    /// size its buffer, and the decoder has already checked it against its maximum.
    case needMoreBytes(atLeast: Int)
}

/// The outcome of one decode attempt that leaves the payload where it is
/// (``FrameDecoder/decodeInPlace(_:)``).
public enum InPlaceDecodeStep: Sendable, Equatable {
    /// A whole frame is at the front of the bytes: its header, then its payload at
    /// `headerLength ..< headerLength + header.payloadLength`; the frame takes
    /// `headerLength + header.payloadLength` bytes.
    case frame(FrameHeader, headerLength: Int)
    /// As ``DecodeStep/needMoreBytes(atLeast:)``.
    case needMoreBytes(atLeast: Int)
}

/// Writes frame headers. The payload follows the header unchanged on the wire, so a transport
/// can send header and payload with one gathering write and never copy the payload.
public protocol FrameEncoder: Sendable {
    /// Appends the encoded header for a payload of `header.payloadLength` bytes.
    /// - Throws: ``IPCError/Code/payloadTooLarge`` if the length is above the encoder's maximum.
    func encodeHeader(_ header: FrameHeader, into buffer: inout [UInt8]) throws

    /// Calls `body` with the encoded header. An encoder whose header has a fixed size builds it
    /// on the stack (no allocation per frame); the default builds an array.
    func withEncodedHeader<R>(_ header: FrameHeader, _ body: (UnsafeRawBufferPointer) throws -> R) throws -> R

    /// The number of bytes ``encodeHeader(_:into:)`` appends for `header`, for a sender that
    /// needs a frame's length before it writes it; the default encodes the header to count it.
    /// - Throws: as ``encodeHeader(_:into:)``.
    func encodedHeaderLength(_ header: FrameHeader) throws -> Int
}

extension FrameEncoder {
    public func withEncodedHeader<R>(_ header: FrameHeader, _ body: (UnsafeRawBufferPointer) throws -> R) throws -> R {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(160)
        try encodeHeader(header, into: &bytes)
        return try bytes.withUnsafeBytes(body)
    }

    public func encodedHeaderLength(_ header: FrameHeader) throws -> Int {
        try withEncodedHeader(header) { $0.count }
    }

    /// The whole frame, header then payload, as one array.
    public func encode(_ frame: Frame) throws -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(frame.payload.count + 128)
        try encodeHeader(FrameHeader(frame), into: &bytes)
        bytes.append(contentsOf: frame.payload)
        return bytes
    }
}

/// Decodes frames from the front of a byte stream, one at a time.
///
/// The contract follows swift-nio's `ByteToMessageDecoder`: given the unconsumed bytes, return a
/// frame and how many bytes it used, or say that more bytes are needed. A decoder may keep state
/// between calls (how far it has scanned) as long as it is given the same unconsumed bytes, with
/// more appended, until it returns a frame (or until ``forgetFrame()``). Errors are final: the
/// stream cannot be resynchronised, and the caller stops at the first (a decoder that keeps state
/// may have read past the bytes it refused). Errors are ``IPCError``s; ``FrameReassembler``
/// reports any other as ``IPCError/Code/malformedFrame``.
public protocol FrameDecoder {
    /// The largest payload this decoder accepts. A header announcing more is refused with
    /// ``IPCError/Code/frameTooLarge`` before any of the payload is buffered.
    var maximumPayloadLength: Int { get }

    mutating func decode(_ bytes: UnsafeRawBufferPointer) throws -> DecodeStep

    /// The header at the front of `bytes` and its length on the wire, once it is all there, for a
    /// reassembler that gathers a large payload straight into the frame's own array instead of
    /// buffering it and copying it out. nil if more bytes are needed, or if this decoder does not
    /// offer it (the default). It makes the same checks as ``decode(_:)`` and throws the same
    /// errors, and may keep the same state (how far it has scanned), given the same unconsumed
    /// bytes with more appended, whichever of the two is called next. After a non-nil result the
    /// caller may consume the header and the payload itself, without calling ``decode(_:)`` for
    /// that frame, and then calls ``forgetFrame()``.
    mutating func decodeHeader(_ bytes: UnsafeRawBufferPointer) throws -> (header: FrameHeader, headerLength: Int)?

    /// The caller consumed the frame whose header ``decodeHeader(_:)`` returned itself: the next
    /// call decodes the next frame. The default does nothing (a decoder that keeps no state
    /// between calls).
    mutating func forgetFrame()

    /// ``decode(_:)`` without copying the payload out: where the next frame's payload lies in
    /// `bytes`, for a reassembler that lends payloads in place to a handler. The same checks,
    /// errors and state as ``decode(_:)``; after a `.frame` result the caller consumes the frame's
    /// bytes. nil if this decoder does not offer it (the default): the reassembler then uses
    /// ``decode(_:)``.
    mutating func decodeInPlace(_ bytes: UnsafeRawBufferPointer) throws -> InPlaceDecodeStep?
}

extension FrameDecoder {
    public mutating func decodeHeader(_ bytes: UnsafeRawBufferPointer) throws -> (header: FrameHeader, headerLength: Int)? {
        nil
    }

    public mutating func forgetFrame() {}

    public mutating func decodeInPlace(_ bytes: UnsafeRawBufferPointer) throws -> InPlaceDecodeStep? {
        nil
    }
}

/// The framings ipcbench implements.
public enum Framing: String, Sendable, Hashable, CaseIterable, Codable, CustomStringConvertible {
    /// A 20-byte binary header, then the payload. See `docs/WIRE-FORMAT.md`.
    case binary
    /// HTTP/1.1 messages with `Content-Length`, as LLBSDMessaging framed with CFHTTPMessage.
    case http
    /// ``http``, compatible with an LLBSDMessaging peer, which writes every message as a
    /// `HTTP/1.1 200` response with `Content-Length` and no `IPC-` fields: such a frame is a
    /// one-way message, and one-way messages are written that way. See `docs/WIRE-FORMAT.md`,
    /// section 3.7.
    case llbsd

    /// What the harness measures unless told otherwise (``llbsd`` costs what ``http`` does).
    public static let measuredByDefault: [Framing] = [.binary, .http]

    public var description: String { rawValue }

    public func makeEncoder(maximumPayloadLength: Int) -> any FrameEncoder {
        switch self {
        case .binary: BinaryFrameEncoder(maximumPayloadLength: maximumPayloadLength)
        case .http: HTTPFrameEncoder(maximumPayloadLength: maximumPayloadLength)
        case .llbsd: HTTPFrameEncoder(maximumPayloadLength: maximumPayloadLength, llbsdCompatible: true)
        }
    }

    public func makeReassembler(maximumPayloadLength: Int) -> any FrameReassembling {
        switch self {
        case .binary: FrameReassembler(decoder: BinaryFrameDecoder(maximumPayloadLength: maximumPayloadLength))
        case .http: FrameReassembler(decoder: HTTPFrameDecoder(maximumPayloadLength: maximumPayloadLength))
        case .llbsd: FrameReassembler(decoder: HTTPFrameDecoder(maximumPayloadLength: maximumPayloadLength, llbsdCompatible: true))
        }
    }
}

/// A transport that carries frames over a byte stream and lets its user pick the framing.
public protocol FramedTransport {
    var framing: Framing { get }
}
