import Foundation
import IPCCore

/// JSON through `JSONEncoder` and `JSONDecoder`: a ``MessageEnvelope``, `{"type": …, "value": …}`.
///
/// Before the decoder sees a payload, its length is checked and its nesting counted by a cheap
/// scan (``NestingScanner``); only UTF-8 is accepted.
public struct JSONPayloadCodec: PayloadCodec {
    public init() {}

    public var name: String { "json" }

    /// - Throws: ``IPCError/Code/unsupportedOperation`` if `message` is not a ``CodableMessage``;
    ///   ``IPCError/Code/malformedPayload`` if `JSONEncoder` fails (for example on a NaN).
    public func encode(_ message: some SecureMessage) throws -> [UInt8] {
        try MessageEnvelope.encode(message, format: "JSON") { envelope in
            try JSONEncoder().encode(envelope)
        }
    }

    /// - Throws: as ``PayloadCodec/decode(_:allowing:limits:)``.
    public func decode(_ bytes: [UInt8], allowing allowList: AllowList, limits: DecodingLimits) throws -> any SecureMessage {
        try limits.checkLength(bytes.count)
        try NestingScanner.checkJSON(bytes, maximumDepth: limits.maximumDepth)
        let decoder = JSONDecoder()
        decoder.userInfo[.allowList] = allowList
        return try MessageEnvelope.decode(format: "JSON") {
            try decoder.decode(MessageEnvelope.self, from: Data(bytes))
        }
    }
}

extension PayloadCodec where Self == JSONPayloadCodec {
    /// JSON `Codable` payloads.
    public static var json: JSONPayloadCodec { JSONPayloadCodec() }
}
