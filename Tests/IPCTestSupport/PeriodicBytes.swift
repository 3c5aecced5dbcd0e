/// `count` bytes whose byte `i` is `UInt8(truncatingIfNeeded: i &* step &+ offset)`: a payload
/// whose bytes depend on their offset, so that a shifted, cut or reordered body is noticed.
///
/// Only the low eight bits of `i` matter, so the bytes repeat every 256: one period is computed
/// and copied along. The tests' debug builds took about a second for every few megabytes
/// building these with `(0..<count).map`, on the cooperative pool's two threads, and the other
/// tests of the process waited (a CI run saw a notification test's three deliveries wait 30 s).
public func periodicBytes(_ count: Int, step: Int, offset: Int = 0) -> [UInt8] {
    precondition(count >= 0, "a negative byte count")
    var period = [UInt8](repeating: 0, count: 256)
    for index in 0..<256 { period[index] = UInt8(truncatingIfNeeded: index &* step &+ offset) }
    return [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
        var start = 0
        while start < count {
            let length = min(256, count - start)
            _ = UnsafeMutableBufferPointer(rebasing: buffer[start..<(start + length)]).initialize(from: period[0..<length])
            start += length
        }
        initialized = count
    }
}
