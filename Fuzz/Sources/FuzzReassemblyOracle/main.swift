import FuzzSupport

/// Decoding a stream whole and split at boundaries the input chooses must give the same frames
/// and the same error, in both framings.
///
/// Input: one control byte, then `control & 0x0F` chunk sizes (each byte + 1, used in turn and
/// repeated; none means one byte at a time), then the stream. Control bit 4 delivers through
/// `receive` instead of `append`, bit 5 drains frames only at the end, and bits 6-7 pick the
/// maximum payload length.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzReassemblyOracle(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    let input = UnsafeBufferPointer(start: data, count: count)
    guard let control = input.first else { return 0 }
    let sizeCount = Int(control & 0x0F)
    guard input.count > sizeCount else { return 0 }
    let chunkSizes = input[1..<1 + sizeCount].map { Int($0) + 1 }
    let delivery = Delivery(
        chunkSizes: chunkSizes.isEmpty ? [1] : chunkSizes,
        throughReceive: control & 0x10 != 0,
        drainEachChunk: control & 0x20 == 0
    )
    let maximumPayloadLength = [0, 7, 512, 64 << 20][Int(control >> 6)]
    let stream = Array(input[(1 + sizeCount)...])
    for subject in [
        FramedStream(.binary, maximumPayloadLength: maximumPayloadLength),
        FramedStream(.http, maximumPayloadLength: maximumPayloadLength),
        FramedStream(.http, maximumPayloadLength: maximumPayloadLength, maximumHeaderLength: 160),
    ] {
        let whole = subject.decode(stream, .whole)
        let split = subject.decode(stream, delivery)
        precondition(split == whole, "\(subject): whole: \(whole); \(delivery): \(split)")
    }
    return 0
}
