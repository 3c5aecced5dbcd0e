import Foundation
@testable import IPCBenchKit
import IPCTestSupport
import Testing
import IPCCore

/// Reference systems as the harness runs them: programs that keep the command-line contract of
/// `Benchmarks/References/README.md`. Stand-ins written here (Python) keep it, or break it in
/// the ways a real one can — a payload it cannot carry, a wrong echo — so the harness's side is
/// tested without building ZeroMQ, D-Bus, SwiftNIO or gRPC clients.
@Suite("Reference systems: measured beside the transports, skipped with a reason")
struct ReferenceSystemTests {
    /// A stand-in program: `serve` says ready and waits for standard input to close; `measure`
    /// prints a measurement whose every round trip took 12,345 ns, unless `behaviour` says to
    /// refuse throughput (exit 4) or to fail its own echo check (exit 3).
    static func standIn(behaviour: String) -> String {
        """
        #!/usr/bin/env python3
        import json, sys
        command, arguments = sys.argv[1], sys.argv[2:]
        options = dict(zip(arguments[0::2], arguments[1::2]))
        if command == "serve":
            assert options["--system"] and options["--address"]
            print("ready", flush=True)
            sys.stdin.read()
            sys.exit(0)
        mode, count = options["--mode"], int(options["--count"])
        if "\(behaviour)" == "no-throughput" and mode == "throughput":
            print(options["--system"] + ": has no one-way stream", file=sys.stderr)
            sys.exit(4)
        if "\(behaviour)" == "wrong-echo":
            print(options["--system"] + ": echo 0 differs at byte 3", file=sys.stderr)
            sys.exit(3)
        out = {"mode": mode, "system": options["--system"], "payload": int(options["--payload"]),
               "clientCPUNs": 1000 * count, "serverCPUNs": 3000 * count,
               "clientVoluntarySwitches": count, "clientInvoluntarySwitches": 0,
               "serverVoluntarySwitches": count, "serverInvoluntarySwitches": 0}
        if mode == "latency":
            out["samplesNs"] = [12345] * count
        else:
            out["messages"] = count
            out["elapsedNs"] = 1000 * count
        print(json.dumps(out))
        """
    }

    @Test("a reference that keeps the contract is measured and compared; one that cannot stream, fails its check, or is missing is listed with why")
    func referencesInARun() async throws {
        let group = try TestGroup()
        let bin = group.directory.path + "/bin"
        try FileManager.default.createDirectory(atPath: bin, withIntermediateDirectories: true)
        for (program, behaviour) in [("ref-nio", "good"), ("ref-zmq", "no-throughput"), ("ref-dbus", "wrong-echo")] {
            let path = bin + "/" + program
            try Data(Self.standIn(behaviour: behaviour).utf8).write(to: URL(fileURLWithPath: path))
            try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: path)
        }
        let output = group.directory.path + "/out"
        let (status, table) = try await PeerProcess.runToCompletion([
            "run", "--transport", "unix-socket", "--framing", "binary", "--placement", "same-core", "--sizes", "64",
            "--sample-scale", "0.01", "--skip-floor", "--skip-in-process", "--skip-scale", "--skip-invalidation", "--skip-global-executor",
            "--spin-microseconds", "0", "--references", bin, "--no-progress", "--output", output,
        ])
        #expect(status == 0)
        let results = try ResultStore.read(output + "/results.json")

        // Measured: the stand-in's 12,345 ns round trips, in the transports' histograms, with
        // its CPU time (4 µs a round trip) and switches (2), marked as a reference.
        let nio = try #require(results.latency.first { $0.transport == "ref:nio" })
        #expect(nio.reference == true && nio.samples > 0 && nio.repetitionMedians.count == LatencyResult.repetitions)
        #expect(abs(Double(nio.p50) - 12_345) < 20)
        #expect(nio.localCPUPerRoundTrip == 1000 && nio.peerCPUPerRoundTrip == 3000 && nio.contextSwitchesPerRoundTrip == 2)
        let nioStream = try #require(results.throughput?.first { $0.transport == "ref:nio" })
        #expect(nioStream.reference == true && abs(nioStream.messagesPerSecond - 1e6) < 1)

        // ZeroMQ: latency measured for both systems, throughput skipped with the program's reason.
        #expect(Set(results.latency.filter { $0.transport.hasPrefix("ref:zmq") }.map(\.transport)) == ["ref:zmq-reqrep", "ref:zmq-pushpull"])
        #expect(results.throughput?.contains { $0.transport.hasPrefix("ref:zmq") } == false)
        let skipped = results.skippedReferences ?? []
        #expect(skipped.contains { $0.system == "zmq-reqrep" && $0.mode == "throughput" && $0.payloadBytes == 64 && $0.reason.contains("has no one-way stream") })

        // D-Bus failed its own check: no figures at all, and the failure says why.
        #expect(!results.latency.contains { $0.transport.hasPrefix("ref:dbus") })
        #expect(skipped.contains { $0.system == "dbus-daemon" && $0.reason.contains("FAILED") && $0.reason.contains("echo 0 differs") })
        // gRPC's program is not there.
        #expect(skipped.contains { $0.system == "grpc" && $0.reason.contains("ref-grpc is not in") })

        // Our transport's rows are unmarked, and the report answers the question.
        #expect(results.latency.filter { $0.transport == "unix-socket" }.allSatisfy { $0.reference == nil })
        let report = try String(contentsOfFile: output + "/report.md", encoding: .utf8)
        #expect(report.contains("## Which should I use"))
        #expect(report.contains("| ref:nio |"))
        #expect(report.contains("skipped ref:dbus-p2p"))
        #expect(table.contains("skipped ref:grpc"))
    }

    @Test("the choice section names who wins each figure and by what factor")
    func verdicts() throws {
        let results = ReportFixtures.results(scale: 1, references: true)
        let sections = ChoiceReport.sections(results)
        #expect(sections.map(\.placement) == [.sameCore, .splitCores])
        let sameCore = try #require(sections.first)
        #expect(sameCore.candidates.map(\.label) == ["unix-socket (binary)", "notify", "ref:nio"])
        let verdicts = sameCore.verdicts()
        // ref:nio's round trips are 0.75 × ours (fixtures): it wins p50 at 64 B by 1.33×.
        #expect(verdicts.contains("p50 64 B: ref:nio beats every transport here (30 µs against 40 µs for unix-socket (binary)), 1.33×"))
        // Its 64 B stream is half ours: ours wins by 2×.
        #expect(verdicts.contains { $0.hasPrefix("64 B messages/s: unix-socket (binary) beats the best reference system") && $0.hasSuffix("2.00×") })
        let markdown = ChoiceReport.markdown(results)
        #expect(markdown.contains("### same-core") && markdown.contains("### split-cores"))
        #expect(markdown.contains("- skipped ref:grpc: its program is missing"))
        // Without any reference row or skipped reference, there is no section at all.
        #expect(ChoiceReport.markdown(ReportFixtures.results(scale: 1)).isEmpty)
    }
}
