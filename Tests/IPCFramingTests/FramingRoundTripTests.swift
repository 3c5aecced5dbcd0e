import IPCCore
import IPCFraming
import IPCTestSupport
import Testing

/// Behaviour both framings share: round trips through every chunking, limits, truncation, sticky errors.
@Suite(.offTheCooperativePool) struct FramingRoundTripTests {
    static let payloadSizes = [0, 1, 64, 4096, 65536 + 3, 1 << 20]

    @Test(arguments: Framing.allCases, payloadSizes)
    func everyKindRoundTripsInEveryChunking(framing: Framing, size: Int) throws {
        for kind in Frame.Kind.allCases {
            let frame = Frame(kind: kind, msgid: 0xDEAD_BEEF, correlation: 0x0123_4567_89AB_CDEF, payload: patternedPayload(size, salt: kind.rawValue))
            // A second frame after the first checks that the first consumed exactly its own bytes.
            let next = Frame(kind: .message, msgid: 1, payload: [0x42])
            try ReassemblyVerifier(framing).verify([frame, next])
        }
    }

    @Test(arguments: Framing.allCases)
    func extremeIdentifiersRoundTrip(framing: Framing) throws {
        try ReassemblyVerifier(framing).verify([
            Frame(kind: .request, msgid: .max, correlation: .max, payload: [1, 2, 3]),
            Frame(kind: .reply, msgid: 0, correlation: 0),
        ])
    }

    @Test(arguments: Framing.allCases)
    func severalFramesInOneChunk(framing: Framing) throws {
        let frames = (0..<40).map { index in
            Frame(
                kind: Frame.Kind.allCases[index % 4],
                msgid: UInt32(index),
                correlation: UInt64(index) * 1_000_003,
                payload: patternedPayload([0, 1, 7, 64, 300, 4096][index % 6], salt: UInt8(index))
            )
        }
        let encoder = framing.makeEncoder(maximumPayloadLength: 1 << 20)
        let reassembler = framing.makeReassembler(maximumPayloadLength: 1 << 20)
        reassembler.append(try frames.flatMap { try encoder.encode($0) })
        let decoded = try reassembler.drain()
        #expect(describeMismatch(decoded, frames) == nil)
        #expect(reassembler.bufferedByteCount == 0)
        try reassembler.finish()

        try ReassemblyVerifier(framing).verify(frames)
    }

    @Test(arguments: Framing.allCases)
    func payloadOfExactlyTheMaximumIsAcceptedAndOneMoreIsRefusedBySender(framing: Framing) throws {
        let maximum = 1000
        var verifier = ReassemblyVerifier(framing)
        verifier.maximumPayloadLength = maximum
        try verifier.verify([Frame(kind: .message, payload: patternedPayload(maximum))])

        let encoder = framing.makeEncoder(maximumPayloadLength: maximum)
        let error = #expect(throws: IPCError.self) {
            try encoder.encode(Frame(kind: .message, payload: patternedPayload(maximum + 1)))
        }
        #expect(error?.code == .payloadTooLarge)
    }

    @Test(arguments: Framing.allCases)
    func decoderAsksForTheExactFrameLengthOnceTheHeaderIsRead(framing: Framing) throws {
        let encoded = try framing.makeEncoder(maximumPayloadLength: 100).encode(Frame(kind: .request, msgid: 3, payload: patternedPayload(10)))
        let headerLength = encoded.count - 10
        var decoder: any FrameDecoder = switch framing {
        case .binary: BinaryFrameDecoder(maximumPayloadLength: 100)
        case .http: HTTPFrameDecoder(maximumPayloadLength: 100)
        case .llbsd: HTTPFrameDecoder(maximumPayloadLength: 100, llbsdCompatible: true)
        }
        let step = try encoded.withUnsafeBytes { try decoder.decode(UnsafeRawBufferPointer(rebasing: $0[..<headerLength])) }
        #expect(step == .needMoreBytes(atLeast: encoded.count))
        let whole = try encoded.withUnsafeBytes { try decoder.decode($0) }
        #expect(whole == .frame(Frame(kind: .request, msgid: 3, payload: patternedPayload(10)), consumed: encoded.count))
    }

    @Test(arguments: Framing.allCases)
    func streamEndingInsideAFrameIsTruncated(framing: Framing) throws {
        let encoder = framing.makeEncoder(maximumPayloadLength: 1 << 20)
        let first = try encoder.encode(Frame(kind: .request, msgid: 1, correlation: 9, payload: patternedPayload(100)))
        let second = try encoder.encode(Frame(kind: .reply, msgid: 1, correlation: 9, payload: patternedPayload(50)))
        let headerLength = second.count - 50

        for (description, cut) in [("inside the header", headerLength / 2), ("inside the body", headerLength + 25), ("after the header", headerLength)] {
            let reassembler = framing.makeReassembler(maximumPayloadLength: 1 << 20)
            reassembler.append(first + second.prefix(cut))
            #expect(try reassembler.drain().count == 1, "cut \(description)")
            let error = #expect(throws: IPCError.self, "cut \(description)") { try reassembler.finish() }
            #expect(error?.code == .truncatedFrame, "cut \(description)")
        }

        let atBoundary = framing.makeReassembler(maximumPayloadLength: 1 << 20)
        atBoundary.append(first + second)
        #expect(try atBoundary.drain().count == 2)
        try atBoundary.finish()
    }

    @Test(arguments: Framing.allCases)
    func errorsAreSticky(framing: Framing) throws {
        let garbage: [UInt8] = switch framing {
        case .binary: [0x49, 0x50, 0x01, 0x09]
        case .http, .llbsd: Array("POST / HTTP/1.1\r\nBad\0".utf8)
        }
        let valid = try framing.makeEncoder(maximumPayloadLength: 100).encode(Frame(kind: .message, payload: [1]))
        let reassembler = framing.makeReassembler(maximumPayloadLength: 100)
        reassembler.append(garbage)
        let first = #expect(throws: IPCError.self) { try reassembler.nextFrame() }
        #expect(first?.code == .malformedFrame)

        reassembler.append(valid)
        let again = #expect(throws: IPCError.self) { try reassembler.nextFrame() }
        #expect(again == first)
        let atEnd = #expect(throws: IPCError.self) { try reassembler.finish() }
        #expect(atEnd == first)
    }

    /// A decoder of the caller's own that throws something other than an `IPCError`: the
    /// reassembler reports it as a malformed frame, at once, and goes on reporting it, whichever
    /// call met it first: a decode, the look for a large payload's header in a large append, or
    /// that look after a decode that asked for a large frame's bytes.
    @Test(arguments: [(16, true), (64 * 1024, true), (16, false)])
    func aForeignDecoderErrorIsAMalformedFrameAndFinal(appended: Int, decodeRefuses: Bool) throws {
        struct Refusal: Error {}
        struct RefusingDecoder: FrameDecoder {
            let decodeRefuses: Bool
            var maximumPayloadLength: Int { 1 << 20 }
            mutating func decode(_ bytes: UnsafeRawBufferPointer) throws -> DecodeStep {
                if decodeRefuses { throw Refusal() }
                return .needMoreBytes(atLeast: 1 << 20)
            }
            mutating func decodeHeader(_ bytes: UnsafeRawBufferPointer) throws -> (header: FrameHeader, headerLength: Int)? { throw Refusal() }
        }
        let reassembler = FrameReassembler(decoder: RefusingDecoder(decodeRefuses: decodeRefuses))
        reassembler.append([UInt8](repeating: 0x41, count: appended))
        let first = #expect(throws: IPCError.self) { try reassembler.nextFrame() }
        #expect(first?.code == .malformedFrame)
        let again = #expect(throws: IPCError.self) { try reassembler.nextFrame() }
        #expect(again == first)
        let atEnd = #expect(throws: IPCError.self) { try reassembler.finish() }
        #expect(atEnd == first)
    }
}
