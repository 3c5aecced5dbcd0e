import Foundation
import IPCCore

extension CodingUserInfoKey {
    /// Where the Codable codecs hand the receiver's ``AllowList`` to ``MessageEnvelope``.
    static let allowList = CodingUserInfoKey(rawValue: "ipcbench.allowList")!
}

/// The wire shape of a Codable payload, and of each element of a ``MessageList``:
/// `{"type": <SecureMessage.typeName>, "value": <the message>}`.
///
/// Decoding reads the type name first and looks it up on the receiver's allow-list; a name that is
/// not there is refused before any of the value is decoded.
struct MessageEnvelope: Codable {
    var message: any CodableMessage

    private enum CodingKeys: String, CodingKey {
        case type, value
    }

    init(_ message: any CodableMessage) {
        self.message = message
    }

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let typeName = try container.decode(String.self, forKey: .type)
        guard let allowList = decoder.userInfo[.allowList] as? AllowList,
            let decode = allowList.decoder(forTypeName: typeName)
        else {
            throw Self.disallowed(typeName)
        }
        message = try decode(container.superDecoder(forKey: .value))
    }

    /// The refusal of a type name that the receiver's allow-list does not name.
    /// The name is quoted as `debugDescription` quotes it, without its cost for a name of
    /// printable ASCII: a refusal should cost less than a decode.
    static func disallowed(_ typeName: String) -> IPCError {
        let plain = typeName.utf8.allSatisfy { $0 >= 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }
        let quoted = plain ? "\"" + typeName + "\"" : typeName.debugDescription
        return IPCError(code: .disallowedType, message: "type " + quoted + " is not on the receiver's allow-list")
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(type(of: message).typeName, forKey: .type)
        try message.encode(to: container.superEncoder(forKey: .value))
    }
}

extension MessageEnvelope {
    /// Encodes `message` in an envelope with a Foundation encoder.
    /// - Throws: ``IPCError/Code/unsupportedOperation`` if `message` is not a ``CodableMessage``;
    ///   ``IPCError/Code/malformedPayload`` if the encoder fails.
    static func encode(_ message: some SecureMessage, format: String, with encode: (MessageEnvelope) throws -> Data) throws -> [UInt8] {
        guard let codable = message as? any CodableMessage else {
            throw IPCError(code: .unsupportedOperation, message: "the \(format) codec carries CodableMessage types; \(type(of: message)) is not one")
        }
        do {
            return [UInt8](try encode(MessageEnvelope(codable)))
        } catch {
            throw IPCError(code: .malformedPayload, message: "\(type(of: message)) cannot be encoded by the \(format) codec", cause: error)
        }
    }

    /// Runs a Foundation decode of an envelope. An ``IPCError`` from the envelope (a disallowed
    /// type) passes through; any other error means the bytes are not a valid payload.
    /// - Throws: ``IPCError/Code/disallowedType`` or ``IPCError/Code/malformedPayload``.
    static func decode(format: String, with decode: () throws -> MessageEnvelope) throws -> any SecureMessage {
        do {
            return try decode().message
        } catch let error as IPCError {
            throw error
        } catch {
            throw IPCError(code: .malformedPayload, message: "not a valid \(format) message envelope", cause: error)
        }
    }
}
