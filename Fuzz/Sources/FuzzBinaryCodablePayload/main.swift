import FuzzSupport

/// The input is a payload handed to the .binaryCodable codec.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzBinaryCodablePayload(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    PayloadReceiver.fuzz(PayloadReceiver.standard(for: .binaryCodable), data, count)
}
