public import Foundation
import IPCCore

/// The types a receiver accepts: NSSecureCoding's `allowedClasses`, as LLBSDMessaging's
/// `allowedMessageClasses`. A payload that names anything else is refused with
/// ``IPCError/Code/disallowedType``.
///
/// Codable messages are matched by ``SecureMessage/typeName``. Classes, for
/// ``KeyedArchivePayloadCodec``, are matched exactly by the name Foundation archives for them
/// (`NSStringFromClass`, `"Module.ClassName"` for a Swift class, `"NSArray"` for a Foundation one),
/// so a subclass of an allowed class must be listed itself.
public struct AllowList: Sendable {
    typealias MessageDecoder = @Sendable (any Decoder) throws -> any CodableMessage

    private var decoders: [String: MessageDecoder] = [:]
    private var classesByName: [String: any (NSObject & NSSecureCoding).Type] = [:]

    /// An allow-list of Codable message types and archivable classes.
    public init(_ types: [any CodableMessage.Type] = [], classes: [any (NSObject & NSSecureCoding).Type] = []) {
        for type in types {
            allow(type)
        }
        for cls in classes {
            allow(class: cls)
        }
    }

    /// Allows a Codable message type under its ``SecureMessage/typeName``.
    public mutating func allow(_ type: any CodableMessage.Type) {
        decoders[type.typeName] = Self.decoder(for: type)
    }

    /// Allows a class in keyed archives under the name Foundation archives for it.
    ///
    /// Of Foundation's own classes, ``KeyedArchivePayloadCodec`` accepts only `NSArray`,
    /// `NSDictionary`, `NSDate`, `NSData` and their mutable forms, even when others are allowed;
    /// strings and numbers need no class, being archived as plain values.
    public mutating func allow(class cls: any (NSObject & NSSecureCoding).Type) {
        classesByName[NSStringFromClass(cls)] = cls
    }

    /// The allowed Codable type names.
    public var typeNames: Set<String> { Set(decoders.keys) }

    /// The allowed archived class names.
    public var classNames: Set<String> { Set(classesByName.keys) }

    func decoder(forTypeName name: String) -> MessageDecoder? {
        decoders[name]
    }

    func allowedClass(named name: String) -> (any (NSObject & NSSecureCoding).Type)? {
        classesByName[name]
    }

    var classes: [any (NSObject & NSSecureCoding).Type] { Array(classesByName.values) }

    private static func decoder<Message: CodableMessage>(for type: Message.Type) -> MessageDecoder {
        { decoder in try Message(from: decoder) }
    }
}
