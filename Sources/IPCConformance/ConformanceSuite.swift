import Foundation
import IPCCore
import Synchronization
import IPCFraming
import IPCSecureCoding

/// Runs the cases of ``catalog`` against a subject, one at a time, and grades each.
///
///     let subject = ConformanceSubject(ToyTransport(), peers: ExecutablePeerLauncher(executable: peerURL))
///     let report = await ConformanceSuite(subject: subject).run()
///     try report.requireSuccess()
public struct ConformanceSuite: Sendable {
    public var subject: ConformanceSubject
    public var options: ConformanceOptions

    public init(subject: ConformanceSubject, options: ConformanceOptions = ConformanceOptions()) {
        self.subject = subject
        self.options = options
    }

    /// Every case, in id order.
    public static let catalog: [ConformanceCase] =
        DeliveryCases.all + FramingCases.all + SecureDecodingCases.all + RequestReplyCases.all + LifecycleCases.all + PeerDeathCases.all + ServiceCases.all + NotificationCases.all + FileCoordinationCases.all + WormholeCases.all + ServingCases.all

    /// The cases ``ConformanceOptions/cases`` selects.
    public var selectedCases: [ConformanceCase] {
        guard !options.cases.isEmpty else { return Self.catalog }
        return Self.catalog.filter { testCase in options.cases.contains { testCase.isSelected(by: $0) } }
    }

    /// Runs the selected cases and returns their results. Never throws: a case that throws or
    /// exceeds its time limit has failed.
    public func run() async -> ConformanceReport {
        let startedAt = Date()
        let start = ContinuousClock.now
        var results: [ConformanceResult] = []
        for testCase in selectedCases {
            let result = await run(testCase)
            options.onResult?(result)
            results.append(result)
        }
        return ConformanceReport(
            subject: subject.name,
            capabilities: subject.capabilities,
            framing: subject.rawStream?.framing.rawValue,
            payloadCodecs: subject.payloadCodecs.map(\.name),
            results: results,
            startedAt: startedAt,
            seconds: (ContinuousClock.now - start).seconds,
            invalidationDeadlineSeconds: options.invalidationDeadline.seconds
        )
    }

    private func run(_ testCase: ConformanceCase) async -> ConformanceResult {
        var result = ConformanceResult(id: testCase.id, statement: testCase.statement, grade: .notApplicable, detail: "")
        if let requirement = testCase.requirements.first(where: { !$0.isMet(subject) }) {
            result.detail = requirement.description
            return result
        }
        let start = ContinuousClock.now
        let context: CaseContext
        do {
            context = try CaseContext(subject: subject, options: options, caseID: testCase.id)
        } catch {
            result.grade = .failed
            result.detail = "could not set up the case: \(error)"
            return result
        }
        let outcome = await outcome(of: testCase, in: context)
        await context.tearDown()
        result.seconds = (ContinuousClock.now - start).seconds
        result.measurements = context.measurements
        switch outcome {
        case .success(.passed(let detail)): (result.grade, result.detail) = (.passed, detail)
        case .success(.nonStrict(let detail)): (result.grade, result.detail) = (.nonStrict, detail)
        case .success(.informational(let detail)): (result.grade, result.detail) = (.informational, detail)
        case .success(.notApplicable(let detail)): (result.grade, result.detail) = (.notApplicable, detail)
        case .failure(let error): (result.grade, result.detail) = (.failed, "\(error)")
        }
        if options.expectedFailures.contains(where: { testCase.isSelected(by: $0) }) {
            switch result.grade {
            case .failed: result.grade = .expectedFailure
            case .passed, .nonStrict: result.grade = .unexpectedPass
            default: break
            }
        }
        return result
    }

    /// The case's outcome, or a failure when it throws or runs past the time limit.
    ///
    /// Not a task group: a group waits for every child, and a case stuck in a blocking call
    /// (the very bug it may have found) would hold the whole run. A timed-out case is left
    /// running; tear-down (in the caller) kills its peers and invalidates its connections,
    /// which releases whatever it waits on.
    private func outcome(of testCase: ConformanceCase, in context: CaseContext) async -> Result<CaseOutcome, any Error> {
        let limit = options.caseTimeLimit
        let resumed = Mutex(false)
        return await withCheckedContinuation { continuation in
            let finish: @Sendable (Result<CaseOutcome, any Error>) -> Void = { result in
                let first = resumed.withLock { resumed in
                    defer { resumed = true }
                    return !resumed
                }
                if first { continuation.resume(returning: result) }
            }
            let timer = Mutex<Task<Void, Never>?>(nil)
            let body = Task {
                do { finish(.success(try await testCase.body(context))) } catch { finish(.failure(error)) }
                timer.withLock { $0?.cancel() }
            }
            timer.withLock { timer in
                timer = Task {
                    try? await Task.sleep(for: limit)
                    guard !Task.isCancelled else { return }
                    body.cancel()
                    finish(.failure(ConformanceFailure("the case did not finish within \(limit)")))
                }
            }
        }
    }
}
