import Foundation
import IPCCore

/// `NSKeyedArchiver` with secure coding, in the XML format: the seeds' codec, with a guard.
///
/// On Linux, `NSKeyedUnarchiver` traps (`fatalError`) instead of throwing when an archive names a
/// class outside the allowed set, and crashes on a few other hostile archives (see
/// ``KeyedArchiveValidator``). So a payload is decoded in steps, each bounded before the next:
/// its length; its nesting, by a scan of the XML tags (binary archives are refused, as by
/// ``PropertyListPayloadCodec``); a parse with `PropertyListSerialization`; a check of the whole
/// object graph against the allow-list and the depth limit; and only then
/// `NSKeyedUnarchiver.unarchivedObject(ofClasses:from:)` with the allow-list's classes.
///
/// Classes decoded by this codec must decode their child objects with
/// `NSCoder.decodeAllowedObject(of:forKey:)` (or `decodeObject(forKey:)`), not with a class list
/// of their own: on Linux `decodeObject(of:forKey:)` traps when the archive holds a class outside
/// the list given to that one call, a list no check of the archive can see. The checked archive
/// contains only allowed classes, so decoding against the whole allow-list cannot trap. Of
/// Foundation's classes only those whose Linux decoders cannot crash are accepted (see
/// ``AllowList/allow(class:)``), and an `NSDictionary` must map plain values to plain values.
public struct KeyedArchivePayloadCodec: PayloadCodec {
    public init() {}

    public var name: String { "keyedArchive" }

    /// - Throws: ``IPCError/Code/unsupportedOperation`` if `message` is not an `NSObject` that
    ///   conforms to `NSSecureCoding` with `supportsSecureCoding` true.
    public func encode(_ message: some SecureMessage) throws -> [UInt8] {
        guard let object = message as? any NSObject & NSSecureCoding, type(of: object).supportsSecureCoding else {
            throw IPCError(code: .unsupportedOperation, message: "the keyed-archive codec carries NSObject classes that support secure coding; \(type(of: message)) is not one")
        }
        let archiver = NSKeyedArchiver(requiringSecureCoding: true)
        archiver.outputFormat = .xml
        archiver.encode(object, forKey: NSKeyedArchiveRootObjectKey)
        archiver.finishEncoding()
        return [UInt8](archiver.encodedData)
    }

    /// - Throws: as ``PayloadCodec/decode(_:allowing:limits:)``. A root object that is not a
    ///   ``SecureMessage`` is ``IPCError/Code/disallowedType``; a reference cycle, which the Linux
    ///   unarchiver would follow forever, is ``IPCError/Code/malformedPayload``; a chain of object
    ///   references longer than the depth limit is ``IPCError/Code/nestingTooDeep``.
    public func decode(_ bytes: [UInt8], allowing allowList: AllowList, limits: DecodingLimits) throws -> any SecureMessage {
        try limits.checkLength(bytes.count)
        try NestingScanner.checkXMLPropertyList(bytes, maximumDepth: limits.maximumDepth)
        guard KeyedArchiveUID.isSupported else {
            throw IPCError(code: .malformedPayload, message: "this Foundation's keyed-archive object references cannot be read, so no archive can be checked")
        }
        let data = Data(bytes)
        let plist: Any
        do {
            plist = try PropertyListSerialization.propertyList(from: data, format: nil)
        } catch {
            throw IPCError(code: .malformedPayload, message: "not a property list", cause: error)
        }
        try KeyedArchiveValidator(allowList: allowList, maximumDepth: limits.maximumDepth).validate(plist)

        let root: Any?
        do {
            root = try NSKeyedUnarchiver.unarchivedObject(ofClasses: allowList.classes, from: data)
        } catch {
            throw IPCError(code: .malformedPayload, message: "the archive does not decode", cause: error)
        }
        guard let root else {
            throw IPCError(code: .malformedPayload, message: "the archive's root object is null")
        }
        guard let message = root as? any SecureMessage else {
            throw IPCError(code: .disallowedType, message: "the archive's root object, of type \(type(of: root)), is not a SecureMessage")
        }
        return message
    }
}

extension PayloadCodec where Self == KeyedArchivePayloadCodec {
    /// `NSKeyedArchiver` secure-coding payloads, guarded against the Linux unarchiver's traps.
    public static var keyedArchive: KeyedArchivePayloadCodec { KeyedArchivePayloadCodec() }
}
