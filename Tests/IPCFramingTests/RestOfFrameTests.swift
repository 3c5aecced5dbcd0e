import IPCCore
import IPCFraming
import IPCTestSupport
import Testing

/// The room a reassembler gives for the rest of a large frame, which the engine has the kernel
/// fill (docs/ENGINE.md, "Large frames in the kernel's hands").
@Suite(.offTheCooperativePool) struct RestOfFrameTests {
    static let maximumPayloadLength = 64 << 20

    /// Feeds `bytes` as the engine would: the first `first` bytes as one read, then the rest
    /// through `spaceForRestOfFrame` while it offers room, else as ordinary reads.
    private func feed(_ reassembler: any FrameReassembling, _ bytes: [UInt8], first: Int, minimum: Int, lending: Bool) throws -> (offered: [Int], end: Int) {
        reassembler.append(UnsafeRawBufferPointer(rebasing: bytes.withUnsafeBytes { $0 }[..<first]))
        // The engine asks for frames after each read; the reassembler learns the frame's length then.
        if lending {
            #expect(try reassembler.nextFrame(lending: { _, _ in false }) == nil)
        } else {
            #expect(try reassembler.nextFrame() == nil)
        }
        var at = first
        var offered: [Int] = []
        while at < bytes.count, let space = reassembler.spaceForRestOfFrame(minimum: minimum) {
            offered.append(space.count)
            let count = min(space.count, bytes.count - at)
            bytes.withUnsafeBytes { space.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[at..<(at + count)])) }
            reassembler.received(count)
            at += count
        }
        return (offered, at)
    }

    @Test("the room is exactly the rest of the frame, whether its payload is gathered or buffered", arguments: Framing.allCases, [false, true])
    func roomIsTheRestOfTheFrame(framing: Framing, lending: Bool) throws {
        let reassembler = framing.makeReassembler(maximumPayloadLength: Self.maximumPayloadLength)
        // A reassembler that lends keeps a message in its buffer instead of gathering it.
        if lending { _ = try reassembler.nextFrame(lending: { _, _ in false }) }
        let frame = Frame(kind: .message, msgid: 5, payload: patternedPayload(1 << 20, salt: 3))
        let next = Frame(kind: .request, msgid: 6, correlation: 9, payload: [1, 2, 3])
        let encoder = framing.makeEncoder(maximumPayloadLength: Self.maximumPayloadLength)
        let first = try encoder.encode(frame)
        let bytes = first + (try encoder.encode(next))
        let (offered, end) = try feed(reassembler, bytes, first: 300 << 10, minimum: 128 << 10, lending: lending)
        #expect(offered == [first.count - (300 << 10)], "the room offered: \(offered)")
        #expect(end == first.count)
        #expect(reassembler.spaceForRestOfFrame(minimum: 1) == nil, "no frame is partly read")
        if lending {
            // Declined: the frame comes back with a payload of its own.
            guard case .owned(let whole) = try reassembler.nextFrame(lending: { _, _ in false }) else {
                Issue.record("the frame did not come back whole")
                return
            }
            #expect(whole == frame)
        } else {
            #expect(try reassembler.nextFrame() == frame)
        }
        bytes.withUnsafeBytes { reassembler.append(UnsafeRawBufferPointer(rebasing: $0[end...])) }
        #expect(try reassembler.nextFrame() == next)
    }

    @Test("no room for a rest below the minimum, nor for a large one before the header is whole", arguments: Framing.allCases)
    func noRoomForSmallOrUnknownRests(framing: Framing) throws {
        let encoder = framing.makeEncoder(maximumPayloadLength: Self.maximumPayloadLength)
        let bytes = try encoder.encode(Frame(kind: .message, payload: patternedPayload(200 << 10, salt: 1)))
        let reassembler = framing.makeReassembler(maximumPayloadLength: Self.maximumPayloadLength)
        reassembler.append(UnsafeRawBufferPointer(rebasing: bytes.withUnsafeBytes { $0 }[..<5]))
        #expect(try reassembler.nextFrame() == nil)
        #expect(reassembler.spaceForRestOfFrame(minimum: 128 << 10) == nil, "half a header")
        // What the header still needs, at most: never past the frame's end.
        #expect((reassembler.spaceForRestOfFrame(minimum: 1)?.count ?? 0) <= bytes.count - 5)
        bytes.withUnsafeBytes { reassembler.append(UnsafeRawBufferPointer(rebasing: $0[5..<(100 << 10)])) }
        #expect(try reassembler.nextFrame() == nil)
        #expect(reassembler.spaceForRestOfFrame(minimum: 128 << 10) == nil, "a rest of about 100 KiB")
        #expect(reassembler.spaceForRestOfFrame(minimum: 64 << 10)?.count == bytes.count - (100 << 10))
    }

    @Test("a frame announced far larger than what arrived gets no room for all of it: memory follows the bytes", arguments: Framing.allCases)
    func announcedSizeReservesNothing(framing: Framing) throws {
        let encoder = framing.makeEncoder(maximumPayloadLength: Self.maximumPayloadLength)
        let bytes = try encoder.encode(Frame(kind: .message, payload: patternedPayload(60 << 20, salt: 2)))
        let reassembler = framing.makeReassembler(maximumPayloadLength: Self.maximumPayloadLength)
        reassembler.append(UnsafeRawBufferPointer(rebasing: bytes.withUnsafeBytes { $0 }[..<(64 << 10)]))
        #expect(try reassembler.nextFrame() == nil)
        #expect(reassembler.spaceForRestOfFrame(minimum: 128 << 10) == nil)
    }
}
