import IPCCore
public import IPCSecureCoding

/// MMWormhole passes objects (`passMessageObject:identifier:` with NSCoding); this wormhole passes
/// them through the package's secure codecs: each object is stored with its type's name, and a
/// reader decodes only the types it allows, so a message another process stored cannot make the
/// reader build a type it did not ask for.
extension Wormhole {
    /// Stores `object` as the message of `identifier`, encoded by `codec` (binary Codable unless
    /// told otherwise; a reader must use the same codec), and notifies the group's listeners.
    /// - Throws: the codec's ``IPCError/Code/unsupportedOperation`` for a type it cannot carry;
    ///   what ``passMessage(_:identifier:)`` throws.
    public func passMessageObject(_ object: some SecureMessage, identifier: String, codec: any PayloadCodec = BinaryCodablePayloadCodec()) throws {
        try passMessage(codec.encode(object), identifier: identifier)
    }

    /// The object stored as the message of `identifier`, decoded by `codec`, or `nil` if no
    /// message is stored. A message that does not decode is left as it was (still readable as
    /// bytes with ``message(withIdentifier:)``).
    /// - Throws: what ``message(withIdentifier:)`` throws; the codec's
    ///   ``IPCError/Code/disallowedType`` for a type `allowList` does not name (at any depth),
    ///   ``IPCError/Code/malformedPayload``, ``IPCError/Code/nestingTooDeep`` or
    ///   ``IPCError/Code/payloadTooLarge`` (above `limits`).
    public func messageObject(
        withIdentifier identifier: String, allowing allowList: AllowList, codec: any PayloadCodec = BinaryCodablePayloadCodec(), limits: DecodingLimits = DecodingLimits()
    ) throws -> (any SecureMessage)? {
        guard let bytes = try message(withIdentifier: identifier) else { return nil }
        return try codec.decode(bytes, allowing: allowList, limits: limits)
    }

    /// The object of type `type` stored as the message of `identifier`, or `nil` if no message
    /// is stored; only `type` is allowed.
    /// - Throws: as ``messageObject(withIdentifier:allowing:codec:limits:)``.
    public func messageObject<Message: CodableMessage>(
        _ type: Message.Type, withIdentifier identifier: String, codec: any PayloadCodec = BinaryCodablePayloadCodec(), limits: DecodingLimits = DecodingLimits()
    ) throws -> Message? {
        guard let object = try messageObject(withIdentifier: identifier, allowing: AllowList([type]), codec: codec, limits: limits) else { return nil }
        guard let message = object as? Message else {
            throw IPCError(code: .disallowedType, message: "the message of \(identifier.debugDescription) is a \(Swift.type(of: object).typeName), not a \(Message.typeName)")
        }
        return message
    }
}
