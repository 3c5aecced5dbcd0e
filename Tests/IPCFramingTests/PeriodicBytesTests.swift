import IPCTestSupport
import Testing

/// The transport tests' payloads come from `periodicBytes`: it must give what its formula says
/// at every length, across and around the 256-byte period it copies.
@Suite(.offTheCooperativePool) struct PeriodicBytesTests {
    @Test("periodicBytes gives byte i = i * step + offset, truncated, at every length", arguments: [0, 1, 2, 255, 256, 257, 511, 4096 + 3, 70_001])
    func matchesItsFormula(count: Int) {
        for (step, offset) in [(31, 0), (13, 5), (7, 1 << 20), (1, -3), (256, 9)] {
            let expected = (0..<count).map { UInt8(truncatingIfNeeded: $0 &* step &+ offset) }
            #expect(periodicBytes(count, step: step, offset: offset) == expected, "step \(step), offset \(offset)")
        }
    }
}
