public import Foundation

/// A message that a receiver can name on its ``AllowList``.
///
/// Codable codecs put ``typeName`` on the wire next to the value, and the receiver looks it up on
/// its allow-list before anything else of the payload is decoded, so the name must be stable
/// across releases and unique among the types one receiver accepts.
public protocol SecureMessage: Sendable {
    /// The name that identifies this type on the wire, for example `"ipcbench.Order"`.
    static var typeName: String { get }
}

/// A message carried by the Codable codecs (``JSONPayloadCodec``, ``PropertyListPayloadCodec``,
/// ``BinaryCodablePayloadCodec``).
public protocol CodableMessage: SecureMessage, Codable {}

extension SecureMessage where Self: NSObject {
    /// Keyed archives identify a class by the name Foundation archives for it,
    /// `NSStringFromClass(_:)`: `"Module.ClassName"` for a Swift class on Linux.
    public static var typeName: String { NSStringFromClass(self) }
}
