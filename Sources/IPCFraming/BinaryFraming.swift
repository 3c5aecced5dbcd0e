public import IPCCore

/// The binary wire format, version 1. `docs/WIRE-FORMAT.md` is the specification:
///
///     offset size field
///     0      2    magic 0x49 0x50 ("IP")
///     2      1    version, 1
///     3      1    kind: 1 message, 2 request, 3 reply, 4 failure
///     4      4    msgid, unsigned, big-endian
///     8      8    correlation id, unsigned, big-endian
///     16     4    payload length in bytes, unsigned, big-endian
///     20     n    payload
public enum BinaryWireFormat {
    public static let magic: (UInt8, UInt8) = (0x49, 0x50)
    public static let version: UInt8 = 1
    public static let headerLength = 20
}

public struct BinaryFrameEncoder: FrameEncoder {
    public var maximumPayloadLength: Int

    public init(maximumPayloadLength: Int) {
        self.maximumPayloadLength = min(maximumPayloadLength, Int(UInt32.max))
    }

    /// - Throws: ``IPCError/Code/payloadTooLarge`` if the length is negative or above the maximum.
    @inlinable @inline(__always)
    func checkLength(_ header: FrameHeader) throws {
        guard header.payloadLength >= 0, header.payloadLength <= maximumPayloadLength else { throw lengthError(header) }
    }

    /// The error for a length ``checkLength(_:)`` refuses: out of line, so that the check
    /// inlined into every sender is a comparison and a branch.
    @usableFromInline
    func lengthError(_ header: FrameHeader) -> IPCError {
        IPCError(code: .payloadTooLarge, message: "payload of \(header.payloadLength) bytes is above the maximum of \(maximumPayloadLength)")
    }

    public func encodeHeader(_ header: FrameHeader, into buffer: inout [UInt8]) throws {
        try checkLength(header)
        buffer.append(BinaryWireFormat.magic.0)
        buffer.append(BinaryWireFormat.magic.1)
        buffer.append(BinaryWireFormat.version)
        buffer.append(header.kind.rawValue)
        appendBigEndian(header.msgid, to: &buffer)
        appendBigEndian(header.correlation, to: &buffer)
        appendBigEndian(UInt32(header.payloadLength), to: &buffer)
    }

    @inlinable @inline(__always)
    public func encodedHeaderLength(_ header: FrameHeader) throws -> Int {
        try checkLength(header)
        return BinaryWireFormat.headerLength
    }

    public func withEncodedHeader<R>(_ header: FrameHeader, _ body: (UnsafeRawBufferPointer) throws -> R) throws -> R {
        try checkLength(header)
        return try withUnsafeTemporaryAllocation(byteCount: BinaryWireFormat.headerLength, alignment: 8) { bytes in
            bytes[0] = BinaryWireFormat.magic.0
            bytes[1] = BinaryWireFormat.magic.1
            bytes[2] = BinaryWireFormat.version
            bytes[3] = header.kind.rawValue
            bytes.storeBytes(of: header.msgid.bigEndian, toByteOffset: 4, as: UInt32.self)
            bytes.storeBytes(of: header.correlation.bigEndian, toByteOffset: 8, as: UInt64.self)
            bytes.storeBytes(of: UInt32(header.payloadLength).bigEndian, toByteOffset: 16, as: UInt32.self)
            return try body(UnsafeRawBufferPointer(bytes))
        }
    }

    /// The header as a value on the stack: the same 20 bytes as ``withEncodedHeader(_:_:)``,
    /// through no generic code, for a sender that encodes every frame's header (the first of
    /// ``BinaryFrameHeaderBytes/count`` bytes of its storage are the header).
    /// - Throws: ``IPCError/Code/payloadTooLarge`` if the length is negative or above the maximum.
    @inlinable @inline(__always)
    public func headerBytes(_ header: FrameHeader) throws -> BinaryFrameHeaderBytes {
        try checkLength(header)
        var bytes = BinaryFrameHeaderBytes()
        withUnsafeMutableBytes(of: &bytes.storage) { raw in
            raw[0] = BinaryWireFormat.magic.0
            raw[1] = BinaryWireFormat.magic.1
            raw[2] = BinaryWireFormat.version
            raw[3] = header.kind.rawValue
            raw.storeBytes(of: header.msgid.bigEndian, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: header.correlation.bigEndian, toByteOffset: 8, as: UInt64.self)
            raw.storeBytes(of: UInt32(header.payloadLength).bigEndian, toByteOffset: 16, as: UInt32.self)
        }
        return bytes
    }

    private func appendBigEndian<T: FixedWidthInteger>(_ value: T, to buffer: inout [UInt8]) {
        withUnsafeBytes(of: value.bigEndian) { buffer.append(contentsOf: $0) }
    }
}

/// A binary frame header held by value (see ``BinaryFrameEncoder/headerBytes(_:)``).
public struct BinaryFrameHeaderBytes: Sendable {
    /// The header's length in bytes: the first `count` bytes of `storage`.
    public static let count = BinaryWireFormat.headerLength
    /// 24 bytes, aligned, of which the first 20 are the header.
    public var storage: (UInt64, UInt64, UInt64) = (0, 0, 0)

    @inlinable
    public init() {}
}

public struct BinaryFrameDecoder: FrameDecoder {
    public var maximumPayloadLength: Int

    public init(maximumPayloadLength: Int) {
        self.maximumPayloadLength = maximumPayloadLength
    }

    public mutating func decode(_ bytes: UnsafeRawBufferPointer) throws -> DecodeStep {
        switch try inPlace(bytes) {
        case .frame(let header, let headerLength):
            let total = headerLength + header.payloadLength
            // The payload's one copy, straight into the new array's storage. (This initializer is
            // specialized for UInt8 here; `init(unsafeUninitializedCapacity:)` looks up generic
            // metadata on every call, which costs more than a 64-byte frame's whole decode.)
            let payload = Array(UnsafeRawBufferPointer(rebasing: bytes[headerLength..<total]))
            return .frame(Frame(kind: header.kind, msgid: header.msgid, correlation: header.correlation, payload: payload), consumed: total)
        case .needMoreBytes(let atLeast):
            return .needMoreBytes(atLeast: atLeast)
        }
    }

    public mutating func decodeInPlace(_ bytes: UnsafeRawBufferPointer) throws -> InPlaceDecodeStep? {
        try inPlace(bytes)
    }

    @inline(__always)
    private func inPlace(_ bytes: UnsafeRawBufferPointer) throws -> InPlaceDecodeStep {
        guard let header = try header(bytes) else {
            return .needMoreBytes(atLeast: BinaryWireFormat.headerLength)
        }
        let total = BinaryWireFormat.headerLength + header.payloadLength
        guard bytes.count >= total else {
            return .needMoreBytes(atLeast: total)
        }
        return .frame(header, headerLength: BinaryWireFormat.headerLength)
    }

    public mutating func decodeHeader(_ bytes: UnsafeRawBufferPointer) throws -> (header: FrameHeader, headerLength: Int)? {
        try header(bytes).map { ($0, BinaryWireFormat.headerLength) }
    }

    /// The header at the front of `bytes`, or nil if it is not all there yet.
    @inline(__always)
    private func header(_ bytes: UnsafeRawBufferPointer) throws -> FrameHeader? {
        let headerLength = BinaryWireFormat.headerLength
        // The common case in one comparison: a whole header starting "IP", version 1, a known kind.
        if bytes.count >= headerLength {
            let prefix = bytes.loadUnaligned(as: UInt32.self).bigEndian
            if prefix & 0xFFFF_FF00 == 0x4950_0100, let kind = Frame.Kind(rawValue: UInt8(truncatingIfNeeded: prefix)) {
                return FrameHeader(
                    kind: kind,
                    msgid: bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self).bigEndian,
                    correlation: bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self).bigEndian,
                    payloadLength: try checkedLength(bytes)
                )
            }
        }
        // Check each header byte as soon as it is present, so garbage is refused at its first byte.
        if bytes.count >= 1, bytes[0] != BinaryWireFormat.magic.0 || (bytes.count >= 2 && bytes[1] != BinaryWireFormat.magic.1) {
            throw IPCError(code: .malformedFrame, message: "bad magic \(hex(bytes.prefix(2))); expected 49 50")
        }
        if bytes.count >= 3, bytes[2] != BinaryWireFormat.version {
            throw IPCError(code: .malformedFrame, message: "unsupported binary framing version \(bytes[2]); this decoder speaks version \(BinaryWireFormat.version)")
        }
        if bytes.count >= 4, Frame.Kind(rawValue: bytes[3]) == nil {
            throw IPCError(code: .malformedFrame, message: "unknown frame kind \(bytes[3])")
        }
        return nil
    }

    private func checkedLength(_ bytes: UnsafeRawBufferPointer) throws -> Int {
        let length = Int(bytes.loadUnaligned(fromByteOffset: 16, as: UInt32.self).bigEndian)
        guard length <= maximumPayloadLength else {
            throw IPCError(code: .frameTooLarge, message: "frame announces a payload of \(length) bytes, above the maximum of \(maximumPayloadLength)")
        }
        return length
    }
}

func hex(_ bytes: some Sequence<UInt8>) -> String {
    bytes.map { byte in
        let digits = Array("0123456789abcdef")
        return String([digits[Int(byte >> 4)], digits[Int(byte & 0xf)]])
    }.joined(separator: " ")
}
