public import Foundation

/// One transport's kill cycles in a soak.
public struct SoakTransportResult: Codable, Sendable, Equatable {
    public var transport: String
    /// Kill cycles run (warm-up cycles not included).
    public var cycles = 0
    /// Cycles that killed the server peer while the harness was its client.
    public var serverKills = 0
    /// Cycles that killed the client peer while the harness served it, once connected.
    public var clientKills = 0
    /// Cycles that killed the client peer while it was still connecting.
    public var connectKills = 0
    public var delivery = DeliveryTally()
    /// Connections that had to report the peer's death, and those whose invalidation handler
    /// ran within the deadline.
    public var invalidationsExpected = 0
    public var invalidationsSeen = 0
    /// How the invalidations were reported, by reason kind.
    public var invalidationReasons: [String: Int] = [:]
    /// Requests left pending (a `stall` request) when the peer was killed, and those that then
    /// failed with `peerInvalidated` as they must.
    public var pendingRequests = 0
    public var pendingRequestsFailedCorrectly = 0
    /// Errors where none was allowed: a send or request failing before the kill, a peer that did
    /// not start or connect, a pending request failing the wrong way.
    public var errors = 0

    public init(transport: String) {
        self.transport = transport
    }

    public var violations: Int {
        delivery.violations + (invalidationsExpected - invalidationsSeen) + (pendingRequests - pendingRequestsFailedCorrectly) + errors
    }
}

/// A cycle that did not finish within its deadline.
public struct SoakHang: Codable, Sendable, Equatable {
    public var transport: String
    public var cycle: Int
    public var role: String
    /// What the cycle was doing when the deadline passed.
    public var phase: String
    public var deadlineSeconds: Double
}

/// Everything a soak found: `ipcbench soak --output` writes it as JSON.
public struct SoakReport: Codable, Sendable {
    public static let schema = "ipcbench.soak/1"

    public var schema = SoakReport.schema
    public var seed: UInt64
    public var transports: [SoakTransportResult]
    /// Resources before the kill cycles (after the warm-up) and after the final clean-up.
    public var resources: [SoakResourceCount]
    public var hang: SoakHang?
    /// The first violations, each with the transport and cycle where it happened.
    public var failures: [String]
    public var elapsedSeconds: Double
    /// Why the run stopped: the cycle count, the duration, or a hang.
    public var stoppedBy: String

    public var cycles: Int { transports.reduce(0) { $0 + $1.cycles } }

    public var leaks: Int { resources.filter(\.leaked).count }

    public var violations: Int { transports.reduce(0) { $0 + $1.violations } + leaks + (hang == nil ? 0 : 1) }

    public var passed: Bool { violations == 0 }

    public func json() throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        return try encoder.encode(self)
    }

    /// The summary: a row per transport, then the resources counted before and after.
    public func table() -> String {
        var text = ""
        let header = ["transport", "cycles", "kills srv/cli/conn", "sent", "acked", "delivered", "dup", "order", "lost", "corrupt", "invalidated", "pending ok", "errors"]
        var rows = transports.map { result -> [String] in
            let delivery = result.delivery
            return [
                result.transport, String(result.cycles), "\(result.serverKills)/\(result.clientKills)/\(result.connectKills)",
                String(delivery.sent), String(delivery.acknowledged), String(delivery.delivered),
                String(delivery.duplicates), String(delivery.outOfOrder), String(delivery.lost), String(delivery.corrupt),
                "\(result.invalidationsSeen)/\(result.invalidationsExpected)",
                "\(result.pendingRequestsFailedCorrectly)/\(result.pendingRequests)", String(result.errors),
            ]
        }
        rows.insert(header, at: 0)
        text += ReportRenderer.fixedWidth(rows, leftAligned: 1)
        text += "\n"
        var resourceRows = [["resource", "before", "after", "delta"]]
        for count in resources {
            resourceRows.append([count.resource, count.before.map(String.init) ?? "-", count.after.map(String.init) ?? "-", count.delta.map { $0 > 0 ? "+\($0)" : String($0) } ?? "-"])
        }
        let notes = [""] + resources.map { $0.leaked ? "  LEAK: " + $0.leftovers.joined(separator: ", ") : $0.note.map { "  " + $0 } ?? "" }
        let lines = ReportRenderer.fixedWidth(resourceRows, leftAligned: 1).split(separator: "\n")
        text += zip(lines, notes).map { line, note in String(line) + note + "\n" }.joined()
        if let hang {
            text += "\nHANG: \(hang.transport) cycle \(hang.cycle) (\(hang.role)) did not finish within \(hang.deadlineSeconds) s; it was \(hang.phase)\n"
        }
        if !failures.isEmpty {
            text += "\nviolations:\n" + failures.map { "  " + $0 + "\n" }.joined()
        }
        text += "\n\(cycles) kill cycles in \(String(format: "%.1f", elapsedSeconds)) s (seed \(seed), stopped by \(stoppedBy)): "
        text += passed ? "no violations\n" : "\(violations) violation(s)\n"
        return text
    }
}
