import ArgumentParser

@main
struct IPCBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ipcbench",
        abstract: "Benchmark and conformance suite for inter-process messaging transports.",
        discussion: """
        With no subcommand, runs the default benchmark: round-trip latency of every transport and \
        framing against a peer process, on one core and split across cores, for payloads from 64 B \
        to 1 MiB (0 B too with --full), with the native floors and one-way throughput. It prints a table and writes results.json and report.md under Reports/runs/.
        """,
        subcommands: [RunCommand.self, ConformCommand.self, PeerCommand.self, FloorCommand.self, FloorPeerCommand.self, NotifyUtilCommand.self, WormholeCommand.self, ReportCommand.self, CompareCommand.self, SoakCommand.self, HostileCommand.self, LoadCommand.self, CleanCommand.self],
        defaultSubcommand: RunCommand.self
    )
}
