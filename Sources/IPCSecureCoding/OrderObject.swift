public import Foundation

/// ``Order`` as an `NSSecureCoding` class, for the keyed-archive codec. Its `init(coder:)`
/// decodes children with `decodeAllowedObject(of:forKey:)`, as that codec requires.
public final class OrderObject: NSObject, NSSecureCoding, SecureMessage {
    public static var supportsSecureCoding: Bool { true }

    public let id: UInt64
    public let customer: String
    public let items: [LineItemObject]
    public let tags: [String]
    public let placedAt: Date
    public let attachment: Data

    public init(_ order: Order) {
        id = order.id
        customer = order.customer
        items = order.items.map(LineItemObject.init)
        tags = order.tags
        placedAt = order.placedAt
        attachment = order.attachment
    }

    /// The same order as a value.
    public var order: Order {
        Order(id: id, customer: customer, items: items.map(\.lineItem), tags: tags, placedAt: placedAt, attachment: attachment)
    }

    public func encode(with coder: NSCoder) {
        coder.encode(Int64(bitPattern: id), forKey: "id")
        coder.encode(customer, forKey: "customer")
        coder.encode(items, forKey: "items")
        coder.encode(tags, forKey: "tags")
        coder.encode(placedAt, forKey: "placedAt")
        coder.encode(attachment, forKey: "attachment")
    }

    public init?(coder: NSCoder) {
        guard let customer = coder.decodeAllowedObject(of: String.self, forKey: "customer"),
            let items = coder.decodeAllowedObject(of: [LineItemObject].self, forKey: "items"),
            let tags = coder.decodeAllowedObject(of: [String].self, forKey: "tags"),
            let placedAt = coder.decodeAllowedObject(of: Date.self, forKey: "placedAt"),
            let attachment = coder.decodeAllowedObject(of: Data.self, forKey: "attachment")
        else {
            return nil
        }
        self.id = UInt64(bitPattern: coder.decodeInt64(forKey: "id"))
        self.customer = customer
        self.items = items
        self.tags = tags
        self.placedAt = placedAt
        self.attachment = attachment
    }
}

/// ``Order/LineItem`` as an `NSSecureCoding` class.
public final class LineItemObject: NSObject, NSSecureCoding, Sendable {
    public static var supportsSecureCoding: Bool { true }

    public let sku: String
    public let quantity: Int
    public let unitPriceCents: Int64

    public init(_ lineItem: Order.LineItem) {
        sku = lineItem.sku
        quantity = lineItem.quantity
        unitPriceCents = lineItem.unitPriceCents
    }

    public var lineItem: Order.LineItem {
        Order.LineItem(sku: sku, quantity: quantity, unitPriceCents: unitPriceCents)
    }

    public func encode(with coder: NSCoder) {
        coder.encode(sku, forKey: "sku")
        coder.encode(Int64(quantity), forKey: "quantity")
        coder.encode(unitPriceCents, forKey: "unitPriceCents")
    }

    public init?(coder: NSCoder) {
        guard let sku = coder.decodeAllowedObject(of: String.self, forKey: "sku") else { return nil }
        self.sku = sku
        self.quantity = Int(coder.decodeInt64(forKey: "quantity"))
        self.unitPriceCents = coder.decodeInt64(forKey: "unitPriceCents")
    }
}
