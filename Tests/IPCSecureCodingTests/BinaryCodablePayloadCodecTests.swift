import Foundation
import IPCCore
import IPCSecureCoding
import IPCTestSupport
import Testing

/// The binary Codable codec's own cases: payloads written by hand, byte by byte, with the counts
/// and lengths a hostile sender would choose. The rules it shares with the other Codable codecs
/// are in ``CodablePayloadCodecTests``.
@Suite(.offTheCooperativePool) struct BinaryCodablePayloadCodecTests {
    let codec = BinaryCodablePayloadCodec()
    let orders = AllowList([Order.self, MessageList.self])

    /// The example of `docs/WIRE-FORMAT.md` section 4.3, byte for byte.
    @Test func wireFormatExample() throws {
        let expected: [UInt8] = [
            0x49, 0x50, 0x42, 0x01, 0x0C, 0x1F, 0x09, 0x74, 0x65, 0x73, 0x74, 0x2E, 0x50, 0x69, 0x6E, 0x67,
            0x0A, 0x13, 0x01, 0x08, 0x73, 0x65, 0x71, 0x75, 0x65, 0x6E, 0x63, 0x65, 0x03, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ]
        #expect(try codec.encode(Ping(sequence: 1)) == expected)
        #expect(try codec.decode(expected, allowing: AllowList([Ping.self])) as? Ping == Ping(sequence: 1))
        expectIPCError(.disallowedType) { _ = try codec.decode(expected, allowing: orders) }
    }

    @Test(arguments: [0, 300, 1024, 16_384])
    func everyTruncationIsMalformed(size: Int) throws {
        let bytes = try codec.encode(Order.sample(approximateSize: size))
        for length in 0..<bytes.count {
            expectIPCError(.malformedPayload) { _ = try codec.decode(Array(bytes[..<length]), allowing: orders) }
        }
    }

    @Test func everyTruncationOfANestedListIsMalformed() throws {
        let bytes = try codec.encode(MessageList([Order.sample(approximateSize: 300), MessageList([Order.sample(approximateSize: 0)])]))
        for length in 0..<bytes.count {
            expectIPCError(.malformedPayload) { _ = try codec.decode(Array(bytes[..<length]), allowing: orders) }
        }
    }

    @Test func trailingBytesAreMalformed() throws {
        let bytes = try codec.encode(Order.sample(approximateSize: 300))
        expectIPCError(.malformedPayload) { _ = try codec.decode(bytes + [0], allowing: orders) }
    }

    /// The value of a disallowed type is never read: a value no decoder could read still gives
    /// `disallowedType`, not `malformedPayload`.
    @Test func typeIsCheckedBeforeTheValue() {
        let bytes = Payload.message("test.Unknown", value: [0xFF, 0xFF, 0xFF])
        let error = expectIPCError(.disallowedType) { _ = try codec.decode(bytes, allowing: AllowList([Ping.self])) }
        #expect(error?.message.contains("test.Unknown") == true)
    }

    @Test func valueThatDoesNotMatchItsTypeIsMalformed() throws {
        expectIPCError(.malformedPayload) { _ = try codec.decode(codec.encode(Impostor(sequence: 1)), allowing: orders) }
    }

    @Test func integerOutOfRangeForItsTypeIsMalformed() throws {
        let bytes = try codec.encode(WidePing(sequence: .max))
        expectIPCError(.malformedPayload) { _ = try codec.decode(bytes, allowing: AllowList([Ping.self])) }
        #expect(try codec.decode(codec.encode(WidePing(sequence: 7)), allowing: AllowList([Ping.self])) as? Ping == Ping(sequence: 7))
    }

    /// Keys in another order than the decoded type asks for them, and keys it does not know, are
    /// found by a scan of the container.
    @Test func keysInAnyOrderDecode() throws {
        let order = Order.sample(approximateSize: 1024)
        let decoded = try codec.decode(codec.encode(ShuffledOrder(order: order)), allowing: orders)
        #expect(decoded as? Order == order)
    }

    /// Counts and lengths far above the payload are refused before anything is allocated for them.
    @Test(arguments: [1 << 62, Int.max, 1 << 32, 4096])
    func hostileCountsAndLengthsAreMalformed(declared: Int) {
        let hostile: [[UInt8]] = [
            // A string, data, keyed, unkeyed and envelope value whose length is `declared`.
            Payload.message("ipcbench.Order", value: [0x07] + Payload.varint(declared) + Array("abc".utf8)),
            Payload.message("ipcbench.Order", value: [0x08] + Payload.varint(declared) + [1, 2, 3]),
            Payload.message("ipcbench.Order", value: [0x0A] + Payload.varint(declared) + [0]),
            Payload.message("ipcbench.MessageList", value: [0x0B] + Payload.varint(declared) + [0]),
            Payload.magic + [0x0C] + Payload.varint(declared) + [0],
            // A keyed and an unkeyed container whose body is right but whose count is `declared`.
            Payload.message("ipcbench.Order", value: Payload.composite(0x0A, Payload.varint(declared) + [1, 0x61, 0x00])),
            Payload.message("ipcbench.MessageList", value: Payload.composite(0x0B, Payload.varint(declared) + [0x00])),
            // A type name and a key whose length is `declared`.
            Payload.magic + Payload.composite(0x0C, Payload.varint(declared) + Array("ipcbench.Order".utf8)),
            Payload.message("ipcbench.Order", value: Payload.composite(0x0A, [1] + Payload.varint(declared) + [0x61, 0x00])),
        ]
        for bytes in hostile {
            expectIPCError(.malformedPayload) { _ = try codec.decode(bytes, allowing: orders) }
        }
    }

    @Test func dictionariesAndOptionalsRoundTrip() throws {
        let allow = AllowList([Labels.self])
        for labels in [Labels(counts: ["a": 1, "b": -2], note: "n", missing: nil), Labels(counts: [:], note: nil, missing: nil)] {
            #expect(try codec.decode(codec.encode(labels), allowing: allow) as? Labels == labels)
        }
        // Without the optional keys at all.
        let bare = Payload.message("test.Labels", value: Payload.composite(0x0A, [1, 6] + Array("counts".utf8) + Payload.composite(0x0A, [0])))
        #expect(try codec.decode(bare, allowing: allow) as? Labels == Labels(counts: [:], note: nil, missing: nil))
    }

    /// A dictionary (which decodes every key `allKeys` lists) and an optional (which asks
    /// `contains` first) fail on an entry that cannot be read, instead of stopping short of it.
    @Test func unreadableEntriesAreMalformedForDictionariesAndOptionals() {
        let allow = AllowList([Labels.self])
        let brokenCounts = Payload.composite(0x0A, [2, 1, 0x61] + [0x03, 1, 0, 0, 0, 0, 0, 0, 0] + [1, 0x62, 0x42])
        let dictionary = Payload.message("test.Labels", value: Payload.composite(0x0A, [1, 6] + Array("counts".utf8) + brokenCounts))
        expectIPCError(.malformedPayload) { _ = try codec.decode(dictionary, allowing: allow) }
        let counts = [6] + Array("counts".utf8) + Payload.composite(0x0A, [0])
        let optional = Payload.message("test.Labels", value: Payload.composite(0x0A, [2] + counts + [1, 0x78, 0x42]))
        expectIPCError(.malformedPayload) { _ = try codec.decode(optional, allowing: allow) }
    }

    @Test func overlongVarintIsMalformed() {
        let bytes = Payload.message("ipcbench.Order", value: [0x07] + [UInt8](repeating: 0xFF, count: 12) + [0x01])
        let error = expectIPCError(.malformedPayload) { _ = try codec.decode(bytes, allowing: orders) }
        #expect(error?.message.contains("varint") == true)
    }

    @Test func unknownTagIsMalformed() {
        expectIPCError(.malformedPayload) { _ = try codec.decode(Payload.message("ipcbench.Order", value: [0x42]), allowing: orders) }
    }

    /// Two thousand levels of lists in envelopes are refused at the limit, without recursing into them.
    @Test func twoThousandLevelsAreRefusedWithoutRecursion() {
        let name = Array("ipcbench.MessageList".utf8)
        var list = Payload.composite(0x0B, [0])
        for _ in 0..<1000 {
            list = Payload.composite(0x0B, [1] + Payload.composite(0x0C, Payload.varint(name.count) + name + list))
        }
        expectIPCError(.nestingTooDeep) { _ = try codec.decode(Payload.message("ipcbench.MessageList", value: list), allowing: orders) }
    }

    @Test func invalidUTF8IsMalformed() throws {
        let bytes = try codec.encode(Order.sample(approximateSize: 300))
        let customer = try #require(bytes.firstRange(of: Array("Lovelace".utf8)))
        for invalid: [UInt8] in [[0xFF], [0xC0, 0x80], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80]] {
            var edited = bytes
            edited.replaceSubrange(customer.lowerBound..<(customer.lowerBound + invalid.count), with: invalid)
            expectIPCError(.malformedPayload) { _ = try codec.decode(edited, allowing: orders) }
        }
        expectIPCError(.malformedPayload) { _ = try codec.decode(Payload.message("ipcbench.Order\u{FF}", value: [0]).replacingByte(0xC3, with: 0xFF), allowing: orders) }
    }

    @Test func depthZeroRefusesEverything() throws {
        let bytes = try codec.encode(MessageList([]))
        expectIPCError(.nestingTooDeep) { _ = try codec.decode(bytes, allowing: orders, limits: DecodingLimits(maximumDepth: 0)) }
        expectIPCError(.nestingTooDeep) { _ = try codec.decode(bytes, allowing: orders, limits: DecodingLimits(maximumDepth: 1)) }
        #expect(try codec.decode(bytes, allowing: orders, limits: DecodingLimits(maximumDepth: 2)) is MessageList)
    }
}

/// Payloads by hand, as `docs/WIRE-FORMAT.md` section 4 describes them.
private enum Payload {
    static let magic: [UInt8] = [0x49, 0x50, 0x42, 0x01]

    static func varint(_ value: Int) -> [UInt8] {
        var rest = UInt(value)
        var bytes: [UInt8] = []
        while rest >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: rest) | 0x80)
            rest >>= 7
        }
        return bytes + [UInt8(rest)]
    }

    static func composite(_ tag: UInt8, _ body: [UInt8]) -> [UInt8] {
        [tag] + varint(body.count) + body
    }

    /// The magic, then an envelope naming `typeName` around `value`.
    static func message(_ typeName: String, value: [UInt8]) -> [UInt8] {
        magic + composite(0x0C, varint(typeName.utf8.count) + Array(typeName.utf8) + value)
    }
}

extension Array where Element == UInt8 {
    fileprivate func replacingByte(_ old: UInt8, with new: UInt8) -> [UInt8] {
        map { $0 == old ? new : $0 }
    }
}

/// A dictionary and optionals, which decode through `allKeys` and `contains`.
private struct Labels: CodableMessage, Equatable {
    static var typeName: String { "test.Labels" }
    var counts: [String: Int]
    var note: String?
    var missing: Int?
}

/// A message that claims to be an ``Order`` but carries a ``Ping``'s value.
private struct Impostor: CodableMessage {
    static var typeName: String { Order.typeName }
    var sequence: Int
}

/// A ``Ping`` whose sequence is written as a `UInt64`.
private struct WidePing: CodableMessage {
    static var typeName: String { Ping.typeName }
    var sequence: UInt64
}

/// An ``Order`` written with its keys in reverse order and an extra key.
private struct ShuffledOrder: CodableMessage {
    static var typeName: String { Order.typeName }
    var order: Order

    init(order: Order) {
        self.order = order
    }

    init(from decoder: any Decoder) throws {
        order = try Order(from: decoder)
    }

    private struct Key: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: Key.self)
        try container.encode(order.attachment, forKey: Key(stringValue: "attachment"))
        try container.encode(order.placedAt, forKey: Key(stringValue: "placedAt"))
        try container.encode("ignored", forKey: Key(stringValue: "note"))
        try container.encode(order.tags, forKey: Key(stringValue: "tags"))
        try container.encode(order.items, forKey: Key(stringValue: "items"))
        try container.encode(order.customer, forKey: Key(stringValue: "customer"))
        try container.encode(order.id, forKey: Key(stringValue: "id"))
    }
}
