public import Foundation
public import IPCCore

/// The outcome of one case against one subject.
public struct ConformanceResult: Sendable, Hashable, Codable {
    /// How a case came out. Only ``failed`` and ``unexpectedPass`` make a run unsuccessful.
    public enum Grade: String, Sendable, Hashable, Codable, CaseIterable, CustomStringConvertible {
        /// The behaviour was checked and is as required.
        case passed
        /// A required behaviour is missing.
        case failed
        /// The requirement holds, but a recommended behaviour is missing (for example, a death
        /// noticed later than the recommended deadline).
        case nonStrict = "non-strict"
        /// Behaviour recorded, not judged (for example, the time from a kill to invalidation).
        case informational
        /// The subject declares that it lacks what the case needs.
        case notApplicable = "not-applicable"
        /// The case failed and is on the expected-failures list.
        case expectedFailure = "expected-failure"
        /// The case is on the expected-failures list but did not fail: the list is out of date.
        case unexpectedPass = "unexpected-pass"

        public var description: String { rawValue }

        /// Whether this grade makes a run fail.
        public var isFailure: Bool { self == .failed || self == .unexpectedPass }
    }

    public var id: String
    public var statement: String
    public var grade: Grade
    /// Why, in a line or two: what was measured, what went wrong, or why the case does not apply.
    public var detail: String
    /// Named numbers the case recorded, such as `killToInvalidationMilliseconds`.
    public var measurements: [String: Double]
    /// Wall-clock time the case took, in seconds.
    public var seconds: Double

    public init(id: String, statement: String, grade: Grade, detail: String, measurements: [String: Double] = [:], seconds: Double = 0) {
        self.id = id
        self.statement = statement
        self.grade = grade
        self.detail = detail
        self.measurements = measurements
        self.seconds = seconds
    }
}

/// Every result of one run of the suite against one subject.
public struct ConformanceReport: Sendable, Codable {
    /// The subject's name as reports show it, for example `unix-socket (http)`.
    public var subject: String
    public var capabilities: TransportCapabilities
    /// The framing of the raw byte stream the framing cases used, if any.
    public var framing: String?
    /// The payload codecs the secure-decoding cases used.
    public var payloadCodecs: [String]
    public var results: [ConformanceResult]
    public var startedAt: Date
    public var seconds: Double
    /// The deadline within which a survivor must report a peer's death, in seconds.
    public var invalidationDeadlineSeconds: Double

    public init(
        subject: String,
        capabilities: TransportCapabilities,
        framing: String?,
        payloadCodecs: [String],
        results: [ConformanceResult],
        startedAt: Date,
        seconds: Double,
        invalidationDeadlineSeconds: Double
    ) {
        self.subject = subject
        self.capabilities = capabilities
        self.framing = framing
        self.payloadCodecs = payloadCodecs
        self.results = results
        self.startedAt = startedAt
        self.seconds = seconds
        self.invalidationDeadlineSeconds = invalidationDeadlineSeconds
    }

    /// Whether no case failed and no expected failure passed.
    public var isSuccess: Bool { !results.contains { $0.grade.isFailure } }

    /// The results that make the run fail.
    public var failures: [ConformanceResult] { results.filter(\.grade.isFailure) }

    /// How many results have each grade.
    public var counts: [ConformanceResult.Grade: Int] {
        results.reduce(into: [:]) { $0[$1.grade, default: 0] += 1 }
    }

    /// The result of the case `id`, if it ran.
    public func result(_ id: String) -> ConformanceResult? {
        results.first { $0.id == id }
    }

    /// One line: `unix-socket (binary): 31 passed, 2 not-applicable, 1 informational`.
    public var summary: String {
        let parts = ConformanceResult.Grade.allCases.compactMap { grade in
            counts[grade].map { "\($0) \(grade)" }
        }
        return "\(subject): " + (parts.isEmpty ? "no cases ran" : parts.joined(separator: ", "))
    }

    /// Throws if the run failed, naming each failing case; for use from any test framework.
    /// - Throws: ``ConformanceFailure`` listing the failures.
    public func requireSuccess() throws {
        guard isSuccess else {
            let lines = failures.map { "\($0.id) [\($0.grade)] \($0.statement): \($0.detail)" }
            throw ConformanceFailure("\(summary)\n" + lines.joined(separator: "\n"))
        }
    }
}
