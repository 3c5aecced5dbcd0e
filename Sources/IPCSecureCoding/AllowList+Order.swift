import Foundation

extension AllowList {
    /// Everything the example model needs under every codec: ``Order`` and ``MessageList`` for
    /// the Codable codecs; ``OrderObject``, ``LineItemObject``, and the `NSArray` and `NSDate`
    /// they archive, for the keyed-archive codec.
    /// Built once: naming the classes (`NSStringFromClass`) costs more than decoding a small order.
    public static let orders = AllowList([Order.self, MessageList.self], classes: [OrderObject.self, LineItemObject.self, NSArray.self, NSDate.self])
}
