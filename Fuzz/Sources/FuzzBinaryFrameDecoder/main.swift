import FuzzSupport

/// The input is a byte stream sent to a binary-framing receiver.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzBinaryFrameDecoder(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: count))
    // A small maximum, so that both accepted and refused lengths are within reach of small inputs.
    FramedStream(.binary, maximumPayloadLength: 512).checkDeliveries(bytes)
    return 0
}
