import FilePresenterTransport
public import IPCCore
public import IPCFraming
import MessagePortTransport
import NotifyTransport
import UnixSocketTransport

/// The transports the harness knows, by the names used on the command line and in reports.
public enum TransportCatalog {
    /// Every transport name the harness accepts.
    public static let names = ["unix-socket", "message-port", "notify", "file-presenter"]

    /// Whether the transport carries the frames of a selectable framing (stream transports do;
    /// message-preserving ones frame messages their own way).
    public static func usesFraming(_ name: String) -> Bool {
        name == "unix-socket"
    }

    /// Whether the transport called `name` honours a spinning wait strategy.
    public static func supportsSpinning(_ name: String) -> Bool {
        (try? transport(named: name, framing: .binary))?.capabilities.supportsSpinning ?? false
    }

    /// The transport called `name`, with the given framing where the transport uses one.
    /// - Throws: ``IPCError/Code/unsupportedOperation`` for an unknown name.
    public static func transport(named name: String, framing: Framing) throws -> any MessageTransport {
        switch name {
        case "unix-socket":
            return UnixSocketTransport(framing: framing)
        case "message-port":
            return MessagePortTransport()
        case "notify":
            return NotifyTransport()
        case "file-presenter":
            return FilePresenterTransport()
        default:
            throw IPCError(code: .unsupportedOperation, message: "unknown transport \(name.debugDescription); known: \(names.joined(separator: ", "))")
        }
    }
}
