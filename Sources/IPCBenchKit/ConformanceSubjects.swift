import Foundation
public import IPCConformance
import IPCCore
public import IPCFraming
import IPCSystem
import FilePresenterTransport
import IPCFileCoordination
import NotifyTransport
import Wormhole

extension TransportCatalog {
    /// The built-in transport called `name` as a conformance subject: its peers are
    /// `ipcbench peer` processes, and a stream transport's raw byte stream is its socket file.
    /// - Throws: ``IPCError/Code/unsupportedOperation`` for an unknown name; what
    ///   ``PeerProcess/executableURL()`` throws when there is no `ipcbench` executable.
    public static func conformanceSubject(named name: String, framing: Framing = .binary) throws -> ConformanceSubject {
        let transport = try transport(named: name, framing: framing)
        let peers = ExecutablePeerLauncher(
            executable: try PeerProcess.executableURL(),
            leadingArguments: ["peer", "--transport", name, "--framing", framing.rawValue]
        )
        guard usesFraming(name) else {
            var subject = ConformanceSubject(transport, peers: peers)
            if name == "message-port" { subject.removeLeftovers = removeQueues }
            if name == "file-presenter" {
                // Its presenters and coordinators (area 9); the other process is `ipcbench peer --role coordinator`.
                subject.fileCoordination = FileCoordinationAccess(
                    peer: try PeerProcess.executableURL(),
                    peerArguments: ["peer", "--transport", "file-presenter", "--role", "coordinator", "--endpoint", "coordinator"],
                    system: FileCoordination()
                )
            }
            if name == "notify" {
                // Its named notifications (area 8), posted from another process by `ipcbench notifyutil`.
                subject.notifications = NotificationCenterAccess(poster: try PeerProcess.executableURL(), posterArguments: ["notifyutil"]) {
                    try NotifyCenter(group: $0)
                }
                // MMWormhole's mailbox over its center (area 10), from another process by `ipcbench wormhole`.
                subject.wormhole = WormholeAccess(program: try PeerProcess.executableURL(), programArguments: ["wormhole"]) {
                    try Wormhole(group: $0, center: try NotifyCenter(group: $0))
                }
            }
            return subject
        }
        // The Unix socket transport's endpoint `name` is the socket file `name.sock`.
        let rawStream = RawStreamAccess(framing: framing) { $0.path(suffix: ".sock") }
        return ConformanceSubject(transport, peers: peers, rawStream: rawStream, name: "\(name) (\(framing))")
    }

    /// The subjects for `names` (every transport when empty): one per framing for a transport
    /// that uses one.
    /// - Throws: as ``conformanceSubject(named:framing:)``.
    public static func conformanceSubjects(named names: [String] = []) throws -> [ConformanceSubject] {
        try (names.isEmpty ? Self.names : names).flatMap { name in
            try (usesFraming(name) ? Framing.allCases : [.binary]).map { try conformanceSubject(named: name, framing: $0) }
        }
    }

    /// Removes the POSIX queues named after endpoints of `group` (`/ipcb.<hash>.<endpoint>...`):
    /// a client killed between creating its reply queue and the server learning of it leaves
    /// one that nobody else can know to remove, and queues outlive processes and count against
    /// a small per-user quota.
    @Sendable private static func removeQueues(of group: GroupDirectory) {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: "/dev/mqueue")) ?? []
        for name in names where name.contains("." + group.identifier + ".") {
            MessageQueue.unlink(name: "/" + name)
        }
    }
}
