import IPCCore

/// The constants of the binary Codable payload format (`docs/WIRE-FORMAT.md`, section 4).
///
/// A payload is the magic bytes, then one envelope value. Every value starts with a tag byte; a
/// composite value (keyed, unkeyed, envelope) then gives its body's length, so that any value can
/// be stepped over in constant time, without recursion.
enum BinaryCodableFormat {
    /// `IPB` and format version 1.
    static let magic: [UInt8] = [0x49, 0x50, 0x42, 0x01]

    enum Tag {
        static let null: UInt8 = 0x00
        static let `false`: UInt8 = 0x01
        static let `true`: UInt8 = 0x02
        /// Any signed integer, as an `Int64`, 8 bytes little-endian.
        static let int: UInt8 = 0x03
        /// Any unsigned integer, as a `UInt64`, 8 bytes little-endian.
        static let uint: UInt8 = 0x04
        /// IEEE 754 binary64, 8 bytes little-endian.
        static let double: UInt8 = 0x05
        /// IEEE 754 binary32, 4 bytes little-endian.
        static let float: UInt8 = 0x06
        /// Length (varint), then that many bytes of UTF-8.
        static let string: UInt8 = 0x07
        /// Length (varint), then that many bytes.
        static let data: UInt8 = 0x08
        /// Seconds since 2001-01-01T00:00:00Z as a binary64, 8 bytes little-endian.
        static let date: UInt8 = 0x09
        /// Body length (varint); body: entry count (varint), then each entry's key (length
        /// varint, UTF-8) and value.
        static let keyed: UInt8 = 0x0A
        /// Body length (varint); body: element count (varint), then the elements.
        static let unkeyed: UInt8 = 0x0B
        /// Body length (varint); body: type name (length varint, UTF-8), then the message's value.
        static let envelope: UInt8 = 0x0C
    }

    /// The longest varint: 9 bytes carry 63 bits, which is every non-negative `Int`.
    static let maximumVarintLength = 9

    static func appendVarint(_ value: Int, to bytes: inout [UInt8]) {
        var rest = UInt(value)
        while rest >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: rest) | 0x80)
            rest >>= 7
        }
        bytes.append(UInt8(rest))
    }

    static func malformed(_ what: String, at offset: Int) -> IPCError {
        IPCError(code: .malformedPayload, message: "binary Codable payload: \(what) at byte \(offset)")
    }
}
