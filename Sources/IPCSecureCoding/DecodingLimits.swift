import IPCCore

/// Bounds a receiver puts on every payload before a codec hands the bytes to Foundation.
public struct DecodingLimits: Sendable, Hashable {
    /// The longest payload accepted, in bytes. Default 1 MiB.
    public var maximumPayloadLength: Int
    /// The deepest nesting accepted: arrays and objects in JSON, `<array>` and `<dict>` in a property
    /// list, and chains of object references in a keyed archive. Default 32.
    public var maximumDepth: Int

    public init(maximumPayloadLength: Int = 1 << 20, maximumDepth: Int = 32) {
        self.maximumPayloadLength = maximumPayloadLength
        self.maximumDepth = maximumDepth
    }

    /// - Throws: ``IPCError/Code/payloadTooLarge`` if `length` is above ``maximumPayloadLength``.
    func checkLength(_ length: Int) throws {
        guard length <= maximumPayloadLength else {
            throw IPCError(code: .payloadTooLarge, message: "payload of \(length) bytes is above the maximum of \(maximumPayloadLength)")
        }
    }
}
