import Foundation

/// Reads the object references ("UIDs") of a keyed archive after `PropertyListSerialization` has
/// parsed it.
///
/// In XML an archive writes a reference as `<dict><key>CF$UID</key><integer>N</integer></dict>`.
/// CoreFoundation's parser turns such a dictionary into a keyed-archiver UID, which
/// swift-corelibs-foundation surfaces as an instance of its internal class `_NSKeyedArchiverUID`
/// (a `final class` over `NSObject` with a stored `value: UInt32`; the integer is truncated to 32
/// bits, so `-1` reads as 4294967295). Linux Foundation offers no public accessor: there is no
/// key-value coding, `description` prints only the address, and `hash` is the address too. The
/// stored property is readable with `Mirror`, which is what this type does.
///
/// Because that relies on a private layout, the first use parses a probe archive with a known
/// UID and checks that it reads back; if a future Foundation changes the representation,
/// ``isSupported`` is false and the keyed-archive codec refuses every payload instead of misreading one.
enum KeyedArchiveUID {
    private static let probeValue: UInt32 = 0x1234_5678

    /// The dynamic type of a parsed UID, learned from a probe, or nil if the probe did not read back.
    private static let uidType: ObjectIdentifier? = {
        let probe = "<plist version=\"1.0\"><dict><key>CF$UID</key><integer>\(probeValue)</integer></dict></plist>"
        guard let uid = try? PropertyListSerialization.propertyList(from: Data(probe.utf8), format: nil),
            storedValue(of: uid) == probeValue
        else {
            return nil
        }
        return ObjectIdentifier(type(of: uid))
    }()

    /// Whether this Foundation's UIDs can be read.
    static var isSupported: Bool { uidType != nil }

    /// The object index a parsed property-list value refers to, or nil if the value is not a UID.
    static func index(of value: Any) -> Int? {
        guard let uidType, ObjectIdentifier(type(of: value)) == uidType else { return nil }
        return storedValue(of: value).map(Int.init)
    }

    private static func storedValue(of uid: Any) -> UInt32? {
        Mirror(reflecting: uid).children.first { $0.label == "value" }?.value as? UInt32
    }
}
