/// A directory shared by the processes that talk to each other: the counterpart of an app group
/// container. Transports create their endpoints, queues and stores inside it.
public struct GroupDirectory: Sendable, Hashable, CustomStringConvertible {
    /// Absolute path of the directory.
    public var path: String

    public init(path: String) {
        self.path = path
    }

    public var description: String { path }

    /// The group's identifier: the last component of its path. Transports with app-group
    /// scoped names (message ports) require names to begin with it and a period.
    public var identifier: String {
        String(path.split(separator: "/").last ?? "")
    }
}

/// A named place to listen on or connect to, inside a group directory.
public struct Endpoint: Sendable, Hashable, CustomStringConvertible {
    public var group: GroupDirectory
    public var name: String

    /// The longest name accepted. `sun_path` holds 108 bytes, so names are kept short enough that
    /// a name plus a transport suffix fits in a reasonably deep group directory.
    public static let maximumNameLength = 64

    /// - Throws: ``IPCError/Code/invalidEndpoint`` if `name` is empty, too long, or contains a byte
    ///   other than ASCII letters, digits, `.`, `_` and `-` (so it can never escape the group
    ///   directory), or starts with `.`.
    public init(group: GroupDirectory, name: String) throws {
        guard Self.isValidName(name) else {
            throw IPCError(
                code: .invalidEndpoint,
                message: "endpoint name \(name.debugDescription) must be 1-\(Self.maximumNameLength) characters of [A-Za-z0-9._-] and not start with '.'"
            )
        }
        guard group.path.hasPrefix("/") else {
            throw IPCError(code: .invalidEndpoint, message: "group directory \(group.path.debugDescription) must be an absolute path")
        }
        self.group = group
        self.name = name
    }

    public static func isValidName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard !bytes.isEmpty, bytes.count <= maximumNameLength, bytes[0] != UInt8(ascii: ".") else { return false }
        return bytes.allSatisfy { byte in
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "-"):
                return true
            default:
                return false
            }
        }
    }

    /// The path of a file that belongs to this endpoint, `group/name + suffix`.
    public func path(suffix: String) -> String {
        group.path.hasSuffix("/") ? group.path + name + suffix : group.path + "/" + name + suffix
    }

    public var description: String { "\(group.path)/\(name)" }

    /// Whether the name is scoped to the group: `<group identifier>.<rest>`.
    public var isScopedToGroup: Bool {
        let prefix = group.identifier + "."
        return name.hasPrefix(prefix) && name.count > prefix.count
    }
}
