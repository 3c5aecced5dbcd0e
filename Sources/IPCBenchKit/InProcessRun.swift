import Foundation
import IPCCore
import IPCEngine
import IPCFraming
import IPCSystem
import IPCSecureCoding

/// One in-process measurement: framing or payload decoding, no second process involved.
public struct InProcessResult: Codable, Sendable {
    /// `encode` or `decode` for framings; `decode-accepted` or `decode-refused` for codecs.
    public var operation: String
    /// The framing (`binary`, `http`) or codec (`json`, `propertyList`, `keyedArchive`, `binaryCodable`).
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
    /// Heap allocations per operation (malloc and its kin, on the measuring thread), when the
    /// process counts them (the `ipcbench` executable does).
    public var allocationsPerOperation: Double?

    public var gigabytesPerSecond: Double { nanosecondsPerOperation > 0 ? Double(bytes) / nanosecondsPerOperation : 0 }

    /// Operations (frames, messages) per second at the median time.
    public var operationsPerSecond: Double { nanosecondsPerOperation > 0 ? 1e9 / nanosecondsPerOperation : 0 }

    public var name: String { "inprocess/\(subject)/\(operation)/\(bytes)" }
}

/// Framing encode/decode and secure decoding, timed in this process, with allocations per
/// operation when given a counter (the package-benchmark suites in `Benchmarks/` count them too).
///
/// Secure decoding is compared with Foundation's own: `NSKeyedUnarchiver` with secure coding
/// (`unarchivedObject(ofClasses:from:)`, the allowed classes only) decoding the same order as an
/// `OrderObject` graph, from its default binary archive (subject `NSKeyedUnarchiver`) and from
/// the XML archive that the keyed-archive codec carries (`NSKeyedUnarchiver-xml`). It is the
/// unguarded decoder: the `keyedArchive` codec runs it after validating the archive, because on
/// Linux it traps instead of throwing for a class outside the allowed set.
public struct InProcessRunner: Sendable {
    public var frameSizes: [Int]
    public var messageSizes: [Int]
    /// Wall time each repetition aims for.
    public var repetitionBudget: Duration
    public var progress: ProgressReporter
    /// Heap allocations made so far by the calling thread, if the process counts them.
    public var allocationCount: (@Sendable () -> UInt64)?

    public init(
        frameSizes: [Int] = [64, 4096, 65536, 1 << 20], messageSizes: [Int] = [1024, 16384], repetitionBudget: Duration = .milliseconds(20),
        progress: ProgressReporter, allocationCount: (@Sendable () -> UInt64)? = nil
    ) {
        self.frameSizes = frameSizes
        self.messageSizes = messageSizes
        self.repetitionBudget = repetitionBudget
        self.progress = progress
        self.allocationCount = allocationCount
    }

    public func run() throws -> [InProcessResult] {
        var results: [InProcessResult] = []
        progress.note("in-process: framing and secure decoding")
        for framing in Framing.measuredByDefault {
            for size in frameSizes {
                results.append(try measureEncode(framing, size: size))
                results.append(try measureDecode(framing, size: size))
                results.append(try measureDecodeInPlace(framing, size: size))
            }
        }
        let codecs: [any PayloadCodec] = [JSONPayloadCodec.json, PropertyListPayloadCodec.propertyList, KeyedArchivePayloadCodec.keyedArchive, BinaryCodablePayloadCodec.binaryCodable]
        // A receiver builds its allow-lists once, not per message.
        let accepting = AllowList.orders
        let refusing = AllowList()
        let limits = DecodingLimits(maximumPayloadLength: 1 << 24, maximumDepth: 32)
        for codec in codecs {
            for size in messageSizes {
                let order = Order.sample(approximateSize: size)
                let bytes = codec is KeyedArchivePayloadCodec ? try codec.encode(OrderObject(order)) : try codec.encode(order)
                results.append(try measure(operation: "decode-accepted", subject: codec.name, bytes: bytes.count, messageSize: size) {
                    _ = try codec.decode(bytes, allowing: accepting, limits: limits)
                })
                results.append(try measure(operation: "decode-refused", subject: codec.name, bytes: bytes.count, messageSize: size) {
                    do {
                        _ = try codec.decode(bytes, allowing: refusing, limits: limits)
                        throw IPCError(code: .malformedPayload, message: "\(codec.name) accepted a type outside an empty allow-list")
                    } catch let error as IPCError where error.code == .disallowedType {}
                })
            }
        }
        for size in messageSizes {
            let object = OrderObject(Order.sample(approximateSize: size))
            let archives = [
                ("NSKeyedUnarchiver", try NSKeyedArchiver.archivedData(withRootObject: object, requiringSecureCoding: true)),
                ("NSKeyedUnarchiver-xml", Data(try KeyedArchivePayloadCodec.keyedArchive.encode(object))),
            ]
            let classes: [AnyClass] = [OrderObject.self, LineItemObject.self, NSArray.self, NSDate.self]
            for (subject, archive) in archives {
                results.append(try measure(operation: "decode-accepted", subject: subject, bytes: archive.count, messageSize: size) {
                    guard try NSKeyedUnarchiver.unarchivedObject(ofClasses: classes, from: archive) is OrderObject else {
                        throw IPCError(code: .malformedPayload, message: "NSKeyedUnarchiver did not return the order")
                    }
                })
            }
        }
        return results
    }

    /// For each message size: the fastest allow-listed codec's accepted decode against
    /// `NSKeyedUnarchiver` with secure coding on the same order, as "N× faster" lines, then what
    /// that codec's refusal of a disallowed type costs against its accepted decode.
    public static func secureDecodingComparison(_ results: [InProcessResult]) -> [String] {
        let sizes = Set(results.compactMap(\.messageSize)).sorted()
        return sizes.flatMap { size -> [String] in
            let accepted = results.filter { $0.messageSize == size && $0.operation == "decode-accepted" }
            guard let fastest = accepted.filter({ !$0.subject.hasPrefix("NSKeyedUnarchiver") }).min(by: { $0.nanosecondsPerOperation < $1.nanosecondsPerOperation }) else { return [] }
            let comparisons = accepted.filter { $0.subject.hasPrefix("NSKeyedUnarchiver") }.map { reference in
                String(
                    format: "order of ~%d B: %@ decodes %.1f× faster than %@ (%.1f µs against %.1f µs)", size, fastest.subject,
                    reference.nanosecondsPerOperation / fastest.nanosecondsPerOperation, reference.subject,
                    fastest.nanosecondsPerOperation / 1000, reference.nanosecondsPerOperation / 1000
                )
            }
            let refused = results.first { $0.messageSize == size && $0.operation == "decode-refused" && $0.subject == fastest.subject }
            return comparisons + (refused.map { refused in
                [
                    String(
                        format: "order of ~%d B: %@ refuses a disallowed type in %.2f µs, %.3f× its accepted decode", size, fastest.subject,
                        refused.nanosecondsPerOperation / 1000, refused.nanosecondsPerOperation / fastest.nanosecondsPerOperation
                    )
                ]
            } ?? [])
        }
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
        let stream = try FrameStream(framing, frame: Frame(kind: .request, msgid: 7, correlation: 42, payload: [UInt8](repeating: 0x5A, count: size)))
        return try measure(operation: "decode", subject: framing.rawValue, bytes: size, batch: stream.frames) {
            let reassembler = framing.makeReassembler(maximumPayloadLength: 1 << 30)
            var decoded = 0
            try stream.feed(reassembler) {
                while try reassembler.nextFrame() != nil { decoded += 1 }
            }
            guard decoded == stream.frames else {
                throw IPCError(code: .malformedFrame, message: "decoded \(decoded) of \(stream.frames) frames")
            }
        }
    }

    /// Decoding as a transport does for a ``BorrowingMessageHandler``: the same stream of one-way
    /// messages in 64 KiB reads, each payload lent in place to a handler that reads its first
    /// and last byte, through one reassembler for the whole run (as one connection's).
    private func measureDecodeInPlace(_ framing: Framing, size: Int) throws -> InProcessResult {
        let stream = try FrameStream(framing, frame: Frame(kind: .message, msgid: 7, payload: [UInt8](repeating: 0x5A, count: size)))
        let reassembler = framing.makeReassembler(maximumPayloadLength: 1 << 30)
        return try measure(operation: "decode-in-place", subject: framing.rawValue, bytes: size, batch: stream.frames) {
            var lent = 0
            var checksum = 0
            try stream.feed(reassembler) {
                while let next = try reassembler.nextFrame(lending: { header, payload in
                    if let first = payload.first, let last = payload.last { checksum &+= Int(first) &+ Int(last) }
                    return header.kind == .message
                }) {
                    guard case .lent = next else {
                        throw IPCError(code: .malformedFrame, message: "a \(size)-byte message was not lent in place")
                    }
                    lent += 1
                }
            }
            guard lent == stream.frames, checksum == (size > 0 ? stream.frames * 0xB4 : 0) else {
                throw IPCError(code: .malformedFrame, message: "lent \(lent) of \(stream.frames) frames in place, checksum \(checksum)")
            }
        }
    }

    /// About 4 MiB of one frame repeated back to back, delivered to a reassembler in 64 KiB
    /// appends (as reads of a stream would bring it).
    private struct FrameStream {
        let bytes: [UInt8]
        let frames: Int

        init(_ framing: Framing, frame: Frame) throws {
            let one = try framing.makeEncoder(maximumPayloadLength: 1 << 30).encode(frame)
            frames = max(1, (4 << 20) / one.count)
            bytes = Array([[UInt8]](repeating: one, count: frames).joined())
        }

        /// Appends the stream chunk by chunk, calling `drain` after each chunk.
        func feed(_ reassembler: any FrameReassembling, drain: () throws -> Void) throws {
            let chunk = FrameReassembler<BinaryFrameDecoder>.chunkSize
            try bytes.withUnsafeBytes { bytes in
                var offset = 0
                while offset < bytes.count {
                    let end = min(offset + chunk, bytes.count)
                    reassembler.append(UnsafeRawBufferPointer(rebasing: bytes[offset..<end]))
                    offset = end
                    try drain()
                }
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
        var allocations: Double?
        if let allocationCount {
            // Apart from the timed repetitions, so the counting cannot slow them.
            let counted = max(1, min(calls, 50))
            let before = allocationCount()
            for _ in 0..<counted { try body() }
            allocations = Double(allocationCount() - before) / Double(counted * batch)
        }
        return InProcessResult(
            operation: operation, subject: subject, bytes: bytes, messageSize: messageSize, operations: calls * batch * 5,
            nanosecondsPerOperation: sorted[2], repetitionNanoseconds: perOperation, allocationsPerOperation: allocations
        )
    }
}
