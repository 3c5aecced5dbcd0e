import ArgumentParser
import Foundation
import IPCBenchKit
import IPCConformance
import IPCCore
import IPCSystem

struct LoadCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "load",
        abstract: "Run the other clients of a scale measurement (started by ipcbench run).",
        discussion: """
        Opens --clients connections to the Unix socket server at --endpoint (binary framing), \
        prints 'READY <pid>', and has each connection make echo requests at --rate requests per \
        second (at most one outstanding; a slot that passes while a reply is awaited is skipped) \
        until standard input closes. Then prints one line, \
        'SERVED <replies> SENT <requests> SKIPPED <slots> NANOSECONDS <elapsed>', and exits.
        """,
        shouldDisplay: false
    )

    @Option(help: "Group directory (absolute path).")
    var group: String

    @Option(help: "Endpoint name inside the group directory.")
    var endpoint: String

    @Option(help: "Connections to open.")
    var clients: Int = 64

    @Option(help: "Echo requests per second, per connection.")
    var rate: Double = 500

    @Option(help: "Payload bytes per request.")
    var payload: Int = 64

    @Option(help: "Pin this process to one CPU.")
    var cpu: Int?

    func validate() throws {
        guard (1...4096).contains(clients) else { throw ValidationError("--clients takes 1 to 4096") }
        guard rate > 0, rate <= 1_000_000 else { throw ValidationError("--rate takes a positive rate up to 1000000") }
        guard (0...(1 << 20)).contains(payload) else { throw ValidationError("--payload takes 0 to \(1 << 20) bytes") }
    }

    func run() throws {
        if let cpu { try CPUAffinity.pinCurrentProcess(to: [cpu]) }
        let endpoint = try Endpoint(group: GroupDirectory(path: group), name: endpoint)
        let load = ScaleLoad(endpoint: endpoint, clients: clients, requestsPerSecond: rate, payloadBytes: payload)
        let report = try load.run {
            FileHandle.standardOutput.write(Data((ConformancePeer.Announcement(pid: getpid()).line + "\n").utf8))
        }
        FileHandle.standardOutput.write(Data((report.line + "\n").utf8))
    }
}
