import Foundation
import IPCCore

private typealias Tag = BinaryCodableFormat.Tag

/// Encodes a value in the binary Codable format. Codable lets a type fill its containers in any
/// order, and a composite value's length comes before its body, so the value is first gathered as
/// a tree of ``BinaryEncodingSlot``s, then written out. (Decoding, the side that must be fast, reads
/// in place.)
enum BinaryCodableEncoding {
    /// The whole payload of `envelope`: the magic, then the envelope.
    static func encodePayload(_ envelope: MessageEnvelope) throws -> [UInt8] {
        let slot = BinaryEncodingSlot()
        try slot.store(envelope)
        var bytes = BinaryCodableFormat.magic
        slot.write(to: &bytes)
        return bytes
    }
}

/// Where one encoded value goes.
final class BinaryEncodingSlot {
    enum Content {
        /// Nothing was encoded: written as an empty keyed container, as JSON writes `{}`.
        case empty
        /// A scalar, tag included.
        case scalar([UInt8])
        case keyed(KeyedEntries)
        case unkeyed(UnkeyedElements)
        case envelope(typeName: String, value: BinaryEncodingSlot)
    }

    final class KeyedEntries {
        var entries: [(key: String, value: BinaryEncodingSlot)] = []
    }

    final class UnkeyedElements {
        var elements: [BinaryEncodingSlot] = []
    }

    var content = Content.empty

    func keyed() -> KeyedEntries {
        if case .keyed(let entries) = content { return entries }
        let entries = KeyedEntries()
        content = .keyed(entries)
        return entries
    }

    func unkeyed() -> UnkeyedElements {
        if case .unkeyed(let elements) = content { return elements }
        let elements = UnkeyedElements()
        content = .unkeyed(elements)
        return elements
    }

    // MARK: Scalars

    func storeNil() { content = .scalar([Tag.null]) }
    func store(_ value: Bool) { content = .scalar([value ? Tag.true : Tag.false]) }
    func store(_ value: Double) { content = .scalar(Self.fixed(Tag.double, value.bitPattern)) }
    func store(_ value: Float) { content = .scalar(Self.fixed(Tag.float, value.bitPattern)) }

    func store<T: FixedWidthInteger>(integer value: T) {
        content = .scalar(T.isSigned ? Self.fixed(Tag.int, Int64(value)) : Self.fixed(Tag.uint, UInt64(value)))
    }

    func store(_ value: String) {
        content = .scalar(Self.lengthPrefixed(Tag.string, Array(value.utf8)))
    }

    /// Dates, data and envelopes have their own encodings; any other value encodes itself.
    func store<T: Encodable>(_ value: T) throws {
        switch value {
        case let date as Date:
            content = .scalar(Self.fixed(Tag.date, date.timeIntervalSinceReferenceDate.bitPattern))
        case let data as Data:
            content = .scalar(Self.lengthPrefixed(Tag.data, [UInt8](data)))
        case let envelope as MessageEnvelope:
            let inner = BinaryEncodingSlot()
            try envelope.message.encode(to: BinaryValueEncoder(slot: inner))
            content = .envelope(typeName: type(of: envelope.message).typeName, value: inner)
        default:
            try value.encode(to: BinaryValueEncoder(slot: self))
        }
    }

    private static func fixed<T: FixedWidthInteger>(_ tag: UInt8, _ value: T) -> [UInt8] {
        var bytes = [tag]
        withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
        return bytes
    }

    private static func lengthPrefixed(_ tag: UInt8, _ body: [UInt8]) -> [UInt8] {
        var bytes = [tag]
        BinaryCodableFormat.appendVarint(body.count, to: &bytes)
        return bytes + body
    }

    // MARK: Writing

    func write(to bytes: inout [UInt8]) {
        var body: [UInt8] = []
        let tag: UInt8
        switch content {
        case .scalar(let scalar):
            bytes += scalar
            return
        case .empty:
            tag = Tag.keyed
            BinaryCodableFormat.appendVarint(0, to: &body)
        case .keyed(let keyed):
            tag = Tag.keyed
            BinaryCodableFormat.appendVarint(keyed.entries.count, to: &body)
            for (key, value) in keyed.entries {
                BinaryCodableFormat.appendVarint(key.utf8.count, to: &body)
                body += key.utf8
                value.write(to: &body)
            }
        case .unkeyed(let unkeyed):
            tag = Tag.unkeyed
            BinaryCodableFormat.appendVarint(unkeyed.elements.count, to: &body)
            for element in unkeyed.elements {
                element.write(to: &body)
            }
        case .envelope(let typeName, let value):
            tag = Tag.envelope
            BinaryCodableFormat.appendVarint(typeName.utf8.count, to: &body)
            body += typeName.utf8
            value.write(to: &body)
        }
        bytes.append(tag)
        BinaryCodableFormat.appendVarint(body.count, to: &bytes)
        bytes += body
    }
}

struct BinaryValueEncoder: Encoder {
    let slot: BinaryEncodingSlot

    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        KeyedEncodingContainer(BinaryKeyedEncodingContainer<Key>(entries: slot.keyed()))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        BinaryUnkeyedEncodingContainer(elements: slot.unkeyed())
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        BinarySingleValueEncodingContainer(slot: slot)
    }
}

/// What unkeyed and single-value containers share: the slot the next value goes to, then the
/// slot's typed stores.
protocol BinaryValueSink {
    func nextSlot() -> BinaryEncodingSlot
}

extension BinaryValueSink {
    func encodeNil() { nextSlot().storeNil() }
    func encode(_ value: Bool) { nextSlot().store(value) }
    func encode(_ value: String) { nextSlot().store(value) }
    func encode(_ value: Double) { nextSlot().store(value) }
    func encode(_ value: Float) { nextSlot().store(value) }
    func encode(_ value: Int) { nextSlot().store(integer: value) }
    func encode(_ value: Int8) { nextSlot().store(integer: value) }
    func encode(_ value: Int16) { nextSlot().store(integer: value) }
    func encode(_ value: Int32) { nextSlot().store(integer: value) }
    func encode(_ value: Int64) { nextSlot().store(integer: value) }
    func encode(_ value: UInt) { nextSlot().store(integer: value) }
    func encode(_ value: UInt8) { nextSlot().store(integer: value) }
    func encode(_ value: UInt16) { nextSlot().store(integer: value) }
    func encode(_ value: UInt32) { nextSlot().store(integer: value) }
    func encode(_ value: UInt64) { nextSlot().store(integer: value) }
    func encode<T: Encodable>(_ value: T) throws { try nextSlot().store(value) }
}

struct BinarySingleValueEncodingContainer: SingleValueEncodingContainer, BinaryValueSink {
    let slot: BinaryEncodingSlot

    var codingPath: [any CodingKey] { [] }

    func nextSlot() -> BinaryEncodingSlot { slot }
}

struct BinaryUnkeyedEncodingContainer: UnkeyedEncodingContainer, BinaryValueSink {
    let elements: BinaryEncodingSlot.UnkeyedElements

    var codingPath: [any CodingKey] { [] }
    var count: Int { elements.elements.count }

    func nextSlot() -> BinaryEncodingSlot {
        let slot = BinaryEncodingSlot()
        elements.elements.append(slot)
        return slot
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        BinaryValueEncoder(slot: nextSlot()).container(keyedBy: keyType)
    }

    func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        BinaryValueEncoder(slot: nextSlot()).unkeyedContainer()
    }

    func superEncoder() -> any Encoder {
        BinaryValueEncoder(slot: nextSlot())
    }
}

struct BinaryKeyedEncodingContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let entries: BinaryEncodingSlot.KeyedEntries

    var codingPath: [any CodingKey] { [] }

    private func slot(_ key: Key) -> BinaryEncodingSlot {
        slot(named: key.stringValue)
    }

    private func slot(named name: String) -> BinaryEncodingSlot {
        let slot = BinaryEncodingSlot()
        entries.entries.append((name, slot))
        return slot
    }

    func encodeNil(forKey key: Key) { slot(key).storeNil() }
    func encode(_ value: Bool, forKey key: Key) { slot(key).store(value) }
    func encode(_ value: String, forKey key: Key) { slot(key).store(value) }
    func encode(_ value: Double, forKey key: Key) { slot(key).store(value) }
    func encode(_ value: Float, forKey key: Key) { slot(key).store(value) }
    func encode(_ value: Int, forKey key: Key) { slot(key).store(integer: value) }
    func encode(_ value: Int8, forKey key: Key) { slot(key).store(integer: value) }
    func encode(_ value: Int16, forKey key: Key) { slot(key).store(integer: value) }
    func encode(_ value: Int32, forKey key: Key) { slot(key).store(integer: value) }
    func encode(_ value: Int64, forKey key: Key) { slot(key).store(integer: value) }
    func encode(_ value: UInt, forKey key: Key) { slot(key).store(integer: value) }
    func encode(_ value: UInt8, forKey key: Key) { slot(key).store(integer: value) }
    func encode(_ value: UInt16, forKey key: Key) { slot(key).store(integer: value) }
    func encode(_ value: UInt32, forKey key: Key) { slot(key).store(integer: value) }
    func encode(_ value: UInt64, forKey key: Key) { slot(key).store(integer: value) }
    func encode<T: Encodable>(_ value: T, forKey key: Key) throws { try slot(key).store(value) }

    func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        BinaryValueEncoder(slot: slot(key)).container(keyedBy: keyType)
    }

    func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        BinaryValueEncoder(slot: slot(key)).unkeyedContainer()
    }

    func superEncoder() -> any Encoder {
        BinaryValueEncoder(slot: slot(named: "super"))
    }

    func superEncoder(forKey key: Key) -> any Encoder {
        BinaryValueEncoder(slot: slot(key))
    }
}
