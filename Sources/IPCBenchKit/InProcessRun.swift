import Foundation
import IPCCore
import IPCFraming
import IPCPosix
import IPCSecureCoding

/// One in-process measurement: framing or payload decoding, no second process involved.
public struct InProcessResult: Codable, Sendable {
    /// `encode` or `decode` for framings; `decode-accepted` or `decode-refused` for codecs.
    public var operation: String
    /// The framing (`binary`, `http`) or codec (`json`, `propertyList`, `keyedArchive`).
    public var subject: String
    /// Bytes per operation: the payload of a frame, or the encoded message for a codec.
    public var bytes: Int
    /// For codecs: the size of the `Order` sample as JSON, which names the message whatever its
    /// encoded size in this codec.
    public var messageSize: Int?
    public var operations: Int
    /// Median over repetitions of the time per operation, in nanoseconds.
    public var nanosecondsPerOperation: Double
    public var repetitionNanoseconds: [Double]

    public var gigabytesPerSecond: Double { nanosecondsPerOperation > 0 ? Double(bytes) / nanosecondsPerOperation : 0 }

    public var name: String { "inprocess/\(subject)/\(operation)/\(bytes)" }
}

/// Framing encode/decode and secure decoding, timed in this process. Allocation counts per
/// operation are measured by the package-benchmark suites in `Benchmarks/`, which interpose malloc.
public struct InProcessRunner: Sendable {
    public var frameSizes: [Int]
    public var messageSizes: [Int]
    /// Wall time each repetition aims for.
    public var repetitionBudget: Duration
    public var progress: ProgressReporter

    public init(frameSizes: [Int] = [64, 4096, 65536, 1 << 20], messageSizes: [Int] = [1024, 16384], repetitionBudget: Duration = .milliseconds(20), progress: ProgressReporter) {
        self.frameSizes = frameSizes
        self.messageSizes = messageSizes
        self.repetitionBudget = repetitionBudget
        self.progress = progress
    }

    public func run() throws -> [InProcessResult] {
        var results: [InProcessResult] = []
        progress.note("in-process: framing and secure decoding")
        for framing in Framing.allCases {
            for size in frameSizes {
                results.append(try measureEncode(framing, size: size))
                results.append(try measureDecode(framing, size: size))
            }
        }
        let codecs: [any PayloadCodec] = [JSONPayloadCodec.json, PropertyListPayloadCodec.propertyList, KeyedArchivePayloadCodec.keyedArchive]
        for codec in codecs {
            for size in messageSizes {
                let order = Order.sample(approximateSize: size)
                let bytes = codec is KeyedArchivePayloadCodec ? try codec.encode(OrderObject(order)) : try codec.encode(order)
                let limits = DecodingLimits(maximumPayloadLength: 1 << 24, maximumDepth: 32)
                results.append(try measure(operation: "decode-accepted", subject: codec.name, bytes: bytes.count, messageSize: size) {
                    _ = try codec.decode(bytes, allowing: .orders, limits: limits)
                })
                results.append(try measure(operation: "decode-refused", subject: codec.name, bytes: bytes.count, messageSize: size) {
                    do {
                        _ = try codec.decode(bytes, allowing: AllowList(), limits: limits)
                        throw IPCError(code: .malformedPayload, message: "\(codec.name) accepted a type outside an empty allow-list")
                    } catch let error as IPCError where error.code == .disallowedType {}
                })
            }
        }
        return results
    }

    private func measureEncode(_ framing: Framing, size: Int) throws -> InProcessResult {
        let encoder = framing.makeEncoder(maximumPayloadLength: 1 << 30)
        let frame = Frame(kind: .request, msgid: 7, correlation: 42, payload: [UInt8](repeating: 0x5A, count: size))
        return try measure(operation: "encode", subject: framing.rawValue, bytes: size) {
            _ = try encoder.encode(frame)
        }
    }

    /// Decoding through the reassembler, as a transport does: a stream of back-to-back frames
    /// arriving in 64 KiB reads.
    private func measureDecode(_ framing: Framing, size: Int) throws -> InProcessResult {
        let encoder = framing.makeEncoder(maximumPayloadLength: 1 << 30)
        let one = try encoder.encode(Frame(kind: .request, msgid: 7, correlation: 42, payload: [UInt8](repeating: 0x5A, count: size)))
        let framesPerStream = max(1, (4 << 20) / one.count)
        let stream = Array([[UInt8]](repeating: one, count: framesPerStream).joined())
        let chunk = FrameReassembler<BinaryFrameDecoder>.chunkSize
        return try measure(operation: "decode", subject: framing.rawValue, bytes: size, batch: framesPerStream) {
            let reassembler = framing.makeReassembler(maximumPayloadLength: 1 << 30)
            var decoded = 0
            try stream.withUnsafeBytes { bytes in
                var offset = 0
                while offset < bytes.count {
                    let end = min(offset + chunk, bytes.count)
                    reassembler.append(UnsafeRawBufferPointer(rebasing: bytes[offset..<end]))
                    offset = end
                    while try reassembler.nextFrame() != nil { decoded += 1 }
                }
            }
            guard decoded == framesPerStream else {
                throw IPCError(code: .malformedFrame, message: "decoded \(decoded) of \(framesPerStream) frames")
            }
        }
    }

    /// Runs `body` repeatedly for 5 repetitions of about ``repetitionBudget`` each; `batch` is how
    /// many operations one call of `body` performs.
    private func measure(operation: String, subject: String, bytes: Int, messageSize: Int? = nil, batch: Int = 1, _ body: () throws -> Void) throws -> InProcessResult {
        try body()
        let start = monotonicNanoseconds()
        try body()
        let once = max(1, monotonicNanoseconds() - start)
        let budget = UInt64(repetitionBudget.components.seconds) * 1_000_000_000 + UInt64(repetitionBudget.components.attoseconds / 1_000_000_000)
        let calls = max(1, Int(budget / once))
        var perOperation: [Double] = []
        for _ in 0..<5 {
            let begin = monotonicNanoseconds()
            for _ in 0..<calls { try body() }
            perOperation.append(Double(monotonicNanoseconds() - begin) / Double(calls * batch))
        }
        let sorted = perOperation.sorted()
        return InProcessResult(
            operation: operation, subject: subject, bytes: bytes, messageSize: messageSize, operations: calls * batch * 5,
            nanosecondsPerOperation: sorted[2], repetitionNanoseconds: perOperation
        )
    }
}
