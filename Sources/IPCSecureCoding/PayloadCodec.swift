import IPCCore

/// Turns messages into payload bytes and back, decoding only the types the receiver allows.
///
/// Decoding never traps and never allocates or recurses without bound on hostile input: the
/// length and the nesting depth are checked before Foundation sees the bytes, and every failure is
/// an ``IPCError``. The codecs are reached as `.json`, `.propertyList`, `.keyedArchive` and
/// `.binaryCodable`.
public protocol PayloadCodec: Sendable {
    /// A short, stable name for reports: `"json"`, `"propertyList"`, `"keyedArchive"`, `"binaryCodable"`.
    var name: String { get }

    /// Encodes `message` with its type name (or class name) so a receiver can check it.
    /// - Throws: ``IPCError/Code/unsupportedOperation`` if this codec cannot carry the message's
    ///   type (a Codable codec needs a ``CodableMessage``; the keyed-archive codec an
    ///   `NSObject` that conforms to `NSSecureCoding`); ``IPCError/Code/malformedPayload`` if
    ///   Foundation cannot encode the value.
    func encode(_ message: some SecureMessage) throws -> [UInt8]

    /// Decodes one message, refusing every type that `allowList` does not name.
    /// - Throws: ``IPCError/Code/payloadTooLarge`` if `bytes` is longer than the limit;
    ///   ``IPCError/Code/nestingTooDeep`` if the payload nests deeper than the limit;
    ///   ``IPCError/Code/disallowedType`` if the payload names a type (at any depth, including an
    ///   element of a container) that `allowList` does not allow;
    ///   ``IPCError/Code/malformedPayload`` for anything this codec cannot decode: truncated or
    ///   garbage bytes, the wrong format, a value that does not match its type. The Foundation
    ///   error, if any, is the ``IPCError/cause``.
    func decode(_ bytes: [UInt8], allowing allowList: AllowList, limits: DecodingLimits) throws -> any SecureMessage
}

extension PayloadCodec {
    /// Decodes one message with the default ``DecodingLimits``.
    /// - Throws: as ``PayloadCodec/decode(_:allowing:limits:)``.
    public func decode(_ bytes: [UInt8], allowing allowList: AllowList) throws -> any SecureMessage {
        try decode(bytes, allowing: allowList, limits: DecodingLimits())
    }
}
