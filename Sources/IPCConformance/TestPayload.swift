import Foundation

/// Payloads whose every size is cheap to make and to compare, even at 64 MiB in a debug build:
/// filled by `memset`, then stamped with a running pattern every 251 bytes (a prime, so no
/// power-of-two boundary of a fragmenting transport lines up with it), and compared with `memcmp`.
enum TestPayload {
    static func make(size: Int, seed: UInt8 = 0) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: size) { buffer, initialized in
            guard let base = buffer.baseAddress else { return }
            memset(base, Int32(seed ^ 0x5A), size)
            var index = 0
            var stamp = seed
            while index < size {
                base[index] = stamp
                stamp &+= 1
                index += 251
            }
            if size > 0 { base[size - 1] = UInt8(truncatingIfNeeded: size) ^ seed }
            initialized = size
        }
    }

    static func equal(_ lhs: [UInt8], _ rhs: [UInt8]) -> Bool {
        lhs.count == rhs.count && lhs.withUnsafeBytes { left in
            rhs.withUnsafeBytes { right in
                left.count == 0 || memcmp(left.baseAddress!, right.baseAddress!, left.count) == 0
            }
        }
    }

    /// Payload sizes from 0 to `maximum`: every size up to 3, then each power of two with its
    /// neighbours up to 64 KiB, then powers of two, then `maximum` itself.
    static func sizes(upTo maximum: Int) -> [Int] {
        var sizes: Set<Int> = [0, 1, 2, 3, maximum]
        var power = 4
        while power <= maximum {
            sizes.insert(power)
            if power <= 1 << 16 { sizes.formUnion([power - 1, power + 1]) }
            power <<= 1
        }
        return sizes.filter { $0 >= 0 && $0 <= maximum }.sorted()
    }
}

extension Int {
    /// `"16 MiB"`, `"4 KiB"`, `"17 B"`.
    var formattedBytes: String {
        if self >= 1 << 20, self % (1 << 20) == 0 { return "\(self >> 20) MiB" }
        if self >= 1 << 10, self % (1 << 10) == 0 { return "\(self >> 10) KiB" }
        return "\(self) B"
    }
}
