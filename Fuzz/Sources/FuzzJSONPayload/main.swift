import FuzzSupport

/// The input is a payload handed to the .json codec.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJSONPayload(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    PayloadReceiver.fuzz(PayloadReceiver.standard(for: .json), data, count)
}
