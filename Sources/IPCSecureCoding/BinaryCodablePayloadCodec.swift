import Foundation
import IPCCore

/// A compact binary encoding of `Codable` messages, written and read by this module's own
/// `Encoder` and `Decoder` (`docs/WIRE-FORMAT.md`, section 4): the magic bytes, the type name,
/// then the value, every value tagged and every composite value prefixed with its length.
///
/// Decoding reads in place, without a tree or a pre-scan: the type name is looked up on the
/// allow-list before any of the value is read, the nesting limit is checked as each container
/// opens, and every length and count is bounded by the bytes that remain. Keys are expected in the
/// order they were encoded, and found by a scan of the container when they are not.
public struct BinaryCodablePayloadCodec: PayloadCodec {
    public init() {}

    public var name: String { "binaryCodable" }

    /// - Throws: ``IPCError/Code/unsupportedOperation`` if `message` is not a ``CodableMessage``;
    ///   ``IPCError/Code/malformedPayload`` if the message's `encode(to:)` throws.
    public func encode(_ message: some SecureMessage) throws -> [UInt8] {
        try MessageEnvelope.encode(message, format: Self.format) { envelope in
            Data(try BinaryCodableEncoding.encodePayload(envelope))
        }
    }

    /// - Throws: as ``PayloadCodec/decode(_:allowing:limits:)``.
    public func decode(_ bytes: [UInt8], allowing allowList: AllowList, limits: DecodingLimits) throws -> any SecureMessage {
        try limits.checkLength(bytes.count)
        return try MessageEnvelope.decode(format: Self.format) {
            MessageEnvelope(
                try bytes.withUnsafeBufferPointer { buffer in
                    try BinaryCodableReader.decodePayload(buffer, allowing: allowList, maximumDepth: limits.maximumDepth)
                }
            )
        }
    }

    private static let format = "binary Codable"
}

extension PayloadCodec where Self == BinaryCodablePayloadCodec {
    /// Binary `Codable` payloads, the fastest to decode.
    public static var binaryCodable: BinaryCodablePayloadCodec { BinaryCodablePayloadCodec() }
}
