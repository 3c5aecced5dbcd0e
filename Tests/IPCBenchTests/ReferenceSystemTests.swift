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

    /// A stand-in whose server echoes bytes on a Unix socket, and whose long `measure` (the
    /// harness's peer-death run asks for 2,000,000 round trips) makes one-byte round trips on it:
    /// `notices` exits 3 at once when the server's end comes; `ignores` then waits out a 10 s
    /// deadline, as a client of a system that reconnects silently would; `ends` finishes before
    /// any kill.
    static func dyingStandIn(behaviour: String) -> String {
        """
        #!/usr/bin/env python3
        import json, os, socket, sys, threading, time
        command, arguments = sys.argv[1], sys.argv[2:]
        options = dict(zip(arguments[0::2], arguments[1::2]))
        path = os.path.join(options["--address"], "s.sock")
        def echo(connection):
            while True:
                data = connection.recv(1)
                if not data:
                    return
                connection.sendall(data)
        def serve(server):
            while True:
                connection, _ = server.accept()
                threading.Thread(target=echo, args=(connection,), daemon=True).start()
        if command == "serve":
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(path)
            server.listen(8)
            print("ready", flush=True)
            threading.Thread(target=serve, args=(server,), daemon=True).start()
            sys.stdin.read()
            os.unlink(path)
            sys.exit(0)
        count = int(options["--count"])
        if count >= 1000000:
            behaviour = "\(behaviour)"
            if behaviour == "ends":
                sys.exit(0)
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(path)
            try:
                while True:
                    client.sendall(b"x")
                    if not client.recv(1):
                        break
            except OSError:
                pass
            if behaviour == "ignores":
                time.sleep(10)
                print(options["--system"] + ": waiting for the echo: no progress for 10 s", file=sys.stderr)
                sys.exit(3)
            print(options["--system"] + ": the server closed the connection", file=sys.stderr)
            sys.exit(3)
        out = {"mode": options["--mode"], "system": options["--system"], "payload": int(options["--payload"]),
               "clientCPUNs": count, "serverCPUNs": count, "clientVoluntarySwitches": count, "clientInvoluntarySwitches": 0,
               "serverVoluntarySwitches": count, "serverInvoluntarySwitches": 0}
        if options["--mode"] == "latency":
            out["samplesNs"] = [12345] * count
        else:
            out["messages"] = count
            out["elapsedNs"] = 1000 * count
        print(json.dumps(out))
        """
    }

    @Test("peer death: each reference's server is killed under a client; who notices is timed, who does not is said, one that ends first is skipped with why")
    func referencePeerDeath() async throws {
        let group = try TestGroup()
        let bin = group.directory.path + "/bin"
        try FileManager.default.createDirectory(atPath: bin, withIntermediateDirectories: true)
        for (program, behaviour) in [("ref-nio", "notices"), ("ref-grpc", "ignores"), ("ref-dbus", "ends")] {
            let path = bin + "/" + program
            try Data(Self.dyingStandIn(behaviour: behaviour).utf8).write(to: URL(fileURLWithPath: path))
            try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: path)
        }
        let output = group.directory.path + "/out"
        let (status, table) = try await PeerProcess.runToCompletion([
            "run", "--transport", "unix-socket", "--framing", "binary", "--placement", "same-core", "--sizes", "64",
            "--sample-scale", "0.01", "--skip-floor", "--skip-in-process", "--skip-scale", "--skip-throughput", "--skip-global-executor",
            "--skip-on-loop-handler", "--spin-microseconds", "0", "--references", bin, "--reference", "nio", "--reference", "grpc",
            "--reference", "dbus-p2p", "--no-progress", "--output", output,
        ])
        #expect(status == 0, "\(table)")
        let results = try ResultStore.read(output + "/results.json")
        let nio = try #require(results.invalidation.first { $0.transport == "ref:nio" })
        #expect(nio.reference == true && nio.noticed && nio.trials.count == 3)
        // Noticed well before the client's own deadline, and said what it saw.
        #expect(nio.maximum < 5_000_000_000)
        #expect(nio.outcome?.contains("the server closed the connection") == true)
        // The one that waits out its deadline is tried once and reported as not detecting.
        let grpc = try #require(results.invalidation.first { $0.transport == "ref:grpc" })
        #expect(grpc.detected == false && grpc.trials.count == 1 && grpc.maximum >= 9_500_000_000)
        #expect(grpc.outcome?.contains("noticed nothing") == true)
        // A client that ended before the kill is no measurement: skipped, with why.
        #expect(!results.invalidation.contains { $0.transport == "ref:dbus-p2p" })
        #expect(results.skippedReferences?.contains { $0.system == "dbus-p2p" && $0.mode == "peer death" && $0.reason.contains("before its server was killed") } == true)
        // The transport's own row is there, and the report answers the use case with both.
        #expect(results.invalidation.contains { $0.transport == "unix-socket" && $0.reference == nil })
        let report = try String(contentsOfFile: output + "/report.md", encoding: .utf8)
        #expect(report.contains("### When a peer dies") && report.contains("ref:grpc: **not detected**"))
        #expect(table.contains("not detected"))
    }

    /// A stand-in whose serve starts a daemon as iceoryx's and D-Bus's serves do (fork, then
    /// exec), but one that keeps every descriptor serve inherited, among them the socket end by
    /// which Foundation's `Process` learns of serve's exit; it writes the daemon's pid to
    /// `daemon.pid` beside its address directory.
    static let serveWithALeakyDaemon = """
        #!/usr/bin/env python3
        import os, sys
        options = dict(zip(sys.argv[2::2], sys.argv[3::2]))
        if sys.argv[1] != "serve":
            sys.exit(4)
        daemon = os.fork()
        if daemon == 0:
            os.execvp("sleep", ["sleep", "600"])
        with open(os.path.join(os.path.dirname(options["--address"].rstrip("/")), "daemon.pid"), "w") as file:
            file.write(str(daemon))
        print("ready", flush=True)
        sys.stdin.read()
        """

    @Test("stopping a server whose daemon kept its descriptors returns after its bound, and leaves the daemon alone")
    func stopDoesNotWaitForADaemon() throws {
        let group = try TestGroup()
        let path = group.directory.path + "/ref-leaky"
        try Data(Self.serveWithALeakyDaemon.utf8).write(to: URL(fileURLWithPath: path))
        try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: path)
        let session = try ReferenceSession(
            ReferenceSystem(system: "leaky", executable: URL(fileURLWithPath: path)), placement: .unpinned,
            group: URL(fileURLWithPath: group.directory.path)
        )
        let daemon = try #require(Int32(try String(contentsOfFile: group.directory.path + "/daemon.pid", encoding: .utf8)))
        defer { kill(daemon, SIGKILL) }
        // serve ends at once when its standard input closes; only the daemon, which lives for
        // 10 minutes, keeps Foundation from seeing it. stop() must not wait for that.
        let stopped = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            session.stop(exitSeenWithin: .seconds(1))
            stopped.signal()
        }
        #expect(stopped.wait(timeout: .now() + 60) == .success, "stop() waited for the daemon serve started")
        #expect(session.pid == nil)
        #expect(kill(daemon, 0) == 0, "the daemon was not left alone")
    }

    @Test("the choice section answers each use case with its winner and its lead, per placement")
    func verdicts() throws {
        let results = ReportFixtures.results(scale: 1, references: true)
        let cases = ChoiceReport.useCases(results)
        // The fixtures have no spinning row, so no spinning case.
        #expect(cases.map(\.title) == ["Lowest latency, blocking waits", "Throughput, small messages", "Throughput, large messages", "CPU per message", "When a peer dies"])
        // ref:nio's round trips are 0.75 × ours (fixtures): it wins p50 at 64 B by 1.33×.
        #expect(cases[0].verdicts() == [
            "same-core: **ref:nio**, 30 µs, 1.33× ahead of the next, unix-socket (binary) (40 µs)",
            "split-cores: **ref:nio**, 90 µs, 1.33× ahead of the next, unix-socket (binary) (120 µs)",
        ])
        // Its 64 B stream is half ours: ours wins by 2×.
        #expect(cases[1].verdicts().first == "same-core: **unix-socket (binary)**, 100 k messages/s, 2.00× ahead of the next, ref:nio (50 k messages/s)")
        #expect(cases[4].verdicts() == ["unpinned: **unix-socket**, 100 µs, 3.10× ahead of the next, notify (310 µs)"])
        let markdown = ChoiceReport.markdown(results)
        #expect(markdown.contains("### Lowest latency, blocking waits") && markdown.contains("### When a peer dies"))
        #expect(markdown.contains("| transport or reference | same-core (µs) | split-cores (µs) |"))
        #expect(markdown.contains("- skipped ref:grpc: its program is missing"))
        // Without any reference, the section still answers among the transports, and says how
        // to add the references.
        let alone = ChoiceReport.markdown(ReportFixtures.results(scale: 1))
        #expect(alone.contains("## Which should I use") && alone.contains("measured no reference system"))
        #expect(!alone.contains("ref:"))
    }

    @Test("skipped payloads of one reason are one line")
    func skippedLines() {
        let skipped = [64, 4096].map { SkippedReference(system: "zmq-reqrep", reason: "lockstep", mode: "throughput", payloadBytes: $0) }
            + [SkippedReference(system: "grpc", reason: "missing")]
        #expect(ReportRenderer.skippedReferenceLines(skipped) == ["skipped ref:zmq-reqrep (throughput of 64 B, 4 KiB): lockstep", "skipped ref:grpc: missing"])
    }
}
