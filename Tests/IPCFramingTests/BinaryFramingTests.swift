import IPCCore
import IPCFraming
import IPCTestSupport
import Testing

@Suite(.offTheCooperativePool) struct BinaryFramingTests {
    func reassembler(maximumPayloadLength: Int = 1000) -> FrameReassembler<BinaryFrameDecoder> {
        FrameReassembler(decoder: BinaryFrameDecoder(maximumPayloadLength: maximumPayloadLength))
    }

    /// The examples in docs/WIRE-FORMAT.md, byte for byte.
    @Test func encodesTheDocumentedExamples() throws {
        let encoder = BinaryFrameEncoder(maximumPayloadLength: 1 << 20)
        let request = try encoder.encode(Frame(kind: .request, msgid: 7, correlation: 42, payload: Array("hello".utf8)))
        #expect(request == [
            0x49, 0x50, 0x01, 0x02,
            0x00, 0x00, 0x00, 0x07,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2A,
            0x00, 0x00, 0x00, 0x05,
            0x68, 0x65, 0x6C, 0x6C, 0x6F,
        ])
        let reply = try encoder.encode(Frame(kind: .reply, msgid: 7, correlation: 42, payload: Array("ok".utf8)))
        #expect(reply == [
            0x49, 0x50, 0x01, 0x03,
            0x00, 0x00, 0x00, 0x07,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2A,
            0x00, 0x00, 0x00, 0x02,
            0x6F, 0x6B,
        ])
    }

    @Test(arguments: [UInt32.max, 1001, UInt32(Int32.max)])
    func hostileLengthIsRefusedBeforeTheBodyIsBuffered(length: UInt32) throws {
        let reassembler = reassembler(maximumPayloadLength: 1000)
        var header: [UInt8] = [0x49, 0x50, 0x01, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        withUnsafeBytes(of: length.bigEndian) { header.append(contentsOf: $0) }
        reassembler.append(header)
        let error = #expect(throws: IPCError.self) { try reassembler.nextFrame() }
        #expect(error?.code == .frameTooLarge)
        #expect(reassembler.bufferedByteCount == BinaryWireFormat.headerLength)
        // The buffer was not grown for the announced body: header plus free space is one chunk.
        var offered = 0
        _ = reassembler.receive { free in
            offered = free.count
            return 0
        }
        #expect(offered + BinaryWireFormat.headerLength <= FrameReassembler<BinaryFrameDecoder>.chunkSize)
    }

    @Test(arguments: [
        ("bad first magic byte (an HTTP request)", Array("GET / HTTP/1.1\r\n".utf8), 1),
        ("bad second magic byte", [0x49, 0x58, 0x01, 0x01], 2),
        ("version 0", [0x49, 0x50, 0x00, 0x01], 3),
        ("version 2", [0x49, 0x50, 0x02, 0x01], 3),
        ("kind 0", [0x49, 0x50, 0x01, 0x00], 4),
        ("kind 5", [0x49, 0x50, 0x01, 0x05], 4),
        ("kind 255", [0x49, 0x50, 0x01, 0xFF, 0, 0, 0, 0], 4),
    ] as [(String, [UInt8], Int)])
    func garbageIsRefusedAtTheFirstBadByte(description: String, bytes: [UInt8], failingByteCount: Int) {
        let outcome = feedByteByByte(bytes + Array(repeating: 0, count: 20), into: reassembler())
        #expect(outcome.frames.isEmpty)
        #expect(outcome.failure?.error.code == .malformedFrame, "\(description)")
        #expect(outcome.failure?.byteCount == failingByteCount, "\(description)")
    }

    @Test func garbageAfterAGoodFrameIsRefusedAfterDeliveringIt() throws {
        let good = try BinaryFrameEncoder(maximumPayloadLength: 1000).encode(Frame(kind: .message, msgid: 5, payload: [9]))
        let outcome = feedByteByByte(good + [0x00], into: reassembler())
        #expect(outcome.frames == [Frame(kind: .message, msgid: 5, payload: [9])])
        #expect(outcome.failure?.byteCount == good.count + 1)
        #expect(outcome.failure?.error.code == .malformedFrame)
    }
}
