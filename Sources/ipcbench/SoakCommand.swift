import ArgumentParser
import Foundation
import IPCBenchKit

struct SoakCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "soak",
        abstract: "Run every transport while peers are killed at random points; check delivery, invalidation and leaks.",
        discussion: """
        Each cycle starts an 'ipcbench peer' process, exchanges sequence-numbered one-way \
        messages (the peer echoes them) and requests (it answers them), and SIGKILLs the peer at \
        a random point: after a random number of messages (sometimes with a request left \
        pending), after a random delay while messages flow, or while a client peer is still \
        connecting. Per transport, cycles alternate between killing a server peer the harness \
        is a client of and killing a client peer the harness serves.

        Checked in every cycle: the connection is invalidated within --invalidation-deadline; a \
        request pending at the kill fails with peerInvalidated; every acknowledged message (its \
        echo or reply came back) was delivered exactly once and in order: no duplicate, no \
        echo out of order, no message sent before an acknowledged one missing, no corrupt \
        payload. Messages in flight at the kill may be lost. Checked after the run (once every \
        endpoint used has been listened on and closed, reclaiming what killed servers left): \
        the harness's descriptors, its mappings of group files, message queues in /dev/mqueue, \
        objects in /dev/shm, files in the group directory, child processes and zombies are as \
        many as before the first kill.

        --cycles counts kill cycles in all, shared among the transports in turn (--cycles 1000 \
        with four transports is 250 each). The run stops at whichever of --cycles and \
        --duration comes first; with neither, --cycles 1000. A cycle still running after \
        --cycle-deadline seconds is reported as a hang (transport, cycle and what it was doing) \
        and ends the run.

        Prints a table per transport and the resource counts; exits 0 if nothing was violated, \
        1 on any violation or leak, 2 if a cycle hung.
        """
    )

    @Option(help: "Stop starting cycles after this many seconds.")
    var duration: Double?

    @Option(help: "Stop after this many kill cycles in all, shared among the transports (default 1000 unless --duration is given).")
    var cycles: Int?

    @Option(name: .customLong("transport"), help: "Transport to soak; repeat for several. Known: \(TransportCatalog.names.joined(separator: ", ")). Default: all.")
    var transports: [String] = []

    @Option(help: "Seed for each cycle's role, kill point and message mix (default: random; the summary prints it).")
    var seed: UInt64?

    @Option(help: "Seconds a cycle may take before the watchdog reports it as hung and ends the run.")
    var cycleDeadline: Double = 60

    @Option(help: "Seconds within which the survivor must report a peer's death.")
    var invalidationDeadline: Double = 10

    @Option(help: "The most messages and requests a cycle sends before its kill.")
    var maxMessages: Int = 200

    @Option(help: "Write the report as JSON to this file.")
    var output: String?

    @Flag(help: "Do not show progress on standard error.")
    var noProgress = false

    func validate() throws {
        for transport in transports where !TransportCatalog.names.contains(transport) {
            throw ValidationError("unknown transport '\(transport)'; known: \(TransportCatalog.names.joined(separator: ", "))")
        }
        if let duration, duration <= 0 { throw ValidationError("--duration must be positive") }
        if let cycles, cycles < 1 { throw ValidationError("--cycles must be at least 1") }
        guard cycleDeadline > 0, invalidationDeadline > 0 else { throw ValidationError("deadlines must be positive") }
        guard maxMessages >= 0 else { throw ValidationError("--max-messages must not be negative") }
    }

    func run() async throws {
        var options = SoakOptions(
            transports: transports.isEmpty ? TransportCatalog.names : transports,
            cycles: cycles ?? (duration == nil ? 1000 : nil),
            duration: duration.map { .milliseconds(Int($0 * 1000)) },
            cycleDeadline: .milliseconds(Int(cycleDeadline * 1000)),
            invalidationDeadline: .milliseconds(Int(invalidationDeadline * 1000)),
            maximumMessages: maxMessages
        )
        if let seed { options.seed = seed }
        let report = try await SoakRunner(options: options, progress: ProgressReporter(enabled: !noProgress)).run()
        print(report.table(), terminator: "")
        if let output {
            try report.json().write(to: URL(fileURLWithPath: output))
        }
        if report.hang != nil { throw ExitCode(2) }
        if !report.passed { throw ExitCode(1) }
    }
}
