import Foundation
import IPCCore
import IPCSecureCoding

/// One way a receiver decodes payloads: a codec, an allow-list and limits.
public struct PayloadReceiver: Sendable, CustomStringConvertible {
    public var codec: any PayloadCodec
    public var allowListName: String
    public var allowList: AllowList
    public var limits: DecodingLimits

    public init(_ codec: any PayloadCodec, allowing allowList: AllowList, named allowListName: String, limits: DecodingLimits = DecodingLimits()) {
        self.codec = codec
        self.allowList = allowList
        self.allowListName = allowListName
        self.limits = limits
    }

    public var description: String {
        "\(codec.name) codec, allow-list \(allowListName), limits \(limits.maximumPayloadLength) bytes / depth \(limits.maximumDepth)"
    }

    /// The receivers a codec's fuzz target runs every input through: the example model's
    /// allow-list with the default limits and with tight ones (so that the limits are reached by
    /// small inputs), and an empty allow-list, which must refuse everything.
    public static func standard(for codec: any PayloadCodec, extraClasses: [any (NSObject & NSSecureCoding).Type] = []) -> [PayloadReceiver] {
        var orders = AllowList.orders
        for cls in extraClasses {
            orders.allow(class: cls)
        }
        let name = extraClasses.isEmpty ? "orders" : "orders+\(extraClasses.map { NSStringFromClass($0) }.joined(separator: ","))"
        return [
            PayloadReceiver(codec, allowing: orders, named: name),
            PayloadReceiver(codec, allowing: orders, named: name, limits: DecodingLimits(maximumPayloadLength: 2048, maximumDepth: 3)),
            PayloadReceiver(codec, allowing: AllowList(), named: "empty"),
        ]
    }

    /// Runs one libFuzzer input through every receiver; the body of a codec's fuzz target.
    public static func fuzz(_ receivers: [PayloadReceiver], _ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
        let bytes = Array(UnsafeBufferPointer(start: data, count: count))
        for receiver in receivers {
            receiver.check(bytes)
        }
        return 0
    }

    /// Decodes `bytes` and traps (so that libFuzzer reports the input) if the codec breaks its
    /// contract: an error that is not an ``IPCError``, a message of a type the allow-list does not
    /// name (at any depth), a message nested deeper than the limit, a payload above the length
    /// limit that is not refused as such, or a decoded message that cannot be encoded and decoded
    /// again without a trap.
    public func check(_ bytes: [UInt8]) {
        let message: any SecureMessage
        do {
            message = try codec.decode(bytes, allowing: allowList, limits: limits)
        } catch let error as IPCError {
            if bytes.count > limits.maximumPayloadLength {
                precondition(error.code == .payloadTooLarge, "\(self): a payload of \(bytes.count) bytes failed with \(error), expected payloadTooLarge")
            }
            return
        } catch {
            preconditionFailure("\(self): decode threw \(type(of: error)), not IPCError: \(error)")
        }
        precondition(bytes.count <= limits.maximumPayloadLength, "\(self): decoded a payload of \(bytes.count) bytes, above the limit")
        checkAllowed(message)
        let depth = Self.depth(of: message)
        precondition(depth <= limits.maximumDepth, "\(self): decoded a message nested \(depth) deep, above the limit")
        checkReencoding(message)
    }

    private func checkAllowed(_ message: any SecureMessage) {
        let name = type(of: message).typeName
        precondition(
            allowList.typeNames.contains(name) || allowList.classNames.contains(name),
            "\(self): decoded a \(name), which the allow-list does not name"
        )
        if let list = message as? MessageList {
            list.messages.forEach(checkAllowed)
        }
        if let order = message as? OrderObject, !order.items.isEmpty {
            precondition(allowList.classNames.contains(NSStringFromClass(LineItemObject.self)), "\(self): decoded line items the allow-list does not name")
        }
    }

    /// A lower bound on the nesting the codec's scan counted for `message`, so that a message above
    /// the limit proves the scan missed some. For the Codable codecs: objects and arrays in JSON,
    /// `<dict>` and `<array>` in a property list, where an empty `<array/>` does not count;
    /// envelopes and containers in binary Codable. For the keyed archive: the chain of instances
    /// from the root.
    static func depth(of message: any SecureMessage) -> Int {
        switch message {
        case let order as Order:
            // envelope { value { tags [ ], items [ { item } ] } }
            return 2 + (order.items.isEmpty ? (order.tags.isEmpty ? 0 : 1) : 2)
        case let list as MessageList:
            // envelope { value [ elements ] }
            return list.messages.isEmpty ? 1 : 2 + list.messages.map { depth(of: $0) }.max()!
        case let order as OrderObject:
            // OrderObject -> (an array) -> LineItemObject
            return order.items.isEmpty ? 1 : 2
        default:
            return 0
        }
    }

    private func checkReencoding(_ message: any SecureMessage) {
        let encoded: [UInt8]
        do {
            encoded = try codec.encode(message)
        } catch is IPCError {
            return
        } catch {
            preconditionFailure("\(self): encoding a decoded message threw \(type(of: error)), not IPCError: \(error)")
        }
        do {
            _ = try codec.decode(encoded, allowing: allowList, limits: DecodingLimits())
        } catch is IPCError {
        } catch {
            preconditionFailure("\(self): decoding a re-encoded message threw \(type(of: error)), not IPCError: \(error)")
        }
    }
}
