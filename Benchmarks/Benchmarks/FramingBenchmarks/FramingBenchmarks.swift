import Benchmark
import BenchmarkSupport
import IPCCore
import IPCFraming

/// Binary and HTTP/1.1 framing, in process: what a transport spends per frame on either side of
/// the kernel. Time per frame and allocations per frame, for payloads of 64 B to 1 MiB.
///
/// - `EncodeHeader`: the header into a reused buffer, as the transports encode (the payload
///   follows in the same gathering write, never copied).
/// - `Encode`: header and payload as one new array, for a writer without gathering writes.
/// - `Decode`: a whole frame's bytes appended to a reassembler and the frame taken out, as a
///   stream transport does after a read; the payload is copied once, into the frame's own array
///   (binary frames of 16 KiB or more are gathered straight into it), so one allocation a frame.
/// - `DecodeInPlace`: the same for one-way messages whose payload is lent in place to a handler
///   (`nextFrame(lending:)`, the path of a `BorrowingMessageHandler`): no allocation a frame,
///   which the thresholds hold at 0.
let benchmarks: @Sendable () -> Void = {
    // No allocation to spare: the thresholds hold each path's count exactly.
    Benchmark.defaultConfiguration = suiteConfiguration(tolerance: 0)
    let maximumPayload = 1 << 20

    for framing in Framing.measuredByDefault {
        let encoder = framing.makeEncoder(maximumPayloadLength: maximumPayload)

        let header = FrameHeader(kind: .request, msgid: 1, correlation: 42, payloadLength: 4096)
        var headerBuffer: [UInt8] = []
        headerBuffer.reserveCapacity(256)
        Benchmark("EncodeHeader.\(framing)", configuration: .init(scalingFactor: .kilo)) { benchmark in
            for _ in benchmark.scaledIterations {
                headerBuffer.removeAll(keepingCapacity: true)
                try encoder.encodeHeader(header, into: &headerBuffer)
                blackHole(headerBuffer)
            }
        }

        for size in [64, 4096, 65536, 1 << 20] {
            let frame = Frame(kind: .request, msgid: 1, correlation: 42, payload: [UInt8](repeating: 0xA5, count: size))
            // An inner loop for the small frames, so the measurement's own cost stays out of the figure.
            let scaling: BenchmarkScalingFactor = size <= 4096 ? .kilo : .one
            Benchmark("Encode.\(framing).\(sizeLabel(size))", configuration: .init(scalingFactor: scaling)) { benchmark in
                for _ in benchmark.scaledIterations {
                    blackHole(try encoder.encode(frame))
                }
            }

            let bytes = try! encoder.encode(frame)
            let reassembler = framing.makeReassembler(maximumPayloadLength: maximumPayload)
            Benchmark("Decode.\(framing).\(sizeLabel(size))", configuration: .init(scalingFactor: scaling)) { benchmark in
                for _ in benchmark.scaledIterations {
                    bytes.withUnsafeBytes { reassembler.append($0) }
                    guard let decoded = try reassembler.nextFrame(), decoded.payload.count == size else {
                        fatalError("\(framing) decoder did not return the \(size)-byte frame")
                    }
                    blackHole(decoded)
                }
            }

            let message = try! encoder.encode(Frame(kind: .message, msgid: 2, payload: [UInt8](repeating: 0x5A, count: size)))
            let lending = framing.makeReassembler(maximumPayloadLength: maximumPayload)
            Benchmark("DecodeInPlace.\(framing).\(sizeLabel(size))", configuration: .init(scalingFactor: scaling)) { benchmark in
                for _ in benchmark.scaledIterations {
                    message.withUnsafeBytes { lending.append($0) }
                    guard case .lent = try lending.nextFrame(lending: { header, payload in
                        blackHole(payload.last)
                        return header.kind == .message && payload.count == size
                    }) else {
                        fatalError("\(framing) reassembler did not lend the \(size)-byte message")
                    }
                }
            }
        }
    }
}
