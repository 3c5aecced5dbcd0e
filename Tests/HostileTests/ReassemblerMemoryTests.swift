import IPCCore
import IPCFraming
import IPCTestSupport
import Testing

/// A receive buffer grows with the bytes that arrive, not with the length a header announces.
@Suite("Hostile peers: receive buffer", .offTheCooperativePool)
struct ReassemblerMemoryTests {
    /// The room the reassembler offers to the next read.
    private func offeredRoom(_ reassembler: any FrameReassembling) -> Int {
        var room = 0
        _ = reassembler.receive { buffer in
            room = buffer.count
            return 0
        }
        return room
    }

    /// `nextFrame()`, or `nextFrame(lending:)` (which takes every message) mapped back to frames.
    private func next(_ reassembler: any FrameReassembling, lending: Bool) throws -> Frame? {
        guard lending else { return try reassembler.nextFrame() }
        var taken: Frame?
        switch try reassembler.nextFrame(lending: { header, payload in
            taken = Frame(kind: header.kind, msgid: header.msgid, correlation: header.correlation, payload: Array(payload))
            return true
        }) {
        case nil: return nil
        case .lent: return taken
        case .owned(let frame): return frame
        }
    }

    @Test(
        "a header announcing 4 GiB - 1 (allowed) reserves at most 1 MiB until payload bytes arrive, also when lending in place",
        arguments: Framing.allCases, [false, true]
    )
    func announcedLengthIsNotReserved(_ framing: Framing, lending: Bool) throws {
        let announced = Int(UInt32.max)
        let reassembler = framing.makeReassembler(maximumPayloadLength: announced)
        var header: [UInt8] = []
        try framing.makeEncoder(maximumPayloadLength: announced)
            .encodeHeader(FrameHeader(kind: .message, msgid: 1, correlation: 0, payloadLength: announced), into: &header)
        header.withUnsafeBytes { reassembler.append($0) }
        #expect(try next(reassembler, lending: lending) == nil)
        #expect(offeredRoom(reassembler) <= FrameReassembler<BinaryFrameDecoder>.upfrontReservation + FrameReassembler<BinaryFrameDecoder>.chunkSize)

        // As bytes arrive, the room offered at most doubles what is buffered.
        let chunk = [UInt8](repeating: 7, count: 3 << 20)
        chunk.withUnsafeBytes { reassembler.append($0) }
        #expect(try next(reassembler, lending: lending) == nil)
        #expect(offeredRoom(reassembler) <= 2 * reassembler.bufferedByteCount + FrameReassembler<BinaryFrameDecoder>.chunkSize)
    }

    @Test(
        "a reassembler lending in place keeps a buffer of at most 4 MiB between messages; one that does not, 256 KiB",
        arguments: Framing.allCases, [false, true]
    )
    func retainedBufferIsBounded(_ framing: Framing, lending: Bool) throws {
        let reassembler = framing.makeReassembler(maximumPayloadLength: 16 << 20)
        let encoder = framing.makeEncoder(maximumPayloadLength: 16 << 20)
        let retained = lending ? FrameReassembler<BinaryFrameDecoder>.lendingRetainedCapacity : 4 * FrameReassembler<BinaryFrameDecoder>.chunkSize
        // A reassembler lends from its first `nextFrame(lending:)` on (a connection asks before its first read).
        #expect(try next(reassembler, lending: lending) == nil)
        for size in [1 << 20, 8 << 20] {
            let bytes = try encoder.encode(Frame(kind: .message, msgid: 2, payload: patterned(size)))
            bytes.withUnsafeBytes { reassembler.append($0) }
            let frame = try next(reassembler, lending: lending)
            #expect(frame?.payload == patterned(size))
            #expect(reassembler.bufferedByteCount == 0)
            // The room offered next is the buffer kept (nothing is buffered).
            let room = offeredRoom(reassembler)
            if size < retained {
                #expect(room <= retained)
                #expect(lending ? room > size : room == FrameReassembler<BinaryFrameDecoder>.chunkSize)
            } else {
                #expect(room == FrameReassembler<BinaryFrameDecoder>.chunkSize)
            }
        }
    }

    private func patterned(_ count: Int) -> [UInt8] {
        periodicBytes(count, step: 13, offset: 5)
    }

    @Test("a frame within the limit still arrives whole through the growing buffer", arguments: Framing.allCases)
    func largeFrameStillArrives(_ framing: Framing) throws {
        let size = 5 << 20
        let payload = periodicBytes(size, step: 31)
        let bytes = try framing.makeEncoder(maximumPayloadLength: size).encode(Frame(kind: .message, msgid: 3, payload: payload))
        let reassembler = framing.makeReassembler(maximumPayloadLength: size)
        var offset = 0
        var frames: [Frame] = []
        while offset < bytes.count {
            // Reads as big as offered, as a socket read would be.
            let count = bytes.withUnsafeBytes { source in
                reassembler.receive { buffer in
                    let count = min(buffer.count, source.count - offset)
                    buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: source[offset..<(offset + count)]))
                    return count
                }
            }
            offset += count
            while let frame = try reassembler.nextFrame() { frames.append(frame) }
        }
        try reassembler.finish()
        #expect(frames.count == 1)
        #expect(frames.first?.payload == payload)
    }
}
