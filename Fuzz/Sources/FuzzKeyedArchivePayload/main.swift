import Foundation
import FuzzSupport

/// The input is a payload handed to the .keyedArchive codec. Besides the standard receivers, one
/// also allows every Foundation class the codec accepts, so that their Linux decoders are reached.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzKeyedArchivePayload(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    let foundationClasses: [any (NSObject & NSSecureCoding).Type] = [NSMutableArray.self, NSDictionary.self, NSMutableDictionary.self, NSData.self, NSMutableData.self]
    let extended = PayloadReceiver.standard(for: .keyedArchive, extraClasses: foundationClasses)[0]
    return PayloadReceiver.fuzz(PayloadReceiver.standard(for: .keyedArchive) + [extended], data, count)
}
