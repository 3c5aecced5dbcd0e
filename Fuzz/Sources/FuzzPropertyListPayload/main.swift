import FuzzSupport

/// The input is a payload handed to the .propertyList codec.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzPropertyListPayload(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    PayloadReceiver.fuzz(PayloadReceiver.standard(for: .propertyList), data, count)
}
