import Foundation
import IPCCore
import IPCSecureCoding
import IPCTestSupport
import Testing

/// Replays the payload fixtures of `Tests/Fixtures/fuzz-regressions/` through each codec, as the
/// fuzz targets decode them: every payload either decodes to a type the allow-list names or throws
/// an ``IPCError``, and an empty allow-list decodes nothing. A payload that makes Foundation trap
/// takes the test process down, which is the failure this replay is there to catch.
@Suite(.offTheCooperativePool) struct PayloadFuzzRegressionTests {
    static let json = FuzzFixture.all(in: "json")
    static let propertyList = FuzzFixture.all(in: "propertyList")
    static let keyedArchive = FuzzFixture.all(in: "keyedArchive")
    static let binaryCodable = FuzzFixture.all(in: "binaryCodable")

    @Test func fixturesArePresent() {
        #expect(Self.json.count >= 10, "JSON fixtures under \(FuzzFixture.root.path)")
        #expect(Self.propertyList.count >= 10, "property-list fixtures under \(FuzzFixture.root.path)")
        #expect(Self.keyedArchive.count >= 10, "keyed-archive fixtures under \(FuzzFixture.root.path)")
        #expect(Self.binaryCodable.count >= 10, "binary Codable fixtures under \(FuzzFixture.root.path)")
    }

    @Test(arguments: json)
    func jsonFixture(_ fixture: FuzzFixture) {
        replay(fixture, codec: .json)
    }

    @Test(arguments: propertyList)
    func propertyListFixture(_ fixture: FuzzFixture) {
        replay(fixture, codec: .propertyList)
    }

    @Test(arguments: keyedArchive)
    func keyedArchiveFixture(_ fixture: FuzzFixture) {
        replay(fixture, codec: .keyedArchive)
    }

    @Test(arguments: binaryCodable)
    func binaryCodableFixture(_ fixture: FuzzFixture) {
        replay(fixture, codec: .binaryCodable)
    }

    private func replay(_ fixture: FuzzFixture, codec: some PayloadCodec) {
        for (name, allowList) in [("orders", AllowList.orders), ("empty", AllowList())] {
            do {
                let message = try codec.decode(fixture.bytes, allowing: allowList)
                let typeName = type(of: message).typeName
                #expect(
                    allowList.typeNames.contains(typeName) || allowList.classNames.contains(typeName),
                    "\(fixture.testDescription), allow-list \(name): decoded a \(typeName)"
                )
            } catch is IPCError {
            } catch {
                Issue.record("\(fixture.testDescription), allow-list \(name): \(type(of: error)) is not an IPCError: \(error)")
            }
        }
    }
}
