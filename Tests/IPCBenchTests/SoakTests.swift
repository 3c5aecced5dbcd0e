import Foundation
@testable import IPCBenchKit
import IPCTestSupport
import Testing
import IPCCore

/// The soak: its delivery checker, its watchdog, and a tiny run through the command line.
@Suite("Soak", .usesMessageQueues)
struct SoakTests {
    /// A log of one-way messages 1...`count` sent, with these sequence numbers echoed.
    private func log(sent count: UInt64, echoed: [UInt64]) -> DeliveryLog {
        var log = DeliveryLog()
        log.sentOneWay = Array(1...count)
        log.attempted = Set(1...count)
        log.echoes = echoed.map { (SoakPayload.msgid($0), SoakPayload.make($0)) }
        return log
    }

    @Test("every echo back once and in order, with the tail in flight at the kill: no violation")
    func cleanDelivery() {
        var log = log(sent: 10, echoed: [1, 2, 3, 4, 5, 6, 7])
        log.sentRequests = 1
        log.replies = [(11, SoakPayload.make(11))]
        let tally = DeliveryCheck.verify(log)
        #expect(tally.violations == 0)
        #expect(tally.sent == 11)
        #expect(tally.acknowledged == 8)
        #expect(tally.delivered == 8)
    }

    @Test("the checker reports duplicates, reordering, losses before an acknowledged message, and corruption")
    func checkerCanFail() {
        #expect(DeliveryCheck.verify(log(sent: 5, echoed: [1, 2, 2, 3])).duplicates == 1)
        #expect(DeliveryCheck.verify(log(sent: 5, echoed: [1, 3, 2, 4])).outOfOrder == 1)
        let gap = DeliveryCheck.verify(log(sent: 6, echoed: [1, 2, 4, 5]))
        #expect(gap.lost == 1)
        #expect(gap.violations == 1)
        // Sent but never echoed is allowed after a kill, not after a clean stop.
        #expect(DeliveryCheck.verify(log(sent: 4, echoed: [1, 2])).violations == 0)
        #expect(DeliveryCheck.verify(log(sent: 4, echoed: [1, 2]), requireAll: true).lost == 2)
        var corrupt = log(sent: 3, echoed: [1, 2])
        corrupt.echoes[1].payload[7] ^= 0xFF
        corrupt.echoes.append((SoakPayload.msgid(99), SoakPayload.make(99)))
        corrupt.replies = [(4, SoakPayload.make(5))]
        #expect(DeliveryCheck.verify(corrupt).corrupt == 3)
    }

    @Test("the same seed gives the same cycles; roles alternate per transport")
    func plansAreReproducible() {
        let options = SoakOptions(transports: ["a", "b"], seed: 42)
        let plans = (1...8).map { SoakCyclePlan.make(index: $0, options: options) }
        let again = (1...8).map { SoakCyclePlan.make(index: $0, options: options) }
        #expect(plans.map(\.kill) == again.map(\.kill))
        #expect(plans.map(\.seed) == again.map(\.seed))
        #expect(plans.map(\.transport) == ["a", "b", "a", "b", "a", "b", "a", "b"])
        #expect(plans.map(\.role) == [.peerServes, .peerServes, .harnessServes, .harnessServes, .peerServes, .peerServes, .harnessServes, .harnessServes])
    }

    @Test("the watchdog gives up on a body that does not finish, and returns one that does")
    func watchdog() async {
        let finished = await runOnThread(within: .seconds(10)) { 7 }
        #expect(finished == 7)
        let release = DispatchSemaphore(value: 0)
        let hung: Int? = await runOnThread(within: .milliseconds(50)) {
            release.wait()
            return 1
        }
        #expect(hung == nil)
        release.signal()
    }

    @Test("a tiny soak of every transport kills peers, and finds no violation and no leak")
    func tinySoak() async throws {
        let group = try TestGroup()
        let output = group.directory.path + "/soak.json"
        let (status, table) = try await PeerProcess.runToCompletion(["soak", "--cycles", "8", "--seed", "7", "--max-messages", "40", "--no-progress", "--output", output])
        #expect(status == 0, "\(table)")
        #expect(table.contains("no violations"))
        let report = try JSONDecoder().decode(SoakReport.self, from: Data(contentsOf: URL(fileURLWithPath: output)))
        #expect(report.schema == SoakReport.schema)
        #expect(report.seed == 7)
        #expect(report.cycles == 8)
        #expect(report.transports.map(\.transport) == TransportCatalog.names)
        for result in report.transports {
            #expect(result.cycles == 2, "\(result.transport)")
            #expect(result.serverKills == 1, "\(result.transport)")
            #expect(result.violations == 0, "\(result.transport)")
            #expect(result.invalidationsSeen == result.invalidationsExpected)
        }
        #expect(report.transports.reduce(0) { $0 + $1.delivery.sent } > 0)
        #expect(!report.resources.isEmpty)
        #expect(report.resources.allSatisfy { !$0.leaked })
        #expect(report.hang == nil)
        #expect(report.passed)
    }

    @Test("soak --help explains the command; bad arguments are refused")
    func help() async throws {
        let (status, output) = try await PeerProcess.runToCompletion(["soak", "--help"])
        #expect(status == 0)
        for option in ["--duration", "--cycles", "--transport", "--seed", "--output", "--cycle-deadline"] {
            #expect(output.contains(option), "soak --help does not mention \(option)")
        }
        #expect(try await PeerProcess.runToCompletion(["soak", "--transport", "carrier-pigeon"]).status == 64)
        #expect(try await PeerProcess.runToCompletion(["soak", "--cycles", "0"]).status == 64)
    }
}
