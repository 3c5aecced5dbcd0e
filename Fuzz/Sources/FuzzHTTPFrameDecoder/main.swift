import FuzzSupport

/// The input is a byte stream sent to an HTTP-framing receiver.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHTTPFrameDecoder(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: count))
    // The default header limit through Framing.makeReassembler, and a small one that inputs reach.
    FramedStream(.http, maximumPayloadLength: 512).checkDeliveries(bytes)
    FramedStream(.http, maximumPayloadLength: 512, maximumHeaderLength: 192).checkDeliveries(bytes)
    // LLBSD mode: responses without IPC-Kind are messages.
    FramedStream(.llbsd, maximumPayloadLength: 512).checkDeliveries(bytes)
    return 0
}
