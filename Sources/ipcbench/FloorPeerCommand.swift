public import ArgumentParser
import IPCBenchKit
import IPCCore
import IPCSystem

struct FloorPeerCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "floor-peer",
        abstract: "Run the peer side of a native-floor measurement (started by ipcbench and its tests).",
        discussion: """
        Creates the responder end of a raw C ping-pong over one kernel mechanism in the group \
        directory, prints 'READY <pid>', and echoes every request until the initiator says \
        goodbye or standard input closes.
        """,
        shouldDisplay: false
    )

    @Option(help: "Kernel mechanism: \(FloorMechanism.allCases.map(\.rawValue).joined(separator: ", ")).")
    var mechanism: FloorMechanism

    @Option(help: "Group directory (absolute path) where the two ends meet.")
    var group: String

    @Option(help: "Pin this process to one CPU.")
    var cpu: Int?

    @Option(help: "The largest payload in bytes; the initiator must open the channel with the same value.")
    var maxPayload: Int = NativeFloor.defaultMaximumPayload

    func validate() throws {
        guard (0..<Int(UInt32.max)).contains(maxPayload) else {
            throw ValidationError("--max-payload must be from 0 to \(UInt32.max - 1), got \(maxPayload)")
        }
    }

    func run() throws {
        if let cpu { try CPUAffinity.pinCurrentProcess(to: [cpu]) }
        try FloorPeerService(mechanism: mechanism, group: GroupDirectory(path: group), maximumPayload: maxPayload).run()
    }
}

extension FloorMechanism: ExpressibleByArgument {}
