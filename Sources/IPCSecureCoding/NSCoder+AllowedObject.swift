public import Foundation

extension NSCoder {
    /// Decodes the object stored under `key`, checking its class against every class the receiver
    /// allowed, then casts it to `T`; nil if there is none or it is not a `T`.
    ///
    /// Use it in `init(coder:)` of classes carried by ``KeyedArchivePayloadCodec`` instead of
    /// `decodeObject(of:forKey:)`. On Linux, `decodeObject(of:forKey:)` traps when the archive
    /// holds a class outside the list passed to that one call; the codec has already checked every
    /// class in the archive against the receiver's allow-list, so decoding against that same list
    /// cannot trap, and the cast does the per-key type check instead. A coder that does not
    /// require secure coding has no allowed set; for it this is `decodeObject(forKey:)`.
    public func decodeAllowedObject<T>(of type: T.Type, forKey key: String) -> T? {
        let object = requiresSecureCoding ? decodeObject(of: allowedClasses, forKey: key) : decodeObject(forKey: key)
        return object as? T
    }
}
