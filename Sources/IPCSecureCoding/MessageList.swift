import IPCCore

/// A heterogeneous list of messages for the Codable codecs. Each element carries its own type name,
/// so the receiver checks every element against its allow-list, and one element of a disallowed
/// type refuses the whole list with ``IPCError/Code/disallowedType`` naming the element's index.
///
/// A receiver allows `MessageList` itself and each element type it accepts. Lists may nest; the
/// nesting limit bounds how deep.
public struct MessageList: CodableMessage {
    public static var typeName: String { "ipcbench.MessageList" }

    public var messages: [any CodableMessage]

    public init(_ messages: [any CodableMessage]) {
        self.messages = messages
    }

    public init(from decoder: any Decoder) throws {
        var container = try decoder.unkeyedContainer()
        var messages: [any CodableMessage] = []
        while !container.isAtEnd {
            let index = container.currentIndex
            do {
                messages.append(try container.decode(MessageEnvelope.self).message)
            } catch let error as IPCError {
                throw IPCError(code: error.code, message: "element \(index) of \(Self.typeName): \(error.message)", cause: error.cause)
            }
        }
        self.messages = messages
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.unkeyedContainer()
        for message in messages {
            try container.encode(MessageEnvelope(message))
        }
    }
}
