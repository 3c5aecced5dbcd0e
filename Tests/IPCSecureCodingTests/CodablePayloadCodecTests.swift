import Foundation
import IPCCore
import IPCSecureCoding
import IPCTestSupport
import Testing

/// The Codable codecs share their envelope and their rules, so each case runs on all of them;
/// the cases that edit a payload as text run on the text formats only.
@Suite(.offTheCooperativePool) struct CodablePayloadCodecTests {
    static let textCodecs: [any PayloadCodec] = [.json, .propertyList]
    static let codecs: [any PayloadCodec] = textCodecs + [.binaryCodable]

    let orders = AllowList([Order.self, MessageList.self])

    @Test(arguments: codecs, [0, 64, 4096, 65_536])
    func roundTrip(codec: any PayloadCodec, size: Int) throws {
        let order = Order.sample(approximateSize: size)
        let decoded = try codec.decode(codec.encode(order), allowing: orders)
        #expect(decoded as? Order == order)
    }

    @Test(arguments: codecs)
    func messageListRoundTrip(codec: any PayloadCodec) throws {
        let list = MessageList([Order.sample(approximateSize: 0), Ping(sequence: 7), MessageList([Ping(sequence: 8)])])
        let decoded = try codec.decode(codec.encode(list), allowing: AllowList([Order.self, Ping.self, MessageList.self]))
        let messages = try #require((decoded as? MessageList)?.messages)
        #expect(messages.count == 3)
        #expect(messages[0] as? Order == Order.sample(approximateSize: 0))
        #expect(messages[1] as? Ping == Ping(sequence: 7))
        #expect(((messages[2] as? MessageList)?.messages.first as? Ping) == Ping(sequence: 8))
    }

    @Test(arguments: codecs)
    func typeOutsideTheAllowListIsRefused(codec: any PayloadCodec) throws {
        let bytes = try codec.encode(Ping(sequence: 1))
        let error = expectIPCError(.disallowedType) { _ = try codec.decode(bytes, allowing: orders) }
        #expect(error?.message.contains("test.Ping") == true)
    }

    /// The value of a disallowed type is never decoded: a value that could not be decoded as
    /// anything still gives `disallowedType`, not `malformedPayload`.
    @Test(arguments: textCodecs)
    func typeIsCheckedBeforeTheValue(codec: any PayloadCodec) throws {
        let bytes = try codec.encode(Ping(sequence: 1)).replacingText("test.Ping", with: "test.Unknown")
        expectIPCError(.disallowedType) { _ = try codec.decode(bytes, allowing: AllowList([Ping.self])) }
    }

    @Test(arguments: codecs)
    func containerWithOneDisallowedElementIsRefused(codec: any PayloadCodec) throws {
        let list = MessageList([Order.sample(approximateSize: 0), Ping(sequence: 1), Order.sample(approximateSize: 0)])
        let bytes = try codec.encode(list)
        let error = expectIPCError(.disallowedType) { _ = try codec.decode(bytes, allowing: orders) }
        #expect(error?.message.contains("element 1") == true)
        #expect(error?.message.contains("test.Ping") == true)
    }

    @Test(arguments: codecs)
    func disallowedElementOfANestedContainerIsNamedByItsPath(codec: any PayloadCodec) throws {
        let list = MessageList([Order.sample(approximateSize: 0), MessageList([Order.sample(approximateSize: 0), Ping(sequence: 1)])])
        let error = expectIPCError(.disallowedType) { _ = try codec.decode(codec.encode(list), allowing: orders) }
        #expect(error?.message.contains("element 1 of ipcbench.MessageList: element 1 of ipcbench.MessageList") == true, "\(String(describing: error))")
    }

    @Test(arguments: codecs)
    func everyTruncationIsMalformed(codec: any PayloadCodec) throws {
        let bytes = try codec.encode(Order.sample(approximateSize: 300))
        for length in 0..<bytes.count where !bytes.isWhitespace(from: length) {
            expectIPCError(.malformedPayload) { _ = try codec.decode(Array(bytes[..<length]), allowing: orders) }
        }
    }

    @Test(arguments: codecs)
    func garbageIsMalformed(codec: any PayloadCodec) throws {
        var generator = SplitMix64(seed: 0x1B_CBE5)
        var samples: [[UInt8]] = (0..<200).map { _ in
            (0..<Int.random(in: 1...512, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        }
        samples += [
            [UInt8]("hello"), [UInt8]("{]"), [UInt8]("null"), [UInt8]("[1, 2, 3]"), [UInt8]("<plist><array/></plist>"),
            [UInt8]("{\"type\": 5}"), [UInt8]("<plist><dict><key>type</key><integer>5</integer></dict></plist>"),
            [UInt8]("( ( ( a ) ) )"), [UInt8]("bplist00"), [0xFF, 0xFE, 0x7B, 0x00, 0x7D, 0x00],
        ]
        for sample in samples {
            expectIPCError(.malformedPayload) { _ = try codec.decode(sample, allowing: orders) }
        }
    }

    /// A value of the wrong shape for its type is malformed, not disallowed.
    @Test(arguments: textCodecs)
    func valueThatDoesNotMatchItsTypeIsMalformed(codec: any PayloadCodec) throws {
        let bytes = try codec.encode(Ping(sequence: 1)).replacingText("test.Ping", with: Order.typeName)
        expectIPCError(.malformedPayload) { _ = try codec.decode(bytes, allowing: orders) }
    }

    @Test(arguments: codecs)
    func payloadOverTheLimitIsRefusedBeforeParsing(codec: any PayloadCodec) throws {
        let small = try codec.encode(Order.sample(approximateSize: 0))
        let limits = DecodingLimits(maximumPayloadLength: small.count)
        #expect(try codec.decode(small, allowing: orders, limits: limits) is Order)
        expectIPCError(.payloadTooLarge) { _ = try codec.decode(codec.encode(Order.sample(approximateSize: 4096)), allowing: orders, limits: limits) }
        // Garbage one byte over the limit is refused for its size, before anything looks at it.
        expectIPCError(.payloadTooLarge) { _ = try codec.decode([UInt8](repeating: 0, count: small.count + 1), allowing: orders, limits: limits) }
    }

    /// Each level of `MessageList` adds two levels of nesting (the envelope and the list), so
    /// nested lists find the exact boundary.
    @Test(arguments: codecs)
    func nestingUpToTheLimitDecodesAndOneMoreIsRefused(codec: any PayloadCodec) throws {
        func nested(_ levels: Int) -> MessageList {
            (1..<levels).reduce(MessageList([])) { inner, _ in MessageList([inner]) }
        }
        // JSON: 2 per list. Property list: 2 per list plus the outer <plist>, which is not counted.
        // Binary Codable: the envelope and the list, 2 per list.
        let limits = DecodingLimits(maximumDepth: 20)
        #expect(try codec.decode(codec.encode(nested(10)), allowing: orders, limits: limits) is MessageList)
        expectIPCError(.nestingTooDeep) { _ = try codec.decode(codec.encode(nested(11)), allowing: orders, limits: limits) }
    }

    @Test func tenThousandLevelsOfJSONAreRefusedWithoutRecursion() {
        let bytes = [UInt8]("{\"type\":\"ipcbench.MessageList\",\"value\":" + String(repeating: "[", count: 10_000) + String(repeating: "]", count: 10_000) + "}")
        expectIPCError(.nestingTooDeep) { _ = try JSONPayloadCodec().decode(bytes, allowing: orders) }
    }

    /// A million levels would overflow the stack of any recursive parser.
    @Test func aMillionLevelsOfJSONAreRefusedWithoutRecursion() {
        let bytes = [UInt8](repeating: UInt8(ascii: "["), count: 1_000_000)
        expectIPCError(.nestingTooDeep) { _ = try JSONPayloadCodec().decode(bytes, allowing: orders, limits: DecodingLimits(maximumPayloadLength: 2 << 20)) }
    }

    @Test func tenThousandLevelsOfPropertyListAreRefusedWithoutRecursion() {
        let bytes = [UInt8]("<plist><dict><key>type</key><string>ipcbench.MessageList</string><key>value</key>" + String(repeating: "<array>", count: 10_000) + String(repeating: "</array>", count: 10_000) + "</dict></plist>")
        expectIPCError(.nestingTooDeep) { _ = try PropertyListPayloadCodec().decode(bytes, allowing: orders) }
    }

    @Test func binaryPropertyListIsRefused() throws {
        let encoder = PropertyListEncoder()
        encoder.outputFormat = .binary
        let bytes = try [UInt8](encoder.encode(["type": Order.typeName]))
        let error = expectIPCError(.malformedPayload) { _ = try PropertyListPayloadCodec().decode(bytes, allowing: orders) }
        #expect(error?.message.contains("XML") == true)
    }

    @Test func keyedArchiveObjectIsNotCarriedByCodableCodecs() {
        for codec in Self.codecs {
            expectIPCError(.unsupportedOperation) { _ = try codec.encode(OrderObject(Order.sample(approximateSize: 0))) }
        }
    }
}
