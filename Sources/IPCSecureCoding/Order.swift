public import Foundation

/// The example message of tests and benchmarks: an order with line items, tags, a timestamp and a
/// small binary attachment, as a Codable value. ``OrderObject`` is the same model as an
/// `NSSecureCoding` class for the keyed-archive codec.
public struct Order: CodableMessage, Hashable {
    public static var typeName: String { "ipcbench.Order" }

    public struct LineItem: Codable, Hashable, Sendable {
        public var sku: String
        public var quantity: Int
        /// The unit price in cents, so that every codec round-trips it exactly.
        public var unitPriceCents: Int64

        public init(sku: String, quantity: Int, unitPriceCents: Int64) {
            self.sku = sku
            self.quantity = quantity
            self.unitPriceCents = unitPriceCents
        }
    }

    public var id: UInt64
    public var customer: String
    public var items: [LineItem]
    public var tags: [String]
    public var placedAt: Date
    public var attachment: Data

    public init(id: UInt64, customer: String, items: [LineItem], tags: [String], placedAt: Date, attachment: Data) {
        self.id = id
        self.customer = customer
        self.items = items
        self.tags = tags
        self.placedAt = placedAt
        self.attachment = attachment
    }
}

extension Order {
    /// Bytes of JSON for the sample order without line items, and for each of its line items.
    private static let jsonBaseLength = 183
    private static let jsonLineItemLength = 56

    /// A deterministic order whose JSON payload is at most `approximateSize` bytes and less than one
    /// line item (56 bytes) short of it; below 239 bytes it has no line items (183 bytes). The other codecs' payloads of the
    /// same order are larger. The timestamp is whole seconds, which every codec keeps exactly.
    public static func sample(approximateSize: Int) -> Order {
        let itemCount = max(0, (approximateSize - jsonBaseLength) / jsonLineItemLength)
        let items = (0..<itemCount).map { index in
            // Fixed-width fields, so that every line item adds the same number of bytes.
            LineItem(sku: "SKU-\(100_000 + index * 7919 % 900_000)", quantity: 1 + index % 9, unitPriceCents: Int64(1000 + index * 37 % 9000))
        }
        return Order(
            id: 4_242_001,
            customer: "Ada Lovelace",
            items: items,
            tags: ["priority", "gift", "eu-west"],
            placedAt: Date(timeIntervalSinceReferenceDate: 757_382_400),
            attachment: Data((0..<16).map { UInt8($0 * 17 & 0xFF) })
        )
    }
}
