import Foundation
import IPCCore
import IPCSecureCoding
import IPCTestSupport
import Testing

/// Hand-written keyed archives, for object graphs that NSKeyedArchiver would not produce.
/// Object 0 is `$null`; the objects given are numbered from 1.
enum CraftedArchive {
    static func reference(_ index: Int) -> String {
        "<dict><key>CF$UID</key><integer>\(index)</integer></dict>"
    }

    static func classDescription(_ name: String) -> String {
        "<dict><key>$classes</key><array><string>\(name)</string><string>NSObject</string></array><key>$classname</key><string>\(name)</string></dict>"
    }

    static func array(classAt classIndex: Int, elements: [Int]) -> String {
        "<dict><key>$class</key>\(reference(classIndex))<key>NS.objects</key><array>\(elements.map(reference).joined())</array></dict>"
    }

    static func dictionary(classAt classIndex: Int, keys: [Int], values: [Int]) -> String {
        "<dict><key>$class</key>\(reference(classIndex))<key>NS.keys</key><array>\(keys.map(reference).joined())</array><key>NS.objects</key><array>\(values.map(reference).joined())</array></dict>"
    }

    static func archive(_ objects: [String], root: Int = 1) -> [UInt8] {
        [UInt8](
            """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict>
            <key>$archiver</key><string>NSKeyedArchiver</string>
            <key>$objects</key><array><string>$null</string>\(objects.joined(separator: "\n"))</array>
            <key>$top</key><dict><key>root</key>\(reference(root))</dict>
            <key>$version</key><integer>100000</integer>
            </dict></plist>
            """)
    }
}

@Suite(.offTheCooperativePool) struct KeyedArchivePayloadCodecTests {
    let codec = KeyedArchivePayloadCodec()
    let orders = AllowList.orders
    let baskets = AllowList(classes: [BasketObject.self, LineItemObject.self, NSArray.self, NSDictionary.self])

    @Test(arguments: [0, 64, 4096, 65_536])
    func roundTrip(size: Int) throws {
        let order = Order.sample(approximateSize: size)
        let decoded = try codec.decode(codec.encode(OrderObject(order)), allowing: orders)
        #expect((decoded as? OrderObject)?.order == order)
    }

    @Test func heterogeneousContainerRoundTrip() throws {
        let basket = BasketObject(contents: [LineItemObject(Order.LineItem(sku: "A", quantity: 1, unitPriceCents: 5))], labels: ["k": "v"])
        let decoded = try #require(try codec.decode(codec.encode(basket), allowing: baskets) as? BasketObject)
        #expect((decoded.contents.first as? LineItemObject)?.sku == "A")
        #expect(decoded.labels == ["k": "v"])
    }

    @Test func archivedClassNamesAreModuleQualified() throws {
        let text = String(decoding: try codec.encode(OrderObject(Order.sample(approximateSize: 300))), as: UTF8.self)
        for name in ["IPCSecureCoding.OrderObject", "IPCSecureCoding.LineItemObject", "NSArray", "NSDate"] {
            #expect(text.contains("<string>\(name)</string>"), "archive lacks class \(name)")
        }
        #expect(AllowList.orders.classNames == ["IPCSecureCoding.OrderObject", "IPCSecureCoding.LineItemObject", "NSArray", "NSDate"])
    }

    @Test func rootClassOutsideTheAllowListIsRefused() throws {
        let bytes = try codec.encode(OrderObject(Order.sample(approximateSize: 0)))
        let error = expectIPCError(.disallowedType) { _ = try codec.decode(bytes, allowing: baskets) }
        #expect(error?.message.contains("IPCSecureCoding.OrderObject") == true)
    }

    /// The unguarded unarchiver would trap on this archive (see `unguardedUnarchiverTraps`).
    @Test func editedClassNameOutsideTheAllowListIsRefused() throws {
        let bytes = try codec.encode(OrderObject(Order.sample(approximateSize: 300)))
            .replacingText("<string>IPCSecureCoding.LineItemObject</string>", with: "<string>IPCSecureCodingTests.CouponObject</string>")
        let error = expectIPCError(.disallowedType) { _ = try codec.decode(bytes, allowing: orders) }
        #expect(error?.message.contains("IPCSecureCodingTests.CouponObject") == true)
    }

    @Test func containerWithOneDisallowedElementIsRefused() throws {
        let line = LineItemObject(Order.LineItem(sku: "A", quantity: 1, unitPriceCents: 5))
        let basket = BasketObject(contents: [line, CouponObject(code: "FREE"), line])
        let error = expectIPCError(.disallowedType) { _ = try codec.decode(codec.encode(basket), allowing: baskets) }
        #expect(error?.message.contains("IPCSecureCodingTests.CouponObject") == true)
        #expect(error?.message.contains("object ") == true)
    }

    /// An allowed class where `init(coder:)` expects another: `decodeObject(of: [LineItemObject.self], …)`
    /// would trap on Linux; `decodeAllowedObject` turns it into a failed decode.
    @Test func allowedClassInTheWrongPlaceIsMalformedNotATrap() throws {
        let bytes = try codec.encode(OrderObject(Order.sample(approximateSize: 300)))
            .replacingText("<string>IPCSecureCoding.LineItemObject</string>", with: "<string>NSDate</string>")
        expectIPCError(.malformedPayload) { _ = try codec.decode(bytes, allowing: orders) }
    }

    @Test func foundationClassWithAnUnsafeDecoderIsRefusedEvenIfAllowed() throws {
        let bytes = try codec.encode(OrderObject(Order.sample(approximateSize: 300)))
            .replacingText("<string>IPCSecureCoding.LineItemObject</string>", with: "<string>NSString</string>")
        var allowList = orders
        allowList.allow(class: NSString.self)
        let error = expectIPCError(.disallowedType) { _ = try codec.decode(bytes, allowing: allowList) }
        #expect(error?.message.contains("Foundation class NSString") == true)
    }

    @Test func classHintOutsideTheAllowListIsRefused() {
        let bytes = CraftedArchive.archive([
            CraftedArchive.array(classAt: 2, elements: []),
            "<dict><key>$classhints</key><array><string>NSUUID</string></array><key>$classname</key><string>NSArray</string></dict>",
        ])
        let error = expectIPCError(.disallowedType) { _ = try codec.decode(bytes, allowing: orders) }
        #expect(error?.message.contains("NSUUID") == true)
    }

    @Test func rootThatIsNotAMessageIsRefused() throws {
        let archiver = NSKeyedArchiver(requiringSecureCoding: true)
        archiver.outputFormat = .xml
        archiver.encode([LineItemObject(Order.LineItem(sku: "A", quantity: 1, unitPriceCents: 5))], forKey: NSKeyedArchiveRootObjectKey)
        archiver.finishEncoding()
        expectIPCError(.disallowedType) { _ = try codec.decode([UInt8](archiver.encodedData), allowing: orders) }
    }

    @Test func referenceOutOfRangeIsMalformed() {
        let bytes = CraftedArchive.archive([CraftedArchive.array(classAt: 2, elements: [999_999]), CraftedArchive.classDescription("NSArray")])
        let error = expectIPCError(.malformedPayload) { _ = try codec.decode(bytes, allowing: orders) }
        #expect(error?.message.contains("999999") == true)
    }

    @Test func negativeReferenceIsMalformed() {
        let bytes = CraftedArchive.archive([CraftedArchive.array(classAt: 2, elements: [-1]), CraftedArchive.classDescription("NSArray")])
        expectIPCError(.malformedPayload) { _ = try codec.decode(bytes, allowing: orders) }
    }

    @Test func rootReferenceOutOfRangeIsMalformed() {
        let bytes = CraftedArchive.archive([CraftedArchive.classDescription("NSArray")], root: 7)
        expectIPCError(.malformedPayload) { _ = try codec.decode(bytes, allowing: orders) }
    }

    /// The Linux unarchiver force-unwraps the class of an object whose `$class` is not a class description.
    @Test func classReferenceToSomethingElseIsMalformed() {
        let bytes = CraftedArchive.archive([CraftedArchive.array(classAt: 2, elements: []), "<string>NSArray</string>"])
        expectIPCError(.malformedPayload) { _ = try codec.decode(bytes, allowing: orders) }
    }

    /// The Linux unarchiver would recurse until the stack overflows.
    @Test func referenceCycleIsMalformed() {
        let bytes = CraftedArchive.archive([
            CraftedArchive.array(classAt: 3, elements: [2]),
            CraftedArchive.array(classAt: 3, elements: [1]),
            CraftedArchive.classDescription("NSArray"),
        ])
        let error = expectIPCError(.malformedPayload) { _ = try codec.decode(bytes, allowing: orders) }
        #expect(error?.message.contains("recurse") == true)
    }

    /// Shared objects are fine: the unarchiver decodes each once.
    @Test func sharedObjectsDecode() throws {
        let line = LineItemObject(Order.LineItem(sku: "A", quantity: 1, unitPriceCents: 5))
        let decoded = try #require(try codec.decode(codec.encode(BasketObject(contents: [line, line, line])), allowing: baskets) as? BasketObject)
        #expect(decoded.contents.count == 3)
        #expect(decoded.contents[0] === decoded.contents[2])
    }

    /// A dictionary with more keys than values reads out of bounds in the Linux `NSDictionary.init(coder:)`.
    /// Object 0 is `$null`, 3 to 5 are strings, 6 is an array: only the strings are plain values.
    @Test(arguments: [
        (keys: [3, 4], values: [5]),
        (keys: [3], values: [0]),
        (keys: [3], values: [6]),
    ])
    func dictionaryThatCouldReadOutOfBoundsIsMalformed(keys: [Int], values: [Int]) {
        let bytes = CraftedArchive.archive([
            CraftedArchive.dictionary(classAt: 2, keys: keys, values: values),
            CraftedArchive.classDescription("NSDictionary"),
            "<string>a</string>", "<string>b</string>", "<string>x</string>",
            CraftedArchive.array(classAt: 7, elements: []),
            CraftedArchive.classDescription("NSArray"),
        ])
        let error = expectIPCError(.malformedPayload) { _ = try codec.decode(bytes, allowing: baskets) }
        #expect(error?.message.contains("plain values") == true)
    }

    @Test func objectGraphOfTenThousandLevelsIsRefusedWithoutRecursion() {
        let levels = 10_000
        let classIndex = levels + 1
        let objects = (1...levels).map { index in
            CraftedArchive.array(classAt: classIndex, elements: index < levels ? [index + 1] : [])
        } + [CraftedArchive.classDescription("NSArray")]
        let bytes = CraftedArchive.archive(objects)
        let limits = DecodingLimits(maximumPayloadLength: 16 << 20)
        expectIPCError(.nestingTooDeep) { _ = try codec.decode(bytes, allowing: orders, limits: limits) }
    }

    @Test func objectGraphUpToTheLimitDecodesAndOneMoreIsRefused() throws {
        func chain(_ levels: Int) -> [UInt8] {
            CraftedArchive.archive((1...levels).map { index in
                CraftedArchive.array(classAt: levels + 1, elements: index < levels ? [index + 1] : [])
            } + [CraftedArchive.classDescription("NSArray")])
        }
        // The root is an NSArray, not a message, so a chain that passes the guard ends in disallowedType.
        let limits = DecodingLimits(maximumDepth: 8)
        expectIPCError(.disallowedType) { _ = try codec.decode(chain(8), allowing: orders, limits: limits) }
        expectIPCError(.nestingTooDeep) { _ = try codec.decode(chain(9), allowing: orders, limits: limits) }
    }

    @Test func tenThousandLevelsOfXMLAreRefusedWithoutRecursion() {
        let bytes = [UInt8]("<plist>" + String(repeating: "<array>", count: 10_000) + String(repeating: "</array>", count: 10_000) + "</plist>")
        expectIPCError(.nestingTooDeep) { _ = try codec.decode(bytes, allowing: orders) }
    }

    @Test func binaryArchiveIsRefused() throws {
        let bytes = try [UInt8](NSKeyedArchiver.archivedData(withRootObject: OrderObject(Order.sample(approximateSize: 0)), requiringSecureCoding: true))
        #expect(bytes.starts(with: [UInt8]("bplist")))
        let error = expectIPCError(.malformedPayload) { _ = try codec.decode(bytes, allowing: orders) }
        #expect(error?.message.contains("XML") == true)
    }

    @Test func everyTruncationIsMalformed() throws {
        let bytes = try codec.encode(OrderObject(Order.sample(approximateSize: 300)))
        for length in 0..<bytes.count where !bytes.isWhitespace(from: length) {
            expectIPCError(.malformedPayload) { _ = try codec.decode(Array(bytes[..<length]), allowing: orders) }
        }
    }

    @Test func garbageIsMalformed() {
        var generator = SplitMix64(seed: 0xA2C41)
        var samples: [[UInt8]] = (0..<200).map { _ in
            (0..<Int.random(in: 1...512, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        }
        samples += [
            [UInt8]("hello"), [UInt8]("<plist><array/></plist>"), [UInt8]("<plist><dict/></plist>"),
            [UInt8]("<plist><dict><key>$archiver</key><string>NSKeyedArchiver</string></dict></plist>"),
            CraftedArchive.archive([]), CraftedArchive.archive([], root: 0),
        ]
        for sample in samples {
            expectIPCError(.malformedPayload) { _ = try codec.decode(sample, allowing: orders) }
        }
    }

    @Test func payloadOverTheLimitIsRefusedBeforeParsing() throws {
        let bytes = try codec.encode(OrderObject(Order.sample(approximateSize: 4096)))
        let limits = DecodingLimits(maximumPayloadLength: bytes.count - 1)
        expectIPCError(.payloadTooLarge) { _ = try codec.decode(bytes, allowing: orders, limits: limits) }
        #expect(try codec.decode(bytes, allowing: orders, limits: DecodingLimits(maximumPayloadLength: bytes.count)) is OrderObject)
    }

    @Test func codableMessageIsNotCarried() {
        expectIPCError(.unsupportedOperation) { _ = try codec.encode(Order.sample(approximateSize: 0)) }
    }

    /// Why the guard exists: on Linux the unguarded unarchiver kills the process when an archive
    /// names a class outside the allowed set. If this starts failing, Foundation has learned to
    /// throw instead, and the guard could be simplified.
    @Test func unguardedUnarchiverTraps() async {
        await #expect(processExitsWith: .failure) {
            let archiver = NSKeyedArchiver(requiringSecureCoding: true)
            archiver.encode(CouponObject(code: "FREE"), forKey: NSKeyedArchiveRootObjectKey)
            archiver.finishEncoding()
            _ = try? NSKeyedUnarchiver.unarchivedObject(ofClasses: [OrderObject.self], from: archiver.encodedData)
        }
    }
}
