import IPCCore

/// A broken requirement. Cases throw it (through ``check(_:_:)`` and its siblings) instead of
/// calling a test framework, so the suite runs under XCTest, Swift Testing or a command line.
public struct ConformanceFailure: Error, Sendable, CustomStringConvertible {
    public var description: String

    public init(_ description: String) {
        self.description = description
    }
}

/// How a case that did not throw came out. A case that throws has failed.
public enum CaseOutcome: Sendable {
    case passed(String)
    /// The requirement holds, but a recommended behaviour is missing.
    case nonStrict(String)
    /// Recorded, not judged.
    case informational(String)
    /// The case cannot run against this subject, for a reason found only while running.
    case notApplicable(String)
}

/// Fails the case with `message` unless `condition` holds.
/// - Throws: ``ConformanceFailure``.
func check(_ condition: Bool, _ message: @autoclosure () -> String) throws {
    if !condition { throw ConformanceFailure(message()) }
}

/// Runs `body`, which must throw an ``IPCError`` whose code is one of `codes`, and returns it.
/// - Throws: ``ConformanceFailure`` if `body` succeeds or throws anything else.
@discardableResult
func checkError<T>(_ codes: Set<IPCError.Code>, _ what: String, _ body: () async throws -> T) async throws -> IPCError {
    let expected = codes.map(\.description).sorted().joined(separator: " or ")
    do {
        _ = try await body()
    } catch let error as IPCError {
        try check(codes.contains(error.code), "\(what): expected \(expected), got \(error)")
        return error
    } catch {
        throw ConformanceFailure("\(what): expected IPCError \(expected), got \(error)")
    }
    throw ConformanceFailure("\(what): expected IPCError \(expected), but it succeeded")
}

extension Duration {
    /// The duration in milliseconds, for details and measurements.
    var milliseconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) * 1000 + Double(attoseconds) / 1e15
    }

    /// `"12.3 ms"`.
    var formattedMilliseconds: String {
        let value = milliseconds
        return value < 10 ? "\((value * 100).rounded() / 100) ms" : "\((value * 10).rounded() / 10) ms"
    }
}
