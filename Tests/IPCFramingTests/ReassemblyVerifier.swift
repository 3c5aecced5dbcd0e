import Foundation
import IPCCore
import IPCFraming
import IPCTestSupport
import Testing

/// Feeds an encoded frame sequence through a ``FrameReassembler`` in many chunkings and checks that
/// exactly the original frames come back, in the spirit of swift-nio's `ByteToMessageDecoderVerifier`.
///
/// Chunkings: the whole sequence at once; one byte at a time; two pieces split at every offset
/// inside the first frame (header and body); and seeded random chunkings, half of them delivered
/// through `receive` (the path transports use) and half through `append`. Each failure names the
/// chunking and the seed, so it can be replayed with `IPCBENCH_TEST_SEED=<seed>`.
///
/// Some chunkings drain with `nextFrame(lending:)` instead of `nextFrame()` (the path of a
/// borrowing message handler): messages with an even msgid are taken in place (their payload
/// copied out by the test during the loan), every other frame comes back owned.
struct ReassemblyVerifier {
    var framing: Framing
    var maximumPayloadLength = 4 << 20
    var randomChunkings = 24
    /// Splitting costs the whole input per split point, so a first frame longer than this is split
    /// at every header offset, the first and last 256 body offsets and 64 random ones instead.
    var everySplitLimit = 16 * 1024
    /// Inputs longer than this are not fed one byte at a time.
    var byteByByteLimit = 128 * 1024
    var seed: UInt64 = ReassemblyVerifier.sessionSeed

    /// One seed per test run, random unless given in the environment.
    static let sessionSeed: UInt64 = {
        if let text = ProcessInfo.processInfo.environment["IPCBENCH_TEST_SEED"], let seed = UInt64(text) {
            return seed
        }
        return UInt64.random(in: 0...UInt64.max)
    }()

    init(_ framing: Framing) {
        self.framing = framing
    }

    func verify(_ frames: [Frame], sourceLocation: SourceLocation = #_sourceLocation) throws {
        let encoder = framing.makeEncoder(maximumPayloadLength: maximumPayloadLength)
        var bytes: [UInt8] = []
        for frame in frames { bytes += try encoder.encode(frame) }
        let firstLength = try frames.first.map { try encoder.encode($0).count } ?? 0
        let headerLength = firstLength - (frames.first?.payload.count ?? 0)
        var random = SplitMix64(seed: seed)

        var chunkings: [(name: String, boundaries: [Int], useReceive: Bool, lending: Bool)] = [("whole", [], false, false), ("whole, lending", [], false, true)]
        if bytes.count <= byteByByteLimit {
            chunkings.append(("byte by byte", Array(1..<max(bytes.count, 1)), false, false))
            chunkings.append(("byte by byte, lending", Array(1..<max(bytes.count, 1)), false, true))
        }
        var splits: [Int]
        if firstLength <= everySplitLimit {
            splits = Array(1..<max(firstLength, 1))
        } else {
            splits = Array(1...headerLength) + Array(headerLength + 1...headerLength + 256) + Array(firstLength - 256..<firstLength)
            splits += (0..<64).map { _ in Int(random.next(upperBound: UInt64(firstLength - 1))) + 1 }
        }
        for split in splits {
            chunkings.append(("split at \(split) of the first frame (header \(headerLength) bytes)\(split % 2 == 1 ? ", lending" : "")", [split], false, split % 2 == 1))
        }
        for index in 0..<randomChunkings {
            // Cap the number of chunks so that large inputs stay cheap, yet small ones get tiny chunks.
            let largest = max([3, 17, 257, 4099, 70_001][Int(random.next(upperBound: UInt64(5)))], bytes.count / 2048)
            var boundaries: [Int] = []
            var offset = Int(random.next(upperBound: UInt64(largest))) + 1
            while offset < bytes.count {
                boundaries.append(offset)
                offset += Int(random.next(upperBound: UInt64(largest))) + 1
            }
            chunkings.append(("random chunking \(index), chunks of 1...\(largest)\(index % 3 == 2 ? ", lending" : "")", boundaries, index % 2 == 1, index % 3 == 2))
        }

        for chunking in chunkings {
            let context = "\(framing) framing, \(chunking.name), seed \(seed), \(frames.count) frames, \(bytes.count) bytes"
            let decoded: [Frame]
            do {
                decoded = try feed(bytes, boundaries: chunking.boundaries, useReceive: chunking.useReceive, lending: chunking.lending)
            } catch {
                Issue.record("\(context): \(error)", sourceLocation: sourceLocation)
                return
            }
            if let mismatch = describeMismatch(decoded, frames) {
                Issue.record("\(context): \(mismatch)", sourceLocation: sourceLocation)
                return
            }
        }
    }

    /// Delivers `bytes` in the chunks that `boundaries` (increasing offsets) cut, drains frames after
    /// every chunk, and checks that the stream ends cleanly.
    private func feed(_ bytes: [UInt8], boundaries: [Int], useReceive: Bool, lending: Bool) throws -> [Frame] {
        let reassembler = framing.makeReassembler(maximumPayloadLength: maximumPayloadLength)
        var decoded: [Frame] = []
        var start = 0
        for end in boundaries + [bytes.count] {
            if useReceive {
                while start < end {
                    _ = bytes.withUnsafeBytes { source in
                        reassembler.receive { free in
                            let count = min(free.count, end - start)
                            free.copyMemory(from: UnsafeRawBufferPointer(rebasing: source[start..<start + count]))
                            start += count
                            return count
                        }
                    }
                }
            } else {
                bytes.withUnsafeBytes { reassembler.append(UnsafeRawBufferPointer(rebasing: $0[start..<end])) }
                start = end
            }
            if lending {
                var taken: Frame?
                while let next = try reassembler.nextFrame(lending: { header, payload in
                    guard header.kind == .message, header.msgid % 2 == 0 else { return false }
                    taken = Frame(kind: header.kind, msgid: header.msgid, correlation: header.correlation, payload: Array(payload))
                    return true
                }) {
                    switch next {
                    case .lent:
                        guard let frame = taken else { throw VerifierFailure("a frame reported lent was never offered") }
                        decoded.append(frame)
                    case .owned(let frame):
                        if frame.kind == .message, frame.msgid % 2 == 0 { throw VerifierFailure("message \(frame.msgid) was taken and came back owned") }
                        decoded.append(frame)
                    }
                    taken = nil
                }
            } else {
                while let frame = try reassembler.nextFrame() { decoded.append(frame) }
            }
        }
        try reassembler.finish()
        if reassembler.bufferedByteCount != 0 {
            throw VerifierFailure("\(reassembler.bufferedByteCount) bytes left buffered after the last frame")
        }
        return decoded
    }
}

struct VerifierFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A short description of how two frame sequences differ, or `nil` if they are equal. Payloads are
/// compared with `memcmp` and never printed whole: they may be megabytes long.
func describeMismatch(_ actual: [Frame], _ expected: [Frame]) -> String? {
    for (index, (got, want)) in zip(actual, expected).enumerated() {
        if got.kind != want.kind || got.msgid != want.msgid || got.correlation != want.correlation {
            return "frame \(index): got \(got.kind) msgid \(got.msgid) correlation \(got.correlation), expected \(want.kind) msgid \(want.msgid) correlation \(want.correlation)"
        }
        if got.payload.count != want.payload.count {
            return "frame \(index): got a payload of \(got.payload.count) bytes, expected \(want.payload.count)"
        }
        let same = got.payload.withUnsafeBytes { a in
            want.payload.withUnsafeBytes { b in a.count == 0 || memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0 }
        }
        if !same {
            let offset = got.payload.indices.first { got.payload[$0] != want.payload[$0] } ?? 0
            return "frame \(index): payloads differ first at byte \(offset)"
        }
    }
    return actual.count == expected.count ? nil : "got \(actual.count) frames, expected \(expected.count)"
}

/// A payload whose bytes depend on their offset, so that a shifted or reordered body is noticed.
func patternedPayload(_ count: Int, salt: UInt8 = 0) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 8) ^ salt }
}

/// What happened when bytes were fed one at a time.
struct ByteByByteOutcome {
    var frames: [Frame]
    /// How many bytes had been appended when `nextFrame` threw, and what it threw.
    var failure: (byteCount: Int, error: IPCError)?
}

/// Appends `bytes` one at a time, calling `nextFrame` after each, until it throws or the bytes run out.
func feedByteByByte(_ bytes: [UInt8], into reassembler: any FrameReassembling) -> ByteByByteOutcome {
    var frames: [Frame] = []
    for index in bytes.indices {
        bytes.withUnsafeBytes { reassembler.append(UnsafeRawBufferPointer(rebasing: $0[index...index])) }
        do {
            while let frame = try reassembler.nextFrame() { frames.append(frame) }
        } catch let error as IPCError {
            return ByteByByteOutcome(frames: frames, failure: (index + 1, error))
        } catch {
            Issue.record("unexpected error type: \(error)")
            return ByteByByteOutcome(frames: frames, failure: nil)
        }
    }
    return ByteByByteOutcome(frames: frames, failure: nil)
}

extension FrameReassembling {
    func append(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { append($0) }
    }

    /// Every frame the buffered bytes hold.
    func drain() throws -> [Frame] {
        var frames: [Frame] = []
        while let frame = try nextFrame() { frames.append(frame) }
        return frames
    }
}
