import Foundation
import IPCCore
import IPCSecureCoding
import IPCTestSupport
import Testing

@Suite(.offTheCooperativePool) struct OrderTests {
    @Test(arguments: [1024, 4096, 65_536, 1 << 20])
    func sampleIsAboutTheRequestedSizeInJSON(size: Int) throws {
        let bytes = try JSONPayloadCodec().encode(Order.sample(approximateSize: size))
        #expect(bytes.count <= size && bytes.count > size - 56, "JSON of sample(approximateSize: \(size)) is \(bytes.count) bytes")
    }

    @Test func smallSamplesHaveNoLineItems() {
        #expect(Order.sample(approximateSize: 0).items.isEmpty)
        #expect(Order.sample(approximateSize: 64).items.isEmpty)
    }

    @Test func orderObjectCarriesTheSameOrder() {
        let order = Order.sample(approximateSize: 4096)
        #expect(OrderObject(order).order == order)
    }
}
