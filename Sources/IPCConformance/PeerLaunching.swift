import Foundation
import IPCCore

/// Starts peer processes for the suite: the caller's half of a subject.
///
/// A peer is a separate process that runs ``ConformancePeer`` over the transport under test,
/// so that every case crosses a real process boundary and the peer-death cases can kill it with
/// SIGKILL. Most implementations are an ``ExecutablePeerLauncher`` naming an executable whose
/// `main` runs ``ConformancePeer/main(transport:)``.
public protocol ConformancePeerLauncher: Sendable {
    /// Starts a peer; returns as soon as the process exists, before it is ready (so that a case
    /// can kill it during connection set-up).
    /// - Throws: any error; the case that asked fails with it.
    func launch(_ configuration: ConformancePeer.Configuration) throws -> any ConformancePeerProcess
}

/// A running peer process.
public protocol ConformancePeerProcess: AnyObject, Sendable {
    var pid: Int32 { get }

    /// Waits until the peer announces that it listens or is connected, and returns the
    /// announcement.
    /// - Throws: an error if the peer exits or says nothing else within `timeout`.
    func waitUntilReady(timeout: Duration) throws -> ConformancePeer.Announcement

    /// Kills the peer with SIGKILL, as a crash or the OOM killer would.
    func kill()

    /// Asks the peer to finish (it closes its connections) and waits for it to exit; after
    /// ``kill()``, only waits. Also ends a grandchild the peer started. Idempotent.
    func stop()
}

extension ConformancePeerProcess {
    /// Stops the peer's process with SIGSTOP: alive, holding its connections, reading nothing
    /// (a client that never reads).
    public func suspend() {
        _ = Foundation.kill(pid, SIGSTOP)
    }

    /// Lets a ``suspend()``ed peer run again (SIGCONT).
    public func resume() {
        _ = Foundation.kill(pid, SIGCONT)
    }
}

extension ConformancePeer {
    /// The line a peer prints on standard output once it listens or is connected:
    /// `READY <pid>`, or `READY <pid> grandchild <pid>` when it started a grandchild.
    public struct Announcement: Sendable, Hashable {
        public var pid: Int32
        /// The grandchild the peer started (``Configuration/grandchild``), which outlives it.
        public var grandchildPID: Int32?

        public init(pid: Int32, grandchildPID: Int32? = nil) {
            self.pid = pid
            self.grandchildPID = grandchildPID
        }

        /// Parses an announcement line; `nil` if `line` is not one.
        public init?(line: String) {
            let words = line.split(separator: " ")
            guard words.count >= 2, words[0] == "READY", let pid = Int32(words[1]) else { return nil }
            self.pid = pid
            if words.count == 4, words[2] == "grandchild", let grandchild = Int32(words[3]) {
                grandchildPID = grandchild
            } else if words.count != 2 {
                return nil
            }
        }

        /// The line, without its newline.
        public var line: String {
            grandchildPID.map { "READY \(pid) grandchild \($0)" } ?? "READY \(pid)"
        }
    }
}
