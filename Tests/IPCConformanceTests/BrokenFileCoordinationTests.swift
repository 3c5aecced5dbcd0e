import FilePresenterTransport
import IPCFileCoordination
import Foundation
import IPCBenchKit
import IPCConformance
import IPCCore
import Synchronization
import Testing

/// File coordination that breaks one rule of area 9, around the real one.
struct BrokenFileCoordination: FileCoordinationSystem {
    enum Violation: String, CaseIterable, Sendable, CustomTestStringConvertible {
        /// Its presenters never answer coordinators (save and relinquish callbacks are dropped).
        case presentersNeverAsked
        /// A presenter's reacquirer runs as soon as it relinquished, before the access.
        case reacquiresAtOnce
        /// Its presenters answer at once and relinquish afterwards, so accesses do not wait.
        case answersBeforeRelinquishing
        /// Accesses wait thirty times their timeout.
        case ignoresTimeout
        /// An access that had to wait goes on only when its whole timeout has passed, as a
        /// coordinator that notices a dead presenter only at its timeout would.
        case waitsOutTimeout
        /// cancel() does nothing.
        case ignoresCancel
        /// prepare() runs the batch without asking anyone, so each access asks again.
        case doesNotBatch
        /// Its presenters are not told of renames and deletion.
        case untoldMoves
        /// A coordinator forgets its presenter, so it asks and tells it about its own writes.
        case forgetsOwnPresenter
        /// Its presenters keep the path they were made with after a rename (told, not followed).
        case staysAtOldPath

        var testDescription: String { rawValue }
    }

    let violation: Violation
    private let base = FileCoordination()

    func present(_ path: String, callbacks: FilePresenterCallbacks) throws -> BrokenPresenter {
        var callbacks = callbacks
        switch violation {
        case .untoldMoves:
            callbacks.didMove = nil
            callbacks.accommodateDeletion = nil
        case .presentersNeverAsked:
            callbacks = FilePresenterCallbacks(didChange: callbacks.didChange, didMove: callbacks.didMove, accommodateDeletion: callbacks.accommodateDeletion)
        case .reacquiresAtOnce:
            if let relinquish = callbacks.relinquishToWriter {
                callbacks.relinquishToWriter = { @Sendable () -> FilePresenterCallbacks.Reacquirer? in
                    relinquish()?()
                    return nil
                }
            }
        case .answersBeforeRelinquishing:
            if let relinquish = callbacks.relinquishToWriter {
                callbacks.relinquishToWriter = { @Sendable () -> FilePresenterCallbacks.Reacquirer? in
                    Thread.detachNewThread { _ = relinquish() }
                    return nil
                }
            }
        default:
            break
        }
        return BrokenPresenter(base: try base.present(path, callbacks: callbacks), stuckAt: violation == .staysAtOldPath ? path : nil)
    }

    func coordinator(filePresenter: BrokenPresenter?) -> BrokenCoordinator {
        BrokenCoordinator(base: base.coordinator(filePresenter: violation == .forgetsOwnPresenter ? nil : filePresenter?.base), violation: violation)
    }
}

/// The real presenter, whose path may be stuck where it started.
final class BrokenPresenter: FilePresentation {
    let base: FilePresenter
    private let stuckAt: String?

    init(base: FilePresenter, stuckAt: String?) {
        self.base = base
        self.stuckAt = stuckAt
    }

    var path: String { stuckAt ?? base.path }

    func remove() { base.remove() }
}

struct BrokenCoordinator: FileCoordinating {
    let base: FileCoordinator
    let violation: BrokenFileCoordination.Violation

    func coordinate<T>(readingItemAt path: String, timeout: Duration, byAccessor accessor: (FileAccess) throws -> T) throws -> T {
        try adjusted(timeout) { try base.coordinate(readingItemAt: path, timeout: $0, byAccessor: accessor) }
    }

    func coordinate<T>(writingItemAt path: String, timeout: Duration, byAccessor accessor: (FileAccess) throws -> T) throws -> T {
        try adjusted(timeout) { try base.coordinate(writingItemAt: path, timeout: $0, byAccessor: accessor) }
    }

    func prepare<T>(forReadingItemsAt reading: [String], writingItemsAt writing: [String], timeout: Duration, byAccessor batch: () throws -> T) throws -> T {
        if violation == .doesNotBatch { return try batch() }
        return try base.prepare(forReadingItemsAt: reading, writingItemsAt: writing, timeout: timeout, byAccessor: batch)
    }

    func cancel() {
        if violation != .ignoresCancel { base.cancel() }
    }

    private func adjusted<T>(_ timeout: Duration, _ access: (Duration) throws -> T) throws -> T {
        let started = ContinuousClock.now
        let result = try access(violation == .ignoresTimeout ? timeout * 30 : timeout)
        let took = ContinuousClock.now - started
        if violation == .waitsOutTimeout, took > .milliseconds(1) {
            Thread.sleep(forTimeInterval: Double((timeout - took).components.seconds))
        }
        return result
    }
}

/// Every rule of area 9 can fail: each broken coordination breaks one, and its cases fail
/// (while the real one passes them all, in ``BuiltInTransportTests``).
@Suite("Conformance: broken file coordination is caught", .serialized)
struct BrokenFileCoordinationTests {
    static let expectations: [(BrokenFileCoordination.Violation, [String])] = [
        (.presentersNeverAsked, ["9.1", "9.2", "9.7", "9.9"]),
        (.reacquiresAtOnce, ["9.1"]),
        (.answersBeforeRelinquishing, ["9.3"]),
        (.ignoresTimeout, ["9.3"]),
        (.waitsOutTimeout, ["9.4"]),
        (.ignoresCancel, ["9.5"]),
        (.doesNotBatch, ["9.6"]),
        (.forgetsOwnPresenter, ["9.7"]),
        (.untoldMoves, ["9.8", "9.9"]),
        (.staysAtOldPath, ["9.9"]),
    ]

    @Test(arguments: expectations.map(\.0))
    func violationIsCaught(_ violation: BrokenFileCoordination.Violation) async throws {
        let failing = try #require(Self.expectations.first { $0.0 == violation }?.1)
        var subject = try TransportCatalog.conformanceSubject(named: "file-presenter")
        subject.fileCoordination = FileCoordinationAccess(
            peer: try PeerProcess.executableURL(),
            peerArguments: ["peer", "--transport", "file-presenter", "--role", "coordinator", "--endpoint", "coordinator"],
            system: BrokenFileCoordination(violation: violation)
        )
        let report = await ConformanceSuite(subject: subject, options: ConformanceOptions(cases: failing)).run()
        for id in failing {
            let result = try #require(report.result(id))
            #expect(result.grade == .failed, "\(violation): \(id): \(result.grade): \(result.detail)")
        }
    }
}
