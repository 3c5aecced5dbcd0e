import Foundation
import IPCCore
import IPCSecureCoding

/// A Codable message no receiver in the suite allows.
struct IntruderMessage: CodableMessage {
    static var typeName: String { "ipcconformance.Intruder" }
    var note = "not on any allow-list"
}

/// An archivable class no receiver in the suite allows.
final class IntruderObject: NSObject, NSSecureCoding, SecureMessage {
    static var supportsSecureCoding: Bool { true }

    override init() {}

    func encode(with coder: NSCoder) {
        coder.encode("not on any allow-list", forKey: "note")
    }

    init?(coder: NSCoder) {}
}

/// An archivable container of arbitrary objects, which receivers allow: what it holds is
/// checked element by element. Immutable, so `@unchecked Sendable` is safe although its
/// `NSObject` elements are not `Sendable`.
final class CrateObject: NSObject, NSSecureCoding, SecureMessage, @unchecked Sendable {
    static var supportsSecureCoding: Bool { true }
    let contents: [NSObject]

    init(_ contents: [NSObject]) {
        self.contents = contents
    }

    func encode(with coder: NSCoder) {
        coder.encode(contents, forKey: "contents")
    }

    init?(coder: NSCoder) {
        guard let contents = coder.decodeAllowedObject(of: [NSObject].self, forKey: "contents") else { return nil }
        self.contents = contents
    }
}

/// The payloads the secure-decoding cases send through a transport, made with one codec.
///
/// Codable codecs carry ``Order`` and ``MessageList``; a codec that refuses Codable messages
/// (``IPCError/Code/unsupportedOperation``) is taken to carry objects, as the keyed archive does.
struct SecureDecodingFixtures {
    let codec: any PayloadCodec
    let allowList: AllowList
    let valid: [UInt8]
    let disallowedType: [UInt8]
    let disallowedElement: [UInt8]
    let deeplyNested: [UInt8]

    /// Nesting this deep is past ``DecodingLimits``' default depth (32) under every codec,
    /// in a payload small enough for modest transports (about 32 KiB as a keyed archive).
    static let nestingLevels = 40

    /// - Throws: what the codec's `encode` throws.
    init(codec: any PayloadCodec) throws {
        do {
            self = try Self.codable(codec)
        } catch let error as IPCError where error.code == .unsupportedOperation {
            self = try Self.objects(codec)
        }
    }

    private init(codec: any PayloadCodec, allowList: AllowList, valid: [UInt8], disallowedType: [UInt8], disallowedElement: [UInt8], deeplyNested: [UInt8]) {
        self.codec = codec
        self.allowList = allowList
        self.valid = valid
        self.disallowedType = disallowedType
        self.disallowedElement = disallowedElement
        self.deeplyNested = deeplyNested
    }

    private static func codable(_ codec: any PayloadCodec) throws -> Self {
        let order = Order.sample(approximateSize: 400)
        let nested = (1..<nestingLevels).reduce(MessageList([])) { inner, _ in MessageList([inner]) }
        return Self(
            codec: codec,
            allowList: .orders,
            valid: try codec.encode(order),
            disallowedType: try codec.encode(IntruderMessage()),
            disallowedElement: try codec.encode(MessageList([order, IntruderMessage(), order])),
            deeplyNested: try codec.encode(nested)
        )
    }

    private static func objects(_ codec: any PayloadCodec) throws -> Self {
        let order = OrderObject(Order.sample(approximateSize: 400))
        var allowList = AllowList.orders
        allowList.allow(class: CrateObject.self)
        let nested = (1..<nestingLevels).reduce(CrateObject([])) { inner, _ in CrateObject([inner]) }
        return Self(
            codec: codec,
            allowList: allowList,
            valid: try codec.encode(order),
            disallowedType: try codec.encode(IntruderObject()),
            disallowedElement: try codec.encode(CrateObject([order, IntruderObject()])),
            deeplyNested: try codec.encode(nested)
        )
    }

    /// Cuts of the valid payload that leave out more than trailing whitespace.
    var truncations: [[UInt8]] {
        let lastSignificant = valid.lastIndex { ![0x20, 0x09, 0x0A, 0x0D].contains($0) } ?? 0
        return Set([1, valid.count / 3, valid.count / 2, lastSignificant]).sorted().map { Array(valid[..<$0]) }
    }

    /// Bytes that are no payload of any codec.
    static let malformed: [[UInt8]] = [
        Array("hello".utf8),
        Array("{]".utf8),
        Array("<plist><array/></plist>".utf8),
        Array("{\"type\": 5}".utf8),
        (0..<256).map { UInt8(truncatingIfNeeded: $0 &* 167 &+ 13) },
    ]
}
