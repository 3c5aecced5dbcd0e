import Foundation
import IPCCore

/// XML property lists through `PropertyListEncoder` and `PropertyListDecoder`: a
/// ``MessageEnvelope`` as a `<dict>` with `type` and `value`.
///
/// Only the XML format is accepted: a binary property list's objects refer to each other by
/// offset, so its nesting cannot be bounded without parsing it, and OpenStep text is parsed
/// recursively too. Before the decoder sees a payload, its length is checked and its nesting
/// counted by a cheap scan of the tags (``NestingScanner``). Dates keep whole seconds only: that is
/// all the XML format stores.
public struct PropertyListPayloadCodec: PayloadCodec {
    public init() {}

    public var name: String { "propertyList" }

    /// - Throws: ``IPCError/Code/unsupportedOperation`` if `message` is not a ``CodableMessage``;
    ///   ``IPCError/Code/malformedPayload`` if `PropertyListEncoder` fails.
    public func encode(_ message: some SecureMessage) throws -> [UInt8] {
        try MessageEnvelope.encode(message, format: "XML property list") { envelope in
            let encoder = PropertyListEncoder()
            encoder.outputFormat = .xml
            return try encoder.encode(envelope)
        }
    }

    /// - Throws: as ``PayloadCodec/decode(_:allowing:limits:)``; a binary or OpenStep property
    ///   list is ``IPCError/Code/malformedPayload``.
    public func decode(_ bytes: [UInt8], allowing allowList: AllowList, limits: DecodingLimits) throws -> any SecureMessage {
        try limits.checkLength(bytes.count)
        try NestingScanner.checkXMLPropertyList(bytes, maximumDepth: limits.maximumDepth)
        let decoder = PropertyListDecoder()
        decoder.userInfo[.allowList] = allowList
        return try MessageEnvelope.decode(format: "XML property list") {
            try decoder.decode(MessageEnvelope.self, from: Data(bytes))
        }
    }
}

extension PayloadCodec where Self == PropertyListPayloadCodec {
    /// XML property-list `Codable` payloads.
    public static var propertyList: PropertyListPayloadCodec { PropertyListPayloadCodec() }
}
