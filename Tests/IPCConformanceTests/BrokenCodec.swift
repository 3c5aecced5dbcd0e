import IPCCore
import IPCSecureCoding

/// A real codec that breaks one rule of secure decoding.
struct BrokenCodec: PayloadCodec {
    enum Violation: Sendable {
        /// Every refusal is reported as malformedPayload, whatever its cause.
        case oneErrorForEverything
        /// A payload that does not parse decodes as an empty list instead of failing.
        case acceptsMalformedPayloads
    }

    let base: any PayloadCodec
    let violation: Violation

    var name: String { "broken-\(base.name)" }

    func encode(_ message: some SecureMessage) throws -> [UInt8] {
        try base.encode(message)
    }

    func decode(_ bytes: [UInt8], allowing allowList: AllowList, limits: DecodingLimits) throws -> any SecureMessage {
        do {
            return try base.decode(bytes, allowing: allowList, limits: limits)
        } catch let error as IPCError {
            switch violation {
            case .oneErrorForEverything:
                throw IPCError(code: .malformedPayload, message: error.message)
            case .acceptsMalformedPayloads where error.code == .malformedPayload:
                return MessageList([])
            case .acceptsMalformedPayloads:
                throw error
            }
        }
    }
}
