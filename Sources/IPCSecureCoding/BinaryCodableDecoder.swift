import Foundation
import IPCCore

private typealias Tag = BinaryCodableFormat.Tag

/// Reads one binary Codable payload in place: no tree is built, each container reads its values
/// straight from the bytes when the decoded type asks for them.
///
/// Every length and count is checked against the bytes that remain before it is used, every
/// composite value checks the nesting limit before anything inside it is read, and stepping over a
/// value (to find a key out of order) takes constant time, without recursion.
final class BinaryCodableReader {
    /// Where a keyed container at one level expects its next key: decoded types ask for their keys
    /// in the order they were encoded, so the next entry is nearly always the one asked for.
    struct KeyHint {
        /// The offset of the container's first entry, which names the container; -1 for none.
        var container: Int
        var index: Int
        var offset: Int
    }

    let base: UnsafePointer<UInt8>
    let count: Int
    let maximumDepth: Int
    let allowList: AllowList
    private let hints: UnsafeMutablePointer<KeyHint>
    private let hintCount: Int

    private init(base: UnsafePointer<UInt8>, count: Int, maximumDepth: Int, allowList: AllowList) {
        self.base = base
        self.count = count
        self.maximumDepth = maximumDepth
        self.allowList = allowList
        hintCount = max(1, min(maximumDepth + 1, 64))
        hints = .allocate(capacity: hintCount)
        hints.initialize(repeating: KeyHint(container: -1, index: 0, offset: 0), count: hintCount)
    }

    deinit {
        hints.deallocate()
    }

    /// Decodes a whole payload: the magic, then one envelope that fills the rest. The type name is
    /// checked against `allowList` before any of the value is read.
    static func decodePayload(_ bytes: UnsafeBufferPointer<UInt8>, allowing allowList: AllowList, maximumDepth: Int) throws -> any CodableMessage {
        let magic = BinaryCodableFormat.magic
        guard let base = bytes.baseAddress, bytes.count > magic.count, bytes[0] == magic[0], bytes[1] == magic[1], bytes[2] == magic[2], bytes[3] == magic[3] else {
            throw BinaryCodableFormat.malformed("not a binary Codable payload (magic 49 50 42 01 expected)", at: 0)
        }
        let reader = BinaryCodableReader(base: base, count: bytes.count, maximumDepth: maximumDepth, allowList: allowList)
        let end = try reader.valueEnd(at: magic.count, end: bytes.count)
        guard end == bytes.count else {
            throw BinaryCodableFormat.malformed("\(bytes.count - end) bytes after the message", at: end)
        }
        return try reader.envelope(at: magic.count, level: 1)
    }

    // MARK: Structure

    @inline(__always)
    func tag(at offset: Int) -> UInt8 {
        base[offset]
    }

    /// Reads a varint below `end`; a value above `Int.max` or longer than 9 bytes is malformed.
    @inline(__always)
    func varint(_ offset: inout Int, end: Int) throws -> Int {
        guard offset < end else { throw truncated(at: offset) }
        let first = base[offset]
        offset += 1
        if first < 0x80 { return Int(first) }
        return try varintTail(Int(first & 0x7F), &offset, end: end)
    }

    private func varintTail(_ low: Int, _ offset: inout Int, end: Int) throws -> Int {
        var value = low
        var shift = 7
        while true {
            guard offset < end else { throw truncated(at: offset) }
            let byte = base[offset]
            offset += 1
            value |= Int(byte & 0x7F) << shift
            if byte < 0x80 { return value }
            shift += 7
            guard shift < 7 * BinaryCodableFormat.maximumVarintLength else {
                throw BinaryCodableFormat.malformed("varint longer than \(BinaryCodableFormat.maximumVarintLength) bytes", at: offset)
            }
        }
    }

    /// Reads a length (varint) and checks that that many bytes remain below `end`.
    @inline(__always)
    func length(_ offset: inout Int, end: Int) throws -> Int {
        let length = try varint(&offset, end: end)
        guard length <= end - offset else {
            throw BinaryCodableFormat.malformed("length \(length) runs past the \(end - offset) bytes left", at: offset)
        }
        return length
    }

    /// Where the value starting at `offset` ends; it must end at or before `end`. Constant time:
    /// a composite value is stepped over by its body length.
    func valueEnd(at offset: Int, end: Int) throws -> Int {
        guard offset < end else { throw truncated(at: offset) }
        var position = offset + 1
        let size: Int
        switch base[offset] {
        case Tag.null, Tag.false, Tag.true: size = 0
        case Tag.int, Tag.uint, Tag.double, Tag.date: size = 8
        case Tag.float: size = 4
        case Tag.string, Tag.data, Tag.keyed, Tag.unkeyed, Tag.envelope: size = try varint(&position, end: end)
        default: throw BinaryCodableFormat.malformed("unknown tag 0x\(String(base[offset], radix: 16))", at: offset)
        }
        guard size <= end - position else { throw truncated(at: position) }
        return position + size
    }

    /// Opens a keyed or unkeyed container at `offset` as nesting level `level`: checks the tag and
    /// the level, and that the count can fit in the body (each element takes at least
    /// `minimumElementSize` bytes). Returns where the elements start and where the body ends.
    @inline(__always)
    func openContainer(_ expected: UInt8, at offset: Int, level: Int, minimumElementSize: Int) throws -> (elements: Int, end: Int, count: Int) {
        try expectTag(expected, at: offset)
        guard level <= maximumDepth else { throw tooDeep(at: offset) }
        var position = offset + 1
        let bodyLength = try length(&position, end: count)
        let end = position + bodyLength
        let elements = try varint(&position, end: end)
        guard elements <= (end - position) / minimumElementSize else {
            throw BinaryCodableFormat.malformed("count \(elements) does not fit in the container's \(end - position) bytes", at: offset)
        }
        return (position, end, elements)
    }

    /// Decodes the envelope at `offset` as nesting level `level`: refuses a type name the
    /// allow-list does not name before anything of the value is read.
    func envelope(at offset: Int, level: Int) throws -> any CodableMessage {
        try expectTag(Tag.envelope, at: offset)
        guard level <= maximumDepth else { throw tooDeep(at: offset) }
        var position = offset + 1
        let bodyLength = try length(&position, end: count)
        let end = position + bodyLength
        let nameLength = try length(&position, end: end)
        let typeName = try utf8(at: position, length: nameLength)
        guard let decode = allowList.decoder(forTypeName: typeName) else {
            throw MessageEnvelope.disallowed(typeName)
        }
        position += nameLength
        guard try valueEnd(at: position, end: end) == end else {
            throw BinaryCodableFormat.malformed("envelope of \(typeName.debugDescription) holds more than one value", at: position)
        }
        return try decode(BinaryValueDecoder(reader: self, offset: position, level: level))
    }

    // MARK: Keys

    /// Finds `key` in the keyed container whose entries start at `entries`: first where the last
    /// key found at this level left off, then from the start. Returns the value's bounds.
    /// `advance` records where the next key is expected.
    func find(_ key: String, entries: Int, end: Int, count: Int, level: Int, advance: Bool) throws -> (offset: Int, end: Int)? {
        let hinted = level < hintCount && hints[level].container == entries
        if hinted, hints[level].index < count {
            var position = hints[level].offset
            if let value = try entry(&position, matching: key, end: end) {
                if advance { hints[level] = KeyHint(container: entries, index: hints[level].index + 1, offset: value.end) }
                return value
            }
        }
        var position = entries
        for index in 0..<count {
            if let value = try entry(&position, matching: key, end: end) {
                if advance, level < hintCount { hints[level] = KeyHint(container: entries, index: index + 1, offset: value.end) }
                return value
            }
        }
        guard position == end else {
            throw BinaryCodableFormat.malformed("\(end - position) bytes after the container's \(count) entries", at: position)
        }
        return nil
    }

    /// Reads the entry at `position` and moves past it; returns its value's bounds if its key is `key`.
    @inline(__always)
    private func entry(_ position: inout Int, matching key: String, end: Int) throws -> (offset: Int, end: Int)? {
        let keyLength = try length(&position, end: end)
        let keyStart = position
        position = try valueEnd(at: keyStart + keyLength, end: end)
        let matches =
            key.utf8.withContiguousStorageIfAvailable { utf8 in
                utf8.count == keyLength && (keyLength == 0 || memcmp(utf8.baseAddress!, base + keyStart, keyLength) == 0)
            } ?? key.utf8.elementsEqual(UnsafeBufferPointer(start: base + keyStart, count: keyLength))
        return matches ? (keyStart + keyLength, position) : nil
    }

    /// Every key of a keyed container, in order; throws at the first entry that cannot be read.
    func keys(entries: Int, end: Int, count: Int, _ body: (String) -> Void) throws {
        var position = entries
        for _ in 0..<count {
            let keyLength = try length(&position, end: end)
            body(try utf8(at: position, length: keyLength))
            position = try valueEnd(at: position + keyLength, end: end)
        }
        guard position == end else {
            throw BinaryCodableFormat.malformed("\(end - position) bytes after the container's \(count) entries", at: position)
        }
    }

    // MARK: Values

    @inline(__always)
    private func expectTag(_ expected: UInt8, at offset: Int) throws {
        guard offset < count else { throw truncated(at: offset) }
        guard base[offset] == expected else { throw mismatch(expected, at: offset) }
    }

    @inline(__always)
    private func fixed<T: FixedWidthInteger>(_ type: T.Type, after offset: Int) throws -> T {
        guard MemoryLayout<T>.size <= count - offset - 1 else { throw truncated(at: offset + 1) }
        return T(littleEndian: UnsafeRawPointer(base + offset + 1).loadUnaligned(as: T.self))
    }

    func isTag(_ tag: UInt8, at offset: Int) -> Bool {
        offset < count && base[offset] == tag
    }

    func bool(at offset: Int) throws -> Bool {
        guard offset < count else { throw truncated(at: offset) }
        switch base[offset] {
        case Tag.true: return true
        case Tag.false: return false
        default: throw mismatch(Tag.true, at: offset)
        }
    }

    /// Any integer type, from either integer tag; a value the type cannot hold is malformed.
    func integer<T: FixedWidthInteger>(_ type: T.Type, at offset: Int) throws -> T {
        guard offset < count else { throw truncated(at: offset) }
        let converted: T?
        switch base[offset] {
        case Tag.int: converted = T(exactly: try fixed(Int64.self, after: offset))
        case Tag.uint: converted = T(exactly: try fixed(UInt64.self, after: offset))
        default: throw mismatch(T.isSigned ? Tag.int : Tag.uint, at: offset)
        }
        guard let converted else {
            throw BinaryCodableFormat.malformed("integer out of range for \(T.self)", at: offset)
        }
        return converted
    }

    /// A binary64, or a binary32 widened.
    func double(at offset: Int) throws -> Double {
        if isTag(Tag.float, at: offset) { return Double(try float(at: offset)) }
        try expectTag(Tag.double, at: offset)
        return Double(bitPattern: try fixed(UInt64.self, after: offset))
    }

    func float(at offset: Int) throws -> Float {
        try expectTag(Tag.float, at: offset)
        return Float(bitPattern: try fixed(UInt32.self, after: offset))
    }

    func date(at offset: Int) throws -> Date {
        try expectTag(Tag.date, at: offset)
        return Date(timeIntervalSinceReferenceDate: Double(bitPattern: try fixed(UInt64.self, after: offset)))
    }

    func string(at offset: Int) throws -> String {
        try expectTag(Tag.string, at: offset)
        var position = offset + 1
        let length = try length(&position, end: count)
        return try utf8(at: position, length: length)
    }

    func data(at offset: Int) throws -> Data {
        try expectTag(Tag.data, at: offset)
        var position = offset + 1
        let length = try length(&position, end: count)
        return Data(bytes: base + position, count: length)
    }

    /// Validated UTF-8; the caller has checked that `length` bytes remain.
    private func utf8(at offset: Int, length: Int) throws -> String {
        guard let string = String(validating: UnsafeBufferPointer(start: base + offset, count: length), as: UTF8.self) else {
            throw BinaryCodableFormat.malformed("invalid UTF-8 in a string of \(length) bytes", at: offset)
        }
        return string
    }

    /// A value of any `Decodable` type that ends at `end`. Dates, data and envelopes have their own
    /// encodings; everything else decodes itself from a ``BinaryValueDecoder`` at nesting level
    /// `level` (the level of the container holding the value).
    func decode<T: Decodable>(_ type: T.Type, at offset: Int, level: Int) throws -> T {
        if T.self == Date.self { return try date(at: offset) as! T }
        if T.self == Data.self { return try data(at: offset) as! T }
        if T.self == MessageEnvelope.self { return MessageEnvelope(try envelope(at: offset, level: level + 1)) as! T }
        return try T(from: BinaryValueDecoder(reader: self, offset: offset, level: level))
    }

    // MARK: Errors

    func truncated(at offset: Int) -> IPCError {
        BinaryCodableFormat.malformed("truncated", at: offset)
    }

    private func tooDeep(at offset: Int) -> IPCError {
        IPCError(code: .nestingTooDeep, message: "binary Codable payload nests deeper than the maximum of \(maximumDepth) levels at byte \(offset)")
    }

    private func mismatch(_ expected: UInt8, at offset: Int) -> IPCError {
        BinaryCodableFormat.malformed("expected tag 0x\(String(expected, radix: 16)), found 0x\(String(base[offset], radix: 16))", at: offset)
    }
}

/// The `Decoder` for one value: the reader, where the value starts, and the nesting level of the
/// container that holds it. Three words, so an `any Decoder` of it needs no allocation.
struct BinaryValueDecoder: Decoder {
    let reader: BinaryCodableReader
    let offset: Int
    let level: Int

    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [.allowList: reader.allowList] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        KeyedDecodingContainer(try BinaryKeyedDecodingContainer<Key>(reader: reader, at: offset, level: level + 1))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        try BinaryUnkeyedDecodingContainer(reader: reader, at: offset, level: level + 1)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        BinarySingleValueDecodingContainer(reader: reader, offset: offset, level: level)
    }
}

/// What unkeyed and single-value containers share: where the next value is, then the reader's
/// typed reads.
protocol BinaryValueSource {
    var reader: BinaryCodableReader { get }
    /// The nesting level of this container (the level its values are decoded at).
    var level: Int { get }
    /// Where the next value starts; an unkeyed container moves past it.
    func nextValue() throws -> Int
}

extension BinaryValueSource {
    func decode(_ type: Bool.Type) throws -> Bool { try reader.bool(at: nextValue()) }
    func decode(_ type: String.Type) throws -> String { try reader.string(at: nextValue()) }
    func decode(_ type: Double.Type) throws -> Double { try reader.double(at: nextValue()) }
    func decode(_ type: Float.Type) throws -> Float { try reader.float(at: nextValue()) }
    func decode(_ type: Int.Type) throws -> Int { try reader.integer(type, at: nextValue()) }
    func decode(_ type: Int8.Type) throws -> Int8 { try reader.integer(type, at: nextValue()) }
    func decode(_ type: Int16.Type) throws -> Int16 { try reader.integer(type, at: nextValue()) }
    func decode(_ type: Int32.Type) throws -> Int32 { try reader.integer(type, at: nextValue()) }
    func decode(_ type: Int64.Type) throws -> Int64 { try reader.integer(type, at: nextValue()) }
    func decode(_ type: UInt.Type) throws -> UInt { try reader.integer(type, at: nextValue()) }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try reader.integer(type, at: nextValue()) }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try reader.integer(type, at: nextValue()) }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try reader.integer(type, at: nextValue()) }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try reader.integer(type, at: nextValue()) }
    func decode<T: Decodable>(_ type: T.Type) throws -> T { try reader.decode(type, at: nextValue(), level: level) }
}

struct BinarySingleValueDecodingContainer: SingleValueDecodingContainer, BinaryValueSource {
    let reader: BinaryCodableReader
    let offset: Int
    let level: Int

    var codingPath: [any CodingKey] { [] }

    func nextValue() -> Int { offset }

    func decodeNil() -> Bool { reader.isTag(BinaryCodableFormat.Tag.null, at: offset) }
}

/// A class, so that its cursor moves through the non-mutating reads of ``BinaryValueSource``;
/// an `any UnkeyedDecodingContainer` of it holds just the reference.
final class BinaryUnkeyedDecodingContainer: UnkeyedDecodingContainer, BinaryValueSource {
    let reader: BinaryCodableReader
    let level: Int
    private let end: Int
    private let elementCount: Int
    private var offset: Int
    private(set) var currentIndex = 0

    init(reader: BinaryCodableReader, at offset: Int, level: Int) throws {
        self.reader = reader
        self.level = level
        (self.offset, end, elementCount) = try reader.openContainer(BinaryCodableFormat.Tag.unkeyed, at: offset, level: level, minimumElementSize: 1)
    }

    var codingPath: [any CodingKey] { [] }
    var count: Int? { elementCount }
    var isAtEnd: Bool { currentIndex >= elementCount }

    func nextValue() throws -> Int {
        guard currentIndex < elementCount else {
            throw BinaryCodableFormat.malformed("read past the last of \(elementCount) elements", at: offset)
        }
        let start = offset
        offset = try reader.valueEnd(at: start, end: end)
        currentIndex += 1
        if currentIndex == elementCount, offset != end {
            throw BinaryCodableFormat.malformed("\(end - offset) bytes after the last of \(elementCount) elements", at: offset)
        }
        return start
    }

    func decodeNil() throws -> Bool {
        guard currentIndex < elementCount, reader.isTag(BinaryCodableFormat.Tag.null, at: offset) else { return false }
        _ = try nextValue()
        return true
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        KeyedDecodingContainer(try BinaryKeyedDecodingContainer<NestedKey>(reader: reader, at: nextValue(), level: level + 1))
    }

    func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        try BinaryUnkeyedDecodingContainer(reader: reader, at: nextValue(), level: level + 1)
    }

    func superDecoder() throws -> any Decoder {
        BinaryValueDecoder(reader: reader, offset: try nextValue(), level: level)
    }
}

struct BinaryKeyedDecodingContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let reader: BinaryCodableReader
    let level: Int
    private let entries: Int
    private let end: Int
    private let entryCount: Int

    init(reader: BinaryCodableReader, at offset: Int, level: Int) throws {
        self.reader = reader
        self.level = level
        // An entry takes at least a key length and a tag.
        (entries, end, entryCount) = try reader.openContainer(BinaryCodableFormat.Tag.keyed, at: offset, level: level, minimumElementSize: 2)
    }

    var codingPath: [any CodingKey] { [] }

    /// The keys in wire order. `allKeys` cannot throw: if an entry cannot be read, the keys before
    /// it are followed by one that no entry has, so that a type decoding every key (a dictionary)
    /// fails as malformed instead of taking the keys that could be read for all of them.
    var allKeys: [Key] {
        var keys: [String] = []
        do {
            try reader.keys(entries: entries, end: end, count: entryCount) { keys.append($0) }
        } catch {
            keys.append(Self.unreadableKey)
        }
        return keys.compactMap { Key(stringValue: $0) }
    }

    static var unreadableKey: String { "\u{FFFD}binaryCodable: unreadable entry" }

    /// True for an entry that cannot be read, so that the decode that follows fails as malformed.
    func contains(_ key: Key) -> Bool {
        do {
            return try reader.find(key.stringValue, entries: entries, end: end, count: entryCount, level: level, advance: false) != nil
        } catch {
            return true
        }
    }

    /// Where the value for `key` starts; a missing key is malformed.
    private func value(_ key: Key) throws -> Int {
        try value(key.stringValue, advance: true)
    }

    private func value(_ name: String, advance: Bool) throws -> Int {
        guard let value = try reader.find(name, entries: entries, end: end, count: entryCount, level: level, advance: advance) else {
            throw BinaryCodableFormat.malformed("no value for key \(name.debugDescription) in the container", at: entries)
        }
        return value.offset
    }

    func decodeNil(forKey key: Key) throws -> Bool { reader.isTag(BinaryCodableFormat.Tag.null, at: try value(key.stringValue, advance: false)) }
    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { try reader.bool(at: value(key)) }
    func decode(_ type: String.Type, forKey key: Key) throws -> String { try reader.string(at: value(key)) }
    func decode(_ type: Double.Type, forKey key: Key) throws -> Double { try reader.double(at: value(key)) }
    func decode(_ type: Float.Type, forKey key: Key) throws -> Float { try reader.float(at: value(key)) }
    func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try reader.integer(type, at: value(key)) }
    func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { try reader.integer(type, at: value(key)) }
    func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { try reader.integer(type, at: value(key)) }
    func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { try reader.integer(type, at: value(key)) }
    func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { try reader.integer(type, at: value(key)) }
    func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { try reader.integer(type, at: value(key)) }
    func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { try reader.integer(type, at: value(key)) }
    func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { try reader.integer(type, at: value(key)) }
    func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { try reader.integer(type, at: value(key)) }
    func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { try reader.integer(type, at: value(key)) }
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T { try reader.decode(type, at: value(key), level: level) }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        KeyedDecodingContainer(try BinaryKeyedDecodingContainer<NestedKey>(reader: reader, at: value(key), level: level + 1))
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        try BinaryUnkeyedDecodingContainer(reader: reader, at: value(key), level: level + 1)
    }

    func superDecoder() throws -> any Decoder {
        BinaryValueDecoder(reader: reader, offset: try value("super", advance: true), level: level)
    }

    func superDecoder(forKey key: Key) throws -> any Decoder {
        BinaryValueDecoder(reader: reader, offset: try value(key), level: level)
    }
}
