import IPCCore
import IPCFraming
import Testing

/// A receive buffer grows with the bytes that arrive, not with the length a header announces.
@Suite("Hostile peers: receive buffer")
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

    @Test("a header announcing 4 GiB - 1 (allowed) reserves at most 1 MiB until payload bytes arrive", arguments: Framing.allCases)
    func announcedLengthIsNotReserved(_ framing: Framing) throws {
        let announced = Int(UInt32.max)
        let reassembler = framing.makeReassembler(maximumPayloadLength: announced)
        var header: [UInt8] = []
        try framing.makeEncoder(maximumPayloadLength: announced)
            .encodeHeader(FrameHeader(kind: .message, msgid: 1, correlation: 0, payloadLength: announced), into: &header)
        header.withUnsafeBytes { reassembler.append($0) }
        #expect(try reassembler.nextFrame() == nil)
        #expect(offeredRoom(reassembler) <= FrameReassembler<BinaryFrameDecoder>.upfrontReservation + FrameReassembler<BinaryFrameDecoder>.chunkSize)

        // As bytes arrive, the room offered at most doubles what is buffered.
        let chunk = [UInt8](repeating: 7, count: 3 << 20)
        chunk.withUnsafeBytes { reassembler.append($0) }
        #expect(try reassembler.nextFrame() == nil)
        #expect(offeredRoom(reassembler) <= 2 * reassembler.bufferedByteCount + FrameReassembler<BinaryFrameDecoder>.chunkSize)
    }

    @Test("a frame within the limit still arrives whole through the growing buffer", arguments: Framing.allCases)
    func largeFrameStillArrives(_ framing: Framing) throws {
        let size = 5 << 20
        let payload = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31) }
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
