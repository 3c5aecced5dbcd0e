import IPCCore
import IPCFraming

/// A framing as a fuzz target drives it: how to make its reassembler and encoder, and the bounds
/// a reassembler of it must keep whatever bytes arrive.
public struct FramedStream: Sendable, CustomStringConvertible {
    public var framing: Framing
    public var maximumPayloadLength: Int
    /// For HTTP, the decoder's header block limit; `nil` for the default, through `Framing.makeReassembler`.
    public var maximumHeaderLength: Int?

    public init(_ framing: Framing, maximumPayloadLength: Int, maximumHeaderLength: Int? = nil) {
        self.framing = framing
        self.maximumPayloadLength = maximumPayloadLength
        self.maximumHeaderLength = maximumHeaderLength
    }

    public var description: String {
        "\(framing) framing, maximum payload \(maximumPayloadLength)" + (maximumHeaderLength.map { ", maximum header \($0)" } ?? "")
    }

    public func makeReassembler() -> any FrameReassembling {
        switch (framing, maximumHeaderLength) {
        case (.http, let headerLimit?), (.llbsd, let headerLimit?):
            FrameReassembler(decoder: HTTPFrameDecoder(maximumPayloadLength: maximumPayloadLength, maximumHeaderLength: headerLimit, llbsdCompatible: framing == .llbsd))
        default:
            framing.makeReassembler(maximumPayloadLength: maximumPayloadLength)
        }
    }

    /// The most bytes a reassembler may hold while it waits for the rest of one frame: a frame is
    /// refused as soon as its header announces more.
    var maximumBufferedWhileWaiting: Int {
        switch framing {
        case .binary: BinaryWireFormat.headerLength + maximumPayloadLength
        case .http, .llbsd: (maximumHeaderLength ?? HTTPWireFormat.defaultMaximumHeaderLength) + maximumPayloadLength
        }
    }

    /// The fewest bytes a frame takes on the wire besides its payload: the binary header, or the
    /// shortest HTTP header block, `a b HTTP/1.1` CRLF CRLF.
    var minimumOverhead: Int {
        switch framing {
        case .binary: BinaryWireFormat.headerLength
        case .http, .llbsd: 16
        }
    }
}

/// How a byte stream reaches the reassembler.
public struct Delivery: Sendable, CustomStringConvertible {
    /// Chunk sizes, used in turn and repeated until the stream is exhausted; empty means all at once.
    public var chunkSizes: [Int]
    /// Through `receive` (the path transports use) instead of `append`.
    public var throughReceive: Bool
    /// Ask for frames after every chunk, as a transport does, instead of only once everything arrived.
    public var drainEachChunk: Bool

    public init(chunkSizes: [Int] = [], throughReceive: Bool = false, drainEachChunk: Bool = true) {
        precondition(chunkSizes.allSatisfy { $0 > 0 })
        self.chunkSizes = chunkSizes
        self.throughReceive = throughReceive
        self.drainEachChunk = drainEachChunk
    }

    public static var whole: Delivery { Delivery() }

    public var description: String {
        (chunkSizes.isEmpty ? "whole" : "chunks of \(chunkSizes)") + (throughReceive ? " via receive" : " via append")
            + (drainEachChunk ? ", drained after each chunk" : ", drained at the end")
    }
}

/// What came out of a stream: the frames in order, then the error that ended it, if any.
public struct StreamOutcome: Equatable, CustomStringConvertible {
    public var frames: [Frame]
    public var error: IPCError?

    /// Equal frames and equal error codes. Messages may legitimately differ (they quote offsets).
    public static func == (lhs: StreamOutcome, rhs: StreamOutcome) -> Bool {
        lhs.frames == rhs.frames && lhs.error?.code == rhs.error?.code
    }

    public var description: String {
        "\(frames.count) frames (payload bytes \(frames.map(\.payload.count))), " + (error.map { "then \($0)" } ?? "clean end")
    }
}

extension FramedStream {
    /// Feeds `bytes` through a fresh reassembler as `delivery` says, drains every frame, calls
    /// `finish()`, and traps (so that libFuzzer reports the input) if the reassembler breaks a
    /// rule of its contract: an error that is not an ``IPCError``, an error that is not final, a
    /// payload above the maximum, a buffer above one frame's bound while waiting, bytes consumed
    /// that do not add up, or a frame that does not re-encode to what was consumed.
    public func decode(_ bytes: [UInt8], _ delivery: Delivery) -> StreamOutcome {
        let reassembler = makeReassembler()
        var checker = Checker(stream: self, input: bytes, reassembler: reassembler)
        var offset = 0
        var nextChunk = 0
        while offset < bytes.count {
            var size = bytes.count - offset
            if !delivery.chunkSizes.isEmpty {
                size = min(size, delivery.chunkSizes[nextChunk % delivery.chunkSizes.count])
                nextChunk += 1
            }
            if delivery.throughReceive {
                var left = size
                while left > 0 {
                    let start = offset + size - left
                    let count = bytes.withUnsafeBytes { source in
                        reassembler.receive { free in
                            precondition(free.count > 0, "receive offered no free space")
                            let count = min(free.count, left)
                            free.copyMemory(from: UnsafeRawBufferPointer(rebasing: source[start..<start + count]))
                            return count
                        }
                    }
                    left -= count
                    checker.appended += count
                }
            } else {
                bytes.withUnsafeBytes { reassembler.append(UnsafeRawBufferPointer(rebasing: $0[offset..<offset + size])) }
                checker.appended += size
            }
            offset += size
            checker.checkBuffered()
            if delivery.drainEachChunk || offset == bytes.count, checker.drain() {
                return checker.outcome
            }
        }
        checker.finish()
        return checker.outcome
    }

    /// The frames a fresh reassembler decodes from `encoded`, which must hold exactly those frames.
    func decodeWhole(_ encoded: [UInt8]) -> [Frame] {
        let reassembler = makeReassembler()
        encoded.withUnsafeBytes { reassembler.append($0) }
        var frames: [Frame] = []
        do {
            while let frame = try reassembler.nextFrame() { frames.append(frame) }
            try reassembler.finish()
        } catch {
            preconditionFailure("\(self): re-encoded frames do not decode: \(error)")
        }
        return frames
    }
}

/// Runs one reassembler and checks it after every call.
private struct Checker {
    let stream: FramedStream
    let input: [UInt8]
    let reassembler: any FrameReassembling
    var appended = 0
    var consumed = 0
    var outcome = StreamOutcome(frames: [], error: nil)

    init(stream: FramedStream, input: [UInt8], reassembler: any FrameReassembling) {
        self.stream = stream
        self.input = input
        self.reassembler = reassembler
    }

    func checkBuffered() {
        precondition(
            reassembler.bufferedByteCount == appended - consumed,
            "\(stream): bufferedByteCount \(reassembler.bufferedByteCount) after \(appended) bytes appended and \(consumed) consumed"
        )
    }

    /// Takes every whole frame; returns true if the stream failed.
    mutating func drain() -> Bool {
        while true {
            let before = reassembler.bufferedByteCount
            let frame: Frame?
            do {
                frame = try reassembler.nextFrame()
            } catch {
                fail(with: error)
                return true
            }
            guard let frame else {
                precondition(
                    before == 0 || before < stream.maximumBufferedWhileWaiting,
                    "\(stream): waiting for more bytes with \(before) buffered, above the bound of \(stream.maximumBufferedWhileWaiting)"
                )
                return false
            }
            let used = before - reassembler.bufferedByteCount
            check(frame, used: used)
            consumed += used
            outcome.frames.append(frame)
            checkBuffered()
        }
    }

    mutating func finish() {
        let buffered = reassembler.bufferedByteCount
        do {
            try reassembler.finish()
            precondition(buffered == 0, "\(stream): finish() accepted a stream that ended \(buffered) bytes into a frame")
        } catch {
            fail(with: error)
            guard let error = outcome.error else { return }
            precondition(error.code == .truncatedFrame, "\(stream): finish() threw \(error), expected truncatedFrame")
            precondition(buffered > 0, "\(stream): finish() threw \(error) at a frame boundary")
        }
    }

    private mutating func fail(with error: any Error) {
        guard let error = error as? IPCError else {
            preconditionFailure("\(stream): the reassembler threw \(type(of: error)), not IPCError: \(error)")
        }
        outcome.error = error
        // Errors are final: every later call throws the same error.
        for call in ["nextFrame", "finish"] {
            do {
                if call == "nextFrame" { _ = try reassembler.nextFrame() } else { try reassembler.finish() }
                preconditionFailure("\(stream): \(call)() succeeded after the error \(error)")
            } catch let again as IPCError {
                precondition(again == error, "\(stream): \(call)() threw \(again) after \(error); errors must be final")
            } catch {
                preconditionFailure("\(stream): \(call)() threw \(type(of: error)), not IPCError")
            }
        }
    }

    /// A decoded frame keeps the maximum, used at least its payload and the smallest header, and
    /// encodes back: byte for byte to what it was decoded from in the binary framing (which has one
    /// encoding per frame), and to bytes that decode to the same frame in the HTTP framing.
    private func check(_ frame: Frame, used: Int) {
        precondition(
            frame.payload.count <= stream.maximumPayloadLength,
            "\(stream): decoded a payload of \(frame.payload.count) bytes, above the maximum"
        )
        precondition(
            used >= frame.payload.count + stream.minimumOverhead && consumed + used <= appended,
            "\(stream): a frame with a \(frame.payload.count)-byte payload consumed \(used) bytes"
        )
        let encoder = stream.framing.makeEncoder(maximumPayloadLength: stream.maximumPayloadLength)
        let encoded: [UInt8]
        do {
            encoded = try encoder.encode(frame)
        } catch {
            preconditionFailure("\(stream): a decoded frame does not encode: \(error)")
        }
        switch stream.framing {
        case .binary:
            precondition(encoded[...] == input[consumed..<consumed + used], "\(stream): a decoded frame encodes to other bytes than it came from")
        case .http, .llbsd:
            precondition(stream.decodeWhole(encoded) == [frame], "\(stream): a decoded frame does not survive encoding and decoding")
        }
    }
}

extension FramedStream {
    /// Decodes `bytes` whole, one byte at a time, and in chunks of sizes taken from the bytes
    /// themselves through `receive`; each run is checked, and all must agree.
    public func checkDeliveries(_ bytes: [UInt8]) {
        let whole = decode(bytes, .whole)
        let chunkSizes = bytes.isEmpty ? [1] : bytes.prefix(8).map { Int($0 % 64) + 1 }
        for delivery in [Delivery(chunkSizes: [1]), Delivery(chunkSizes: chunkSizes, throughReceive: true)] {
            let split = decode(bytes, delivery)
            precondition(split == whole, "\(self): whole: \(whole); \(delivery): \(split)")
        }
    }
}
