import Foundation
@testable import IPCBenchKit
import IPCConformance
import IPCFraming
import IPCSystem
import IPCTestSupport
import Testing
import IPCCore
import MessagePortTransport
import NotifyTransport
import FilePresenterTransport

/// The command-line tool, tested through its output and exit status.
@Suite("ipcbench command line")
struct CommandLineTests {
    @Test("--help names every subcommand")
    func help() async throws {
        let (status, output) = try await PeerProcess.runToCompletion(["--help"])
        #expect(status == 0)
        for subcommand in ["run", "compare", "report", "notifyutil", "peer"] {
            #expect(output.contains(subcommand), "--help does not mention \(subcommand)")
        }
    }

    @Test("bad arguments are refused with a usage error", arguments: [
        ["run", "--sizes", "64,abc"], ["run", "--transport", "carrier-pigeon"], ["run", "--sample-scale", "0"],
        ["compare", "/nonexistent/a.json"], ["notifyutil", "--group", "/tmp", "--set", "novalue"],
    ])
    func usageErrors(arguments: [String]) async throws {
        let (status, _) = try await PeerProcess.runToCompletion(arguments)
        #expect(status == 64)
    }

    @Test("peer --refuse-clients refuses every client, which is told accessDenied", .usesMessageQueues, arguments: TransportCatalog.names)
    func peerRefusesClients(transportName: String) async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("refusing")
        let peer = try PeerProcess(arguments: [
            "peer", "--transport", transportName, "--group", group.directory.path, "--endpoint", endpoint.name, "--refuse-clients",
        ])
        defer { peer.stop() }
        let transport = try Self.patientTransport(named: transportName)
        // A stream socket's connect completes before the listener decides: then the first
        // request is told (conformance case 5.10).
        do {
            let connection = try await transport.connect(to: endpoint, options: .defaults)
            defer { connection.invalidate() }
            let error = await #expect(throws: IPCError.self) {
                try await connection.request([1], msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(60))
            }
            #expect(error?.code == .accessDenied)
        } catch let error as IPCError {
            #expect(error.code == .accessDenied)
        }
        #expect(peer.isRunning, "the refusing peer ended")
    }

    @Test("peer --maximum-connections 1 serves one client, turns the next away with endpointNotFound, and admits a client again once the first has gone", .usesMessageQueues, arguments: TransportCatalog.names)
    func peerKeepsAtMostItsMaximum(transportName: String) async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("full")
        let peer = try PeerProcess(arguments: [
            "peer", "--transport", transportName, "--group", group.directory.path, "--endpoint", endpoint.name, "--maximum-connections", "1",
        ])
        defer { peer.stop() }
        let transport = try Self.patientTransport(named: transportName)
        func echo(_ connection: any MessageConnection, _ byte: UInt8) async throws -> [UInt8] {
            try await connection.request([byte], msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(60))
        }
        let first = try await transport.connect(to: endpoint, options: .defaults)
        #expect(try await echo(first, 1) == [1])
        // A stream socket's connect completes before the listener decides: then the first
        // request is told.
        do {
            let second = try await transport.connect(to: endpoint, options: .defaults)
            defer { second.invalidate() }
            let error = await #expect(throws: IPCError.self) { try await echo(second, 2) }
            #expect(error?.code == .endpointNotFound, "\(String(describing: error))")
        } catch let error as IPCError {
            #expect(error.code == .endpointNotFound, "\(error)")
        }
        #expect(try await echo(first, 3) == [3], "the kept client was not served after another was turned away")
        first.invalidate()
        // The listener sees the first client go in its own time: try again until it has room.
        let deadline = ContinuousClock.now + .seconds(30)
        var admitted: (any MessageConnection)?
        while admitted == nil, ContinuousClock.now < deadline {
            do {
                let next = try await transport.connect(to: endpoint, options: .defaults)
                if (try? await echo(next, 4)) == [4] { admitted = next } else { next.invalidate() }
            } catch let error as IPCError where error.code == .endpointNotFound {}
            if admitted == nil { try await Task.sleep(for: .milliseconds(50)) }
        }
        #expect(admitted != nil, "no client was admitted within 30 s of the first one's end")
        admitted?.invalidate()
        #expect(peer.isRunning, "the peer ended")
    }

    @Test("a peer server whose standard input closes says goodbye to its clients before it exits: they see peerClosed, not peerDied", .usesMessageQueues, arguments: TransportCatalog.names)
    func peerSaysGoodbye(transportName: String) async throws {
        let transport = try Self.patientTransport(named: transportName)
        // Three rounds: the goodbye raced the process's exit, which won about half the time.
        for round in 0..<3 {
            let group = try TestGroup()
            let endpoint = try group.scopedEndpoint("bye")
            let peer = try PeerProcess(transport: transportName, framing: .binary, endpoint: endpoint, role: .server)
            let connection = try await transport.connect(to: endpoint, options: .defaults)
            defer { connection.invalidate() }
            #expect(try await connection.request([1], msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(60)) == [1])
            let probe = InvalidationProbe()
            probe.attach(to: connection)
            peer.stop()
            #expect(await probe.wait(seconds: 30), "round \(round + 1): the connection was not invalidated")
            #expect(probe.reason?.kind == .peerClosed, "round \(round + 1): \(String(describing: probe.reason))")
        }
    }

    /// The transport called `name`, waiting up to 30 s for a listener's answer rather than the
    /// default 5 s: a peer process started under the whole suite's load on a 2-vCPU machine has
    /// taken longer than 5 s to welcome its first client (a fresh-clone CI run saw it).
    static func patientTransport(named name: String) throws -> any MessageTransport {
        switch name {
        case "message-port": MessagePortTransport(connectTimeout: .seconds(30))
        case "notify": NotifyTransport(connectTimeout: .seconds(30))
        case "file-presenter": FilePresenterTransport(connectTimeout: .seconds(30))
        default: try TransportCatalog.transport(named: name, framing: .binary)
        }
    }

    @Test("peer --refuse-clients and --maximum-connections are for the server role; a maximum of 0 is refused")
    func refuseClientsNeedsServerRole() async throws {
        let (status, _) = try await PeerProcess.runToCompletion(["peer", "--group", "/tmp/g", "--endpoint", "x", "--role", "client", "--refuse-clients"])
        #expect(status == 64)
        for arguments in [["--role", "client", "--maximum-connections", "2"], ["--maximum-connections", "0"]] {
            let (status, _) = try await PeerProcess.runToCompletion(["peer", "--group", "/tmp/g", "--endpoint", "x"] + arguments)
            #expect(status == 64, "\(arguments)")
        }
    }

    @Test("a smoke run writes a result file, a Markdown report and an HTML report")
    func smokeRun() async throws {
        let group = try TestGroup()
        let output = group.directory.path + "/out"
        let (status, table) = try await PeerProcess.runToCompletion([
            "run", "--transport", "unix-socket", "--framing", "binary", "--placement", "same-core",
            "--full", "--sizes", "0,64", "--sample-scale", "0.01", "--skip-in-process", "--skip-scale", "--no-progress", "--output", output,
        ])
        #expect(status == 0)
        #expect(table.contains("unix-socket"))
        let results = try ResultStore.read(output + "/results.json")
        // The transport served by the async handler, from its preferred executor and again from
        // the global executor, then served by the on-loop fast path, then its native floor, its
        // event-driven floors (epoll, and io_uring where the kernel allows it) and that floor with
        // a thread hand-over per request, measured the same way in the same run.
        let uring = FloorMechanism.unixStreamIoUring.isAvailable ? ["floor:unix-stream+io_uring", "floor:unix-stream+io_uring"] : []
        let transports = ["unix-socket", "unix-socket", "unix-socket", "unix-socket", "unix-socket", "unix-socket", "floor:unix-stream", "floor:unix-stream", "floor:unix-stream+epoll", "floor:unix-stream+epoll"] + uring
        let executors: [String?] = ["preferred", "preferred", "global", "global", "preferred", "preferred"] + Array(repeating: nil, count: 4 + uring.count)
        let handlers: [String?] = ["task", "task", "task", "task", "on-loop", "on-loop"] + Array(repeating: nil, count: 4 + uring.count)
        let handOff = ["floor:unix-stream+epoll+handoff", "floor:unix-stream+epoll+handoff"]
        #expect(results.latency.map(\.transport) == transports + handOff)
        #expect(results.latency.map(\.executor) == executors + [nil, nil])
        #expect(results.latency.map(\.handler) == handlers + [nil, nil])
        #expect(results.latency.map(\.payloadBytes) == Array(repeating: [0, 64], count: transports.count / 2 + 1).flatMap { $0 })
        #expect(results.latency.filter(\.onLoopHandler).allSatisfy { $0.name.contains("/on-loop-handler/") && $0.waitDescription == "blocking, on-loop handler" })
        if results.loopStalls != [] {
            // The stall detector times each callback by the wall clock, so a loop thread that
            // the kernel preempted for 100 ms (other suites run meanwhile on two vCPUs: once, in
            // a full run, 147 ms in "a task on the event loop's executor") is reported as one.
            // A stall of the harness's own making happens again; a preemption hardly ever.
            let again = group.directory.path + "/again"
            let (status, _) = try await PeerProcess.runToCompletion([
                "run", "--transport", "unix-socket", "--framing", "binary", "--placement", "same-core",
                "--full", "--sizes", "0,64", "--sample-scale", "0.01", "--skip-in-process", "--skip-scale", "--no-progress", "--output", again,
            ])
            #expect(status == 0)
            let stalls = try ResultStore.read(again + "/results.json").loopStalls
            #expect(stalls == [], "stalls in two runs: \(String(describing: results.loopStalls)), then \(String(describing: stalls))")
        }
        // Served off the loop, the transport's same work includes the hand-over; on the loop, not.
        let transportRow = try #require(results.latency.first { $0.transport == "unix-socket" && $0.payloadBytes == 64 })
        #expect(transportRow.sameWorkFloor(in: results.latency)?.transport == "floor:unix-stream+epoll+handoff")
        // On the loop: the faster of the event-driven floors.
        let onLoopRow = try #require(results.latency.first { $0.transport == "unix-socket" && $0.payloadBytes == 64 && $0.onLoopHandler })
        let eventDriven = results.latency.filter { ["floor:unix-stream+epoll", "floor:unix-stream+io_uring"].contains($0.transport) && $0.payloadBytes == 64 }
        // Compared by p50: two floors with the same p50 are both the fastest.
        let onLoopFloor = try #require(onLoopRow.sameWorkFloor(in: results.latency))
        #expect(eventDriven.contains { $0.transport == onLoopFloor.transport })
        #expect(onLoopFloor.p50 == eventDriven.map(\.p50).min())
        #expect(transportRow.floor(in: results.latency)?.transport == "floor:unix-stream")
        #expect(results.latency.allSatisfy { $0.samples > 0 && $0.repetitionMedians.count == LatencyResult.repetitions })
        #expect(results.invalidation.map(\.transport) == ["unix-socket"])
        #expect(results.inProcess.isEmpty)
        // One-way throughput for the transport sent from both executors, batched, and to the
        // on-loop peer, its floor and its event-driven floor, then the event-driven floor's
        // stream batched as the transport's (its same work; no round trips, so no latency row);
        // with one core, nothing spins. The batched stream (8 messages a send(contentsOf:))
        // comes after the global executor's.
        let throughput = try #require(results.throughput)
        let batchedFloor = ["floor:unix-stream+epoll", "floor:unix-stream+epoll"]
        #expect(throughput.map(\.transport) == ["unix-socket", "unix-socket"] + transports + batchedFloor)
        let streamExecutors: [String?] = Array(executors[..<4]) + ["preferred", "preferred"] + executors[4...] + [nil, nil]
        let streamHandlers: [String?] = Array(handlers[..<4]) + ["task", "task"] + handlers[4...] + [nil, nil]
        let batches: [Int?] = [nil, nil, nil, nil, 8, 8] + Array(repeating: nil, count: transports.count - 4) + [8, 8]
        #expect(throughput.map(\.executor) == streamExecutors)
        #expect(throughput.map(\.handler) == streamHandlers)
        #expect(throughput.map(\.batch) == batches)
        #expect(throughput.filter { $0.batch != nil }.allSatisfy { $0.name.contains("/batched-8/") && $0.waitDescription == "blocking, batched by 8" })
        #expect(throughput.contains { $0.name == "throughput/floor:unix-stream+epoll/same-core/batched-8/64" })
        #expect(Set(throughput.map(\.name)).count == throughput.count)
        #expect(throughput.filter(\.onGlobalExecutor).allSatisfy { $0.name.contains("/global-executor/") && $0.waitDescription == "blocking, global executor" })
        let streamRow = try #require(throughput.first { $0.transport == "unix-socket" && $0.payloadBytes == 64 })
        #expect(streamRow.floor(in: throughput)?.transport == "floor:unix-stream")
        let eventDrivenStreams = throughput.filter { ["floor:unix-stream+epoll", "floor:unix-stream+io_uring"].contains($0.transport) && $0.batch == nil && $0.payloadBytes == 64 }
        let bestEventDriven = try #require(eventDrivenStreams.max { $0.messagesPerSecond < $1.messagesPerSecond })
        #expect(streamRow.sameWorkFloor(in: throughput)?.name == bestEventDriven.name)
        #expect(streamRow.bestEventDrivenFloor(in: throughput)?.name == bestEventDriven.name)
        // The batched row: its same work is the batched floor; the best event-driven stream is
        // the per-message one, as for every row.
        let batchedRow = try #require(throughput.first { $0.transport == "unix-socket" && $0.batch == 8 && $0.payloadBytes == 64 })
        #expect(batchedRow.sameWorkFloor(in: throughput)?.name == "throughput/floor:unix-stream+epoll/same-core/batched-8/64")
        #expect(batchedRow.bestEventDrivenFloor(in: throughput)?.name == bestEventDriven.name)
        #expect(throughput.allSatisfy { $0.messagesPerSecond > 0 && $0.repetitionMessagesPerSecond.count == LatencyResult.repetitions })
        #expect(results.latency.allSatisfy { $0.waitStrategy == "blocking" } && throughput.allSatisfy { $0.waitStrategy == "blocking" })
        // A benchmark entry per latency and throughput row and per repetition of each.
        #expect(results.benchmarks.count == (26 + 2 * uring.count) * (LatencyResult.repetitions + 1))
        #expect(results.benchmarks.filter { $0.name.hasPrefix("throughput/") }.allSatisfy { ($0.itemsPerSecond ?? 0) > 0 })
        #expect(FileManager.default.fileExists(atPath: output + "/report.md"))
        #expect(FileManager.default.fileExists(atPath: output + "/report.html"))
    }

    /// Spinning, the main rows are served off the loop as well: each is divided by its
    /// mechanism's spinning floor with a hand-off (the thread that polls hands each request to a
    /// second one, which echoes it), measured once per placement beside the plain spinning
    /// floor. With `--full` the on-loop handler's rows spin too, and are divided by the plain
    /// spinning floor (nothing is handed over). No timing is asserted.
    @Test("spinning main rows are divided by their spinning hand-off floors, spinning on-loop rows by the plain ones", .usesMessageQueues,
          .enabled(if: CPUAffinity.onlineCount >= 2, "needs two CPUs"))
    func spinningHandOffFloors() async throws {
        let group = try TestGroup()
        let output = group.directory.path + "/out"
        let (status, table) = try await PeerProcess.runToCompletion([
            "run", "--transport", "unix-socket", "--transport", "notify", "--transport", "message-port", "--framing", "binary", "--sizes", "64",
            "--placement", "split-cores", "--sample-scale", "0.01", "--skip-throughput", "--skip-invalidation", "--skip-in-process", "--skip-scale",
            "--full", "--skip-global-executor", "--no-progress", "--spin-microseconds", "50", "--output", output,
        ])
        #expect(status == 0, "\(table)")
        let results = try ResultStore.read(output + "/results.json")
        let expected: [(transport: String, spinning: String, handOff: String)] = [
            ("unix-socket", "floor:unix-stream+spin", "floor:unix-stream+spin+handoff"),
            ("notify", "floor:shm+spin", "floor:shm+spin+handoff"),
            ("message-port", "floor:mqueue+spin", "floor:mqueue+spin+handoff"),
        ]
        let spinning = results.latency.filter(\.spins)
        for (transport, plain, handOff) in expected {
            #expect(FloorMechanism(transport: transport)?.spinningHandOff?.resultName == handOff)
            #expect(spinning.filter { $0.transport == plain }.count == 1, "\(plain)")
            #expect(spinning.filter { $0.transport == handOff }.count == 1, "\(handOff)")
            let main = try #require(spinning.first { $0.transport == transport && !$0.onLoopHandler }, "\(transport) spinning")
            #expect(main.handler == LatencyResult.taskHandler)
            #expect(main.sameWorkFloor(in: results.latency)?.transport == handOff, "\(transport)")
            let onLoop = try #require(spinning.first { $0.transport == transport && $0.onLoopHandler }, "\(transport) spinning, on-loop")
            #expect(onLoop.sameWorkFloor(in: results.latency)?.transport == plain, "\(transport) on-loop")
            // A spinning floor is never a blocking row's.
            #expect(results.latency.filter { !$0.spins && $0.transport == handOff }.isEmpty)
        }
    }

    /// notify, message-port and file-presenter have hand-off floors too: their main rows (served
    /// off the loop) are divided by them, their on-loop rows by the plain event-driven floors (the
    /// journal floor, for file-presenter). With the on-loop rows, message-port's phase of each
    /// placement is two (three mqueue floors beside its own queues would not fit in the user's
    /// RLIMIT_MSGQUEUE), so a run that has them all finishing is the test that they fit. No
    /// timing is asserted.
    @Test("notify's, message-port's and file-presenter's main rows are divided by their hand-off floors, their on-loop rows by the event-driven ones", .usesMessageQueues)
    func handOffFloorsOfNotifyMessagePortAndFilePresenter() async throws {
        let group = try TestGroup()
        let output = group.directory.path + "/out"
        let placements: [Placement] = CPUAffinity.onlineCount >= 2 ? [.sameCore, .splitCores] : [.sameCore]
        let (status, table) = try await PeerProcess.runToCompletion([
            "run", "--transport", "notify", "--transport", "message-port", "--transport", "file-presenter", "--framing", "binary", "--full", "--sizes", "64",
            "--sample-scale", "0.01", "--skip-throughput", "--skip-invalidation", "--skip-in-process", "--skip-scale", "--no-progress",
            "--spin-microseconds", "0", "--output", output,
        ] + placements.flatMap { ["--placement", $0.rawValue] })
        #expect(status == 0, "\(table)")
        let results = try ResultStore.read(output + "/results.json")
        let expected: [(transport: String, handOff: String, eventDriven: [String])] = [
            ("notify", "floor:eventfd+epoll+handoff", ["floor:eventfd+epoll", "floor:eventfd+io_uring"]),
            ("message-port", "floor:mqueue+epoll+handoff", ["floor:mqueue+epoll"]),
            ("file-presenter", "floor:journal+handoff", ["floor:journal"]),
        ]
        for (transport, handOff, eventDriven) in expected {
            #expect(FloorMechanism(transport: transport)?.handOff?.resultName == handOff)
            for placement in placements {
                let rows = results.latency.filter { $0.placement == placement && $0.payloadBytes == 64 }
                #expect(rows.filter { $0.transport == handOff }.count == 1, "\(handOff), \(placement)")
                let main = try #require(rows.first { $0.transport == transport && !$0.onLoopHandler && !$0.onGlobalExecutor }, "\(transport), \(placement)")
                #expect(main.handler == LatencyResult.taskHandler)
                #expect(main.sameWorkFloor(in: results.latency)?.transport == handOff, "\(transport), \(placement)")
                let onLoop = try #require(rows.first { $0.transport == transport && $0.onLoopHandler }, "\(transport) on-loop, \(placement)")
                // Compared by p50: two floors with the same p50 are both the fastest.
                let fastest = rows.filter { eventDriven.contains($0.transport) }.map(\.p50).min()
                let onLoopFloor = onLoop.sameWorkFloor(in: results.latency)
                #expect(onLoopFloor.map { eventDriven.contains($0.transport) } == true, "\(transport) on-loop, \(placement)")
                #expect(fastest != nil && onLoopFloor?.p50 == fastest, "\(transport) on-loop, \(placement)")
            }
        }
    }

    @Test("the default run is the lean one: no global-executor or on-loop-handler rows, no scale, payloads from 64 B; --help says what --full adds")
    func defaultRunIsLean() async throws {
        let group = try TestGroup()
        let output = group.directory.path + "/out"
        let (status, _) = try await PeerProcess.runToCompletion([
            "run", "--transport", "unix-socket", "--framing", "binary", "--placement", "same-core", "--sample-scale", "0.01",
            "--skip-floor", "--skip-invalidation", "--skip-in-process", "--no-progress", "--output", output,
        ])
        #expect(status == 0)
        let results = try ResultStore.read(output + "/results.json")
        #expect(results.latency.map(\.payloadBytes) == [64, 4096, 65536, 1 << 20])
        #expect(results.latency.allSatisfy { !$0.onGlobalExecutor && !$0.onLoopHandler })
        #expect(results.throughput?.allSatisfy { !$0.onGlobalExecutor && !$0.onLoopHandler } == true)
        #expect(results.scale?.isEmpty ?? true)
        let (_, help) = try await PeerProcess.runToCompletion(["run", "--help"])
        let words = help.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        #expect(words.contains("--full") && words.contains("under 2 minutes"))
    }

    @Test("a small scale run: one client alone and with 4 others sending, alternating, reported everywhere")
    func scaleRun() async throws {
        let group = try TestGroup()
        let output = group.directory.path + "/out"
        let (status, table) = try await PeerProcess.runToCompletion([
            "run", "--transport", "unix-socket", "--framing", "binary", "--placement", "same-core", "--sizes", "64",
            "--sample-scale", "0.01", "--skip-floor", "--skip-invalidation", "--skip-in-process", "--skip-throughput",
            "--quick", "--full", "--scale-clients", "4", "--scale-rate", "200", "--no-progress", "--output", output,
        ])
        #expect(status == 0)
        #expect(table.contains("p99 with 4 other clients sending"))
        let results = try ResultStore.read(output + "/results.json")
        let scale = try #require(results.scale)
        #expect(scale.count == 1)
        let result = try #require(scale.first)
        #expect(result.clients == 4 && result.payloadBytes == 64 && result.requestsPerSecondPerClient == 200)
        #expect(result.offeredRequestsPerSecond == 800)
        let repetitions = ScalePlan().repetitions
        #expect(result.repetitionAchievedRequestsPerSecond.count == repetitions)
        #expect(result.repetitionAchievedRequestsPerSecond.allSatisfy { $0 > 0 })
        for phase in [result.alone, result.loaded] {
            #expect(phase.repetitionMedians.count == repetitions)
            #expect(phase.samples == repetitions * ScalePlan().quick.samplesPerBlock)
            #expect(phase.p50 > 0 && phase.p50 <= phase.p99)
        }
        #expect(result.p99Ratio > 0)
        #expect(results.benchmarks.contains { $0.runName == result.name + "/alone" })
        #expect(results.benchmarks.contains { $0.runName == result.name + "/loaded" })
        #expect(try String(contentsOfFile: output + "/report.md", encoding: .utf8).contains("## Scale"))
        #expect(try String(contentsOfFile: output + "/report.html", encoding: .utf8).contains("with 4 others"))
    }

    @Test("the load process reports what it served in one line that reads back")
    func loadReportLine() throws {
        let report = try #require(ScaleLoad.Report(output: "READY 12\nSERVED 10 SENT 11 SKIPPED 2 NANOSECONDS 1000000000\n"))
        #expect(report.served == 10 && report.sent == 11 && report.skipped == 2 && report.servedPerSecond == 10)
        #expect(ScaleLoad.Report(output: report.line) == report)
        #expect(ScaleLoad.Report(output: "READY 12\n") == nil)
    }

    @Test("with split cores, spinning transports are measured again spinning; never on one core",
          .enabled(if: CPUAffinity.onlineCount >= 2, "needs two CPUs"))
    func spinThenBlock() async throws {
        let group = try TestGroup()
        let output = group.directory.path + "/out"
        let (status, _) = try await PeerProcess.runToCompletion([
            "run", "--transport", "notify", "--transport", "file-presenter", "--placement", "same-core", "--placement", "split-cores",
            "--full", "--sizes", "64", "--sample-scale", "0.01", "--skip-floor", "--skip-invalidation", "--skip-in-process", "--no-progress", "--output", output,
        ])
        #expect(status == 0)
        let results = try ResultStore.read(output + "/results.json")
        let spinning = results.latency.filter(\.spins)
        // file-presenter cannot poll, and same-core never spins: notify's spinning measurements
        // only, against the main peer and (--full) the on-loop one.
        #expect(spinning.map { "\($0.transport) \($0.placement) \($0.handler ?? "none")" } == ["notify split-cores task", "notify split-cores on-loop"])
        #expect(spinning.first?.name == "latency/notify/split-cores/spin-then-block/64")
        #expect((spinning.first?.localCPUPerRoundTrip ?? 0) > 0)
        #expect(results.throughput?.filter { $0.waitStrategy != "blocking" }.map { "\($0.transport) \($0.handler ?? "none")" } == ["notify task", "notify on-loop"])
        // notify and file-presenter blocking on both placements, each on its connection's
        // executor (notify's loop, the file-presenter client's presenter thread), on the global
        // one, and against a peer serving on its loop (12); notify spinning, against each peer (2).
        #expect(results.latency.count == 14)
        #expect(results.latency.filter { $0.transport == "file-presenter" }.map { "\($0.executor ?? "none") \($0.handler ?? "none")" }.sorted() == [
            "global task", "global task", "preferred on-loop", "preferred on-loop", "preferred task", "preferred task",
        ])
    }

    @Test("compare: a file against itself passes; against a doubling, fails with status 1")
    func compare() async throws {
        let group = try TestGroup()
        let baseline = ReportFixtures.results(scale: 1)
        let slower = ReportFixtures.results(scale: 2)
        try ResultStore.write(baseline, to: group.directory.path + "/a")
        try ResultStore.write(slower, to: group.directory.path + "/b")
        let same = try await PeerProcess.runToCompletion(["compare", group.directory.path + "/a/results.json", group.directory.path + "/a/results.json"])
        #expect(same.status == 0)
        #expect(same.output.contains("no regression"))
        let worse = try await PeerProcess.runToCompletion(["compare", group.directory.path + "/a/results.json", group.directory.path + "/b/results.json"])
        #expect(worse.status == 1)
        #expect(worse.output.contains("regression"))
        let better = try await PeerProcess.runToCompletion(["compare", group.directory.path + "/b/results.json", group.directory.path + "/a/results.json"])
        #expect(better.status == 0)
        #expect(better.output.contains("improvement"))
    }

    @Test("compare takes run directories as well as result files, and says in words what is wrong with a path")
    func compareDirectoriesAndErrors() async throws {
        let group = try TestGroup()
        let base = group.directory.path
        try ResultStore.write(ReportFixtures.results(scale: 1), to: base + "/a")
        try ResultStore.write(ReportFixtures.results(scale: 1), to: base + "/b")
        let directories = try await PeerProcess.runToCompletion(["compare", base + "/a", base + "/b/"])
        #expect(directories.status == 0, "\(directories.output)")
        #expect(directories.output.contains("no regression"))
        try FileManager.default.createDirectory(atPath: base + "/empty", withIntermediateDirectories: true)
        try Data("{\"schema\": 3}".utf8).write(to: URL(fileURLWithPath: base + "/other.json"))
        try Data("not json".utf8).write(to: URL(fileURLWithPath: base + "/text.json"))
        for (path, words) in [
            (base + "/missing", "does not exist"),
            (base + "/empty", "is a directory without a results.json"),
            (base + "/other.json", "is not an ipcbench result file"),
            (base + "/text.json", "it is not JSON"),
        ] {
            // Its standard error, where the error is printed, joins its standard output.
            let process = Process()
            process.executableURL = try PeerProcess.executableURL()
            process.arguments = ["compare", path, base + "/a"]
            let output = try ChildProcess.run(process, output: true, errorToOutput: true).output!
            let text = String(decoding: output.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            let refused = (status: process.terminationStatus, output: text)
            #expect(refused.status != 0 && refused.output.contains(words), "\(path): \(refused.output)")
            #expect(!refused.output.contains("NSCocoaErrorDomain"), "\(path): \(refused.output)")
        }
    }

    @Test("compare across machines says so first and judges ratios to the floor: twice as slow everywhere is no regression; a transport slower than its floor is")
    func compareAcrossMachines() async throws {
        let group = try TestGroup()
        func write(_ results: RunResults, cpu: String, to name: String) throws -> String {
            var results = results
            results.context.machine?.modelName = cpu
            // A transport without a native floor.
            var toy = results.latency[0]
            toy.transport = "toy"
            toy.framing = nil
            results.latency.append(toy)
            try ResultStore.write(results, to: group.directory.path + "/" + name)
            return group.directory.path + "/" + name + "/results.json"
        }
        let fast = try write(ReportFixtures.results(scale: 1), cpu: "Fast CPU", to: "fast")
        // Another machine that runs everything, floors included, twice as slowly.
        let slowMachine = try write(ReportFixtures.results(scale: 2), cpu: "Slow CPU", to: "slow")
        let acrossMachines = try await PeerProcess.runToCompletion(["compare", fast, slowMachine])
        #expect(acrossMachines.output.hasPrefix("different machines:"), "\(acrossMachines.output.prefix(300))")
        #expect(acrossMachines.output.contains("÷ floor"))
        #expect(acrossMachines.status == 0)
        #expect(acrossMachines.output.contains("no regression"))
        #expect(acrossMachines.output.contains("latency/notify/same-core/64 "))
        // A transport without a floor: listed, not judged.
        #expect(acrossMachines.output.contains("latency/toy/same-core/0: no native floor to divide by"))
        // The transport twice as slow while its floor is not: a regression on any machine.
        let slowerCode = try write(ReportFixtures.results(scale: 2, floorScale: 1), cpu: "Slow CPU", to: "slower-code")
        let regressed = try await PeerProcess.runToCompletion(["compare", fast, slowerCode])
        #expect(regressed.status == 1)
        #expect(regressed.output.contains("regression"))
    }

    @Test("result files from before the machine and context switches were recorded still decode, and compare by ratio")
    func olderResultFiles() async throws {
        let group = try TestGroup()
        // A file as the harness wrote it before: no machine, no context switches, no executor.
        try ResultStore.write(ReportFixtures.results(scale: 1), to: group.directory.path + "/new")
        var json = try #require(JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: group.directory.path + "/new/results.json"))) as? [String: Any])
        var context = try #require(json["context"] as? [String: Any])
        context["machine"] = nil
        json["context"] = context
        json["latency"] = try #require(json["latency"] as? [[String: Any]]).map { row in
            row.filter { !["localContextSwitchesPerRoundTrip", "peerContextSwitchesPerRoundTrip", "executor"].contains($0.key) }
        }
        let path = group.directory.path + "/old.json"
        try JSONSerialization.data(withJSONObject: json).write(to: URL(fileURLWithPath: path))
        let old = try ResultStore.read(path)
        #expect(old.context.machine == nil)
        #expect(!old.latency.isEmpty && old.latency.allSatisfy { $0.contextSwitchesPerRoundTrip == nil && $0.executor == nil })
        let (status, output) = try await PeerProcess.runToCompletion(["compare", path, path])
        #expect(output.hasPrefix("machine unknown:"))
        #expect(status == 0)
    }

    @Test("the machine description is parsed from /proc/cpuinfo and the vulnerabilities directory; what is missing is left out")
    func machineDescription() throws {
        let group = try TestGroup()
        let vulnerabilities = group.directory.path + "/vulnerabilities"
        try FileManager.default.createDirectory(atPath: vulnerabilities, withIntermediateDirectories: true)
        try "Mitigation: Retpolines; IBPB: conditional\n".write(toFile: vulnerabilities + "/spectre_v2", atomically: true, encoding: .utf8)
        try "Not affected\n".write(toFile: vulnerabilities + "/meltdown", atomically: true, encoding: .utf8)
        let cpuinfo = """
        processor\t: 0
        vendor_id\t: AuthenticAMD
        cpu family\t: 23
        model\t\t: 49
        model name\t: AMD EPYC 7B12
        stepping\t: 0
        cpu MHz\t\t: 2249.998
        flags\t\t: fpu vme hypervisor lahf_lm

        processor\t: 1
        vendor_id\t: GenuineIntel
        """
        let machine = MachineDescription.parse(cpuinfo: cpuinfo, vulnerabilities: vulnerabilities, cpuCount: 2, kernel: "Linux 6.1.0 x86_64")
        #expect(machine.vendor == "AuthenticAMD" && machine.family == 23 && machine.model == 49 && machine.stepping == 0)
        #expect(machine.hypervisor == true)
        #expect(machine.summary == "AMD EPYC 7B12 (AuthenticAMD family 23 model 49 stepping 0, 2250 MHz, hypervisor) × 2")
        #expect(machine.mitigationSummary == "spectre_v2: Mitigation: Retpolines; IBPB: conditional")
        let empty = MachineDescription.parse(cpuinfo: "", vulnerabilities: group.directory.path + "/none", cpuCount: 1, kernel: "k")
        #expect(empty.vendor == nil && empty.family == nil && empty.mitigations.isEmpty)
        #expect(empty.summary == "unknown CPU × 1")
        #expect(!machine.isSameMachine(as: empty))
        #expect(machine.isSameMachine(as: machine))
    }
}

/// Result files with known numbers, for report and comparison tests.
enum ReportFixtures {
    /// Every time multiplied by `scale` (rates divided), the floors' by `floorScale` (the same
    /// unless given).
    /// With `references`, also a reference system (`ref:nio`, its round trips 0.75 × the
    /// transports', its stream half unix-socket's rate) and a skipped one (`grpc`).
    static func results(scale: Double, floorScale: Double? = nil, references: Bool = false) -> RunResults {
        var latency: [LatencyResult] = []
        for transport in ["unix-socket", "notify", "floor:unix-stream", "floor:futex"] + (references ? ["ref:nio"] : []) {
            for placement in [Placement.sameCore, .splitCores] {
                for (index, size) in [0, 64, 4096, 65536, 1 << 20].enumerated() {
                    let factor = transport.hasPrefix("floor") ? floorScale ?? scale : scale
                    let base = (transport.hasPrefix("floor") ? 10_000.0 : transport.hasPrefix("ref:") ? 15_000.0 : 20_000.0) * Double(index + 1) * (placement == .sameCore ? 1 : 3) * factor
                    let medians = (0..<LatencyResult.repetitions).map { UInt64(base * (1 + Double($0 % 3) * 0.01)) }
                    latency.append(LatencyResult(
                        transport: transport, framing: transport == "unix-socket" ? .binary : nil, placement: placement, payloadBytes: size,
                        warmup: 10, samples: 1000, minimum: UInt64(base * 0.9), p50: UInt64(base), p90: UInt64(base * 1.2),
                        p99: UInt64(base * 2), p999: UInt64(base * 3), maximum: UInt64(base * 5), mean: base, standardDeviation: base / 10,
                        repetitionMedians: medians, localCPUPerRoundTrip: base / 2, peerCPUPerRoundTrip: base / 2,
                        reference: transport.hasPrefix("ref:") ? true : nil
                    ))
                }
            }
        }
        var throughput: [ThroughputResult] = []
        for transport in ["unix-socket", "floor:unix-stream"] + (references ? ["ref:nio"] : []) {
            for placement in [Placement.sameCore, .splitCores] {
                for size in [64, 65536, 1 << 20] {
                    let perSecond = transport.hasPrefix("floor") ? 200_000.0 : transport.hasPrefix("ref:") ? 50_000.0 : 100_000.0
                    let rate = perSecond / Double(max(1, size / 4096)) / (transport.hasPrefix("floor") ? floorScale ?? scale : scale)
                    throughput.append(ThroughputResult(
                        transport: transport, framing: transport == "unix-socket" ? .binary : nil, placement: placement, waitStrategy: "blocking",
                        payloadBytes: size, messagesPerRepetition: 1000, repetitionMessagesPerSecond: (0..<LatencyResult.repetitions).map { rate * (1 + Double($0 % 3) * 0.01) },
                        messagesPerSecond: rate, bytesPerSecond: rate * Double(size), localCPUPerMessage: 1000, peerCPUPerMessage: 1000,
                        reference: transport.hasPrefix("ref:") ? true : nil
                    ))
                }
            }
        }
        let invalidation = [InvalidationResult(transport: "unix-socket", trials: [90_000, 100_000, 110_000]), InvalidationResult(transport: "notify", trials: [300_000, 310_000, 320_000])]
        // The scale measurement: the unix-socket split-cores 64 B figures alone, 1.5 × them loaded.
        let alone = latency.first { $0.transport == "unix-socket" && $0.placement == .splitCores && $0.payloadBytes == 64 }!
        var loaded = alone
        (loaded.p50, loaded.p99) = (alone.p50 * 3 / 2, alone.p99 * 3 / 2)
        let scaleResult = ScaleResult(
            transport: "unix-socket", framing: .binary, placement: .splitCores, loadCPU: 0, clients: 64, payloadBytes: 64,
            requestsPerSecondPerClient: 500, offeredRequestsPerSecond: 32_000, achievedRequestsPerSecond: 31_900,
            repetitionAchievedRequestsPerSecond: [31_900, 31_950, 31_850], skippedSlots: 3, alone: alone, loaded: loaded,
            serverCPUShareLoaded: 0.4, loadCPUShare: 0.2
        )
        return RunResults(
            context: .current(command: "fixture"), latency: latency, throughput: throughput, invalidation: invalidation, scale: [scaleResult],
            skippedReferences: references ? [SkippedReference(system: "grpc", reason: "its program is missing")] : []
        )
    }
}
