import Foundation
import IPCCore
import IPCSecureCoding
import Testing

/// Runs `body`, which must throw an ``IPCError``, and returns it; records an issue otherwise.
@discardableResult
func expectIPCError(
    _ code: IPCError.Code,
    sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws -> Void
) -> IPCError? {
    do {
        try body()
        Issue.record("expected IPCError \(code), but nothing was thrown", sourceLocation: sourceLocation)
    } catch let error as IPCError {
        #expect(error.code == code, "\(error)", sourceLocation: sourceLocation)
        return error
    } catch {
        Issue.record("expected IPCError \(code), got \(error)", sourceLocation: sourceLocation)
    }
    return nil
}

/// A second Codable message type, for allow-lists that refuse it.
struct Ping: CodableMessage, Equatable {
    static var typeName: String { "test.Ping" }
    var sequence: Int
}

/// An archivable class that allow-lists in these tests refuse.
final class CouponObject: NSObject, NSSecureCoding, SecureMessage {
    static var supportsSecureCoding: Bool { true }
    let code: String

    init(code: String) {
        self.code = code
    }

    func encode(with coder: NSCoder) {
        coder.encode(code, forKey: "code")
    }

    init?(coder: NSCoder) {
        guard let code = coder.decodeAllowedObject(of: String.self, forKey: "code") else { return nil }
        self.code = code
    }
}

/// An archivable heterogeneous container: its elements may be of any class. Immutable, so
/// `@unchecked Sendable` is safe although `NSObject` elements are not `Sendable`.
final class BasketObject: NSObject, NSSecureCoding, SecureMessage, @unchecked Sendable {
    static var supportsSecureCoding: Bool { true }
    let contents: [NSObject]
    let labels: [String: String]

    init(contents: [NSObject], labels: [String: String] = [:]) {
        self.contents = contents
        self.labels = labels
    }

    func encode(with coder: NSCoder) {
        coder.encode(contents, forKey: "contents")
        coder.encode(labels, forKey: "labels")
    }

    init?(coder: NSCoder) {
        guard let contents = coder.decodeAllowedObject(of: [NSObject].self, forKey: "contents"),
            let labels = coder.decodeAllowedObject(of: [String: String].self, forKey: "labels")
        else { return nil }
        self.contents = contents
        self.labels = labels
    }
}

extension Array where Element == UInt8 {
    init(_ string: String) {
        self = Array(string.utf8)
    }

    /// Whether every byte from `index` on is XML or JSON whitespace.
    func isWhitespace(from index: Int) -> Bool {
        self[index...].allSatisfy { [0x20, 0x09, 0x0A, 0x0D].contains($0) }
    }

    /// Replaces every occurrence of `target` with `replacement`, as text.
    func replacingText(_ target: String, with replacement: String) -> [UInt8] {
        let text = String(decoding: self, as: UTF8.self)
        #expect(text.contains(target), "payload does not contain \(target)")
        return [UInt8](text.replacingOccurrences(of: target, with: replacement))
    }
}
