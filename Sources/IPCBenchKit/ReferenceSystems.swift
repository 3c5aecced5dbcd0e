public import Foundation
import IPCConformance
import IPCCore
import IPCEngine
import IPCSystem
import Synchronization

/// What a user would pick instead of this package's transports — D-Bus, ZeroMQ, gRPC, a plain
/// SwiftNIO socket, iceoryx's shared memory — measured in the same run as the transports, through the programs of
/// `Benchmarks/References/` (a package and C programs of their own, outside this package's
/// dependency graph). Their command-line contract is in `Benchmarks/References/README.md`:
///
///     ref-X serve   --system S --address DIR [--cpu N]          prints "ready", serves until stdin closes
///     ref-X measure --system S --address DIR --server-pid PID --mode latency|throughput
///                   --payload BYTES --warmup N --count N [--cpu N]   prints one JSON line
///
/// A `measure` client times its own round trips (the same monotonic clock) and reads both sides'
/// CPU time and context switches over its timed section; the harness files its samples into the
/// same histograms as a transport's, in the same sweeps.
public struct ReferenceSystem: Sendable, Hashable {
    /// The system's name on the binary's command line: `zmq-reqrep`, `dbus-daemon`, `nio`, ...
    public var system: String
    /// The program that serves and measures it.
    public var executable: URL

    /// The name of its rows in a results file: `ref:<system>`.
    public var resultName: String { ReferenceSystem.prefix + system }

    /// The prefix of reference rows' names.
    public static let prefix = "ref:"

    /// Whether a results row's transport name is a reference system's.
    public static func isReference(_ name: String) -> Bool { name.hasPrefix(prefix) }

    /// The reference programs and the systems each serves, with what each needs.
    public static let catalog: [(binary: String, systems: [String], needs: String)] = [
        ("ref-zmq", ["zmq-reqrep", "zmq-pushpull"], "libzmq (Debian libzmq3-dev)"),
        ("ref-dbus", ["dbus-daemon", "dbus-p2p"], "sd-bus (Debian libsystemd-dev) and dbus-daemon (Debian dbus-daemon)"),
        ("ref-nio", ["nio"], "SwiftNIO (the Swift package in Benchmarks/References/Swift)"),
        ("ref-grpc", ["grpc"], "grpc-swift-2 with its NIO transport (the Swift package in Benchmarks/References/Swift)"),
        ("ref-grpc-cpp", ["grpc-cpp"], "gRPC C++ (Debian libgrpc++-dev) and g++"),
        ("ref-iceoryx", ["iceoryx", "iceoryx-spin"], "iceoryx 2.0's C binding and RouDi (Debian libiceoryx-binding-c-dev and iceoryx)"),
    ]

    /// The catalog's systems whose waits spin (busy-poll, never block): measured in the spinning
    /// phase, and only where the two processes are on different cores
    /// (``Placement/spreadsProcesses``); their rows' wait strategy is ``spinWaitStrategy``.
    static let spinningSystems: Set<String> = ["iceoryx-spin"]

    /// The catalog's systems of which one server at a time can run on a machine: iceoryx 2.0
    /// allows one RouDi per machine, and each `serve` starts its own. The harness starts their
    /// server for each of its turns in a sweep and stops it after (``ReferenceSession/start()``).
    static let oneServerPerMachineSystems: Set<String> = ["iceoryx", "iceoryx-spin"]

    /// The wait strategy of a spinning reference system's rows (transports' spinning rows are
    /// `spin-then-block`: they block after a bounded spin, a spinning reference never does).
    static let spinWaitStrategy = "spin"

    /// Whether the system's waits spin (``spinningSystems``).
    package var spins: Bool { Self.spinningSystems.contains(system) }

    /// Whether only one server of the system can run on the machine at a time.
    var oneServerPerMachine: Bool { Self.oneServerPerMachineSystems.contains(system) }

    /// The reference systems whose program is in `directory`, and a reason for each that is not.
    public static func discover(in directory: URL, only names: [String] = []) -> (systems: [ReferenceSystem], skipped: [SkippedReference]) {
        var systems: [ReferenceSystem] = []
        var skipped: [SkippedReference] = []
        for entry in catalog {
            let executable = directory.appendingPathComponent(entry.binary)
            for system in entry.systems where names.isEmpty || names.contains(system) {
                if FileManager.default.isExecutableFile(atPath: executable.path) {
                    systems.append(ReferenceSystem(system: system, executable: executable))
                } else {
                    skipped.append(SkippedReference(
                        system: system,
                        reason: "\(entry.binary) is not in \(directory.path): it needs \(entry.needs); Benchmarks/References/build.sh says why it was not built"
                    ))
                }
            }
        }
        return (systems, skipped)
    }
}

/// A reference system that a run did not measure, and why: every one is listed in the report.
public struct SkippedReference: Codable, Sendable, Hashable {
    public var system: String
    public var reason: String
    /// The mode and payload it could not measure, when only some could not (`nil`: none).
    public var mode: String? = nil
    public var payloadBytes: Int? = nil

    public init(system: String, reason: String, mode: String? = nil, payloadBytes: Int? = nil) {
        self.system = system
        self.reason = reason
        self.mode = mode
        self.payloadBytes = payloadBytes
    }
}

/// A reference system's `measure` could not carry a payload (its exit status 4): not an error of
/// the run, a fact about the system, reported as a skipped measurement.
struct ReferenceUnsupported: Error {
    var reason: String
}

/// One `measure` run's output line.
struct ReferenceMeasurement: Decodable {
    var mode: String
    var samplesNs: [UInt64]?
    var messages: Int?
    var elapsedNs: UInt64?
    var clientCPUNs: UInt64
    var serverCPUNs: UInt64
    var clientVoluntarySwitches: UInt64
    var clientInvoluntarySwitches: UInt64
    var serverVoluntarySwitches: UInt64
    var serverInvoluntarySwitches: UInt64

    /// Both sides' CPU time and context switches over the timed section, as two readings.
    var usage: (before: CPUReading, after: CPUReading) {
        (
            CPUReading(local: 0, peer: 0, localSwitches: 0, peerSwitches: 0),
            CPUReading(
                local: clientCPUNs, peer: serverCPUNs,
                localSwitches: clientVoluntarySwitches + clientInvoluntarySwitches,
                peerSwitches: serverVoluntarySwitches + serverInvoluntarySwitches
            )
        )
    }
}

/// A reference system's server, started for one placement, and its `measure` runs.
final class ReferenceSession: Sendable {
    let reference: ReferenceSystem
    private let placement: Placement
    private let address: URL
    private let clientCPU: Int?
    /// The running `serve`: its process and the pipe whose closing stops it (`nil`: stopped).
    private let server = Mutex<(process: Process, input: Pipe)?>(nil)

    /// The running server's pid (`nil` while it is stopped).
    var pid: Int32? { server.withLock { $0?.process.processIdentifier } }

    /// A session whose `serve` runs in a directory of its own under `group`; started at once
    /// unless `startNow` is false (then ``start()`` starts it).
    /// - Throws: what ``start()`` throws.
    init(_ reference: ReferenceSystem, placement: Placement, group: URL, instance: String = "", startNow: Bool = true) throws {
        self.reference = reference
        self.placement = placement
        address = group.appendingPathComponent("ref-\(reference.system)-\(placement.rawValue)\(instance)")
        clientCPU = placement.cpus?.local
        if startNow { try start() }
    }

    /// Starts `serve` (if it is not running) and waits for its `ready`.
    /// - Throws: ``IPCError/Code/transportFailure`` if it exits or says nothing within 30 s,
    ///   with what it wrote on standard error.
    func start() throws {
        guard pid == nil else { return }
        try FileManager.default.createDirectory(at: address, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        var arguments = ["serve", "--system", reference.system, "--address", address.path]
        if let cpu = placement.cpus?.peer { arguments += ["--cpu", String(cpu)] }
        let process = Process()
        process.executableURL = reference.executable
        process.arguments = arguments
        let input = Pipe()
        let output = Pipe()
        let errors = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = errors
        do {
            try process.run()
        } catch {
            try? FileManager.default.removeItem(at: address)
            throw error
        }
        // Standard error is drained for as long as the server lives (a daemon's log goes there,
        // and a full pipe would stall it); its first 16 KiB are kept for a failure's message.
        let said = Mutex<Data>(Data())
        Thread.detachNewThread {
            while let chunk = try? errors.fileHandleForReading.read(upToCount: 4096), !chunk.isEmpty {
                said.withLock { if $0.count < 16_384 { $0.append(chunk.prefix(16_384 - $0.count)) } }
            }
        }
        // "ready" on standard output, read on a thread of its own so that a silent server times out.
        let line = Mutex<String?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            var bytes: [UInt8] = []
            while let byte = try? output.fileHandleForReading.read(upToCount: 1), let first = byte.first, first != UInt8(ascii: "\n") {
                bytes.append(first)
            }
            line.withLock { $0 = String(decoding: bytes, as: UTF8.self) }
            done.signal()
        }
        guard done.wait(timeout: .now() + 30) == .success, line.withLock({ $0 }) == "ready" else {
            // SIGTERM, then as stop() does: standard input closed, a bounded wait, SIGKILL.
            process.terminate()
            end(process, input: input)
            let detail = String(decoding: said.withLock { $0 }, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            throw IPCError(
                code: .transportFailure,
                message: "\(reference.executable.lastPathComponent) serve --system \(reference.system) did not say ready within 30 s" + (detail.isEmpty ? "" : ": \(detail)")
            )
        }
        server.withLock { $0 = (process, input) }
    }

    /// Runs `measure` to completion and reads its line.
    /// - Throws: ``ReferenceUnsupported`` if the system cannot carry the payload (exit status 4);
    ///   ``IPCError/Code/malformedPayload`` if the echo was wrong (exit status 3, which a
    ///   reference's byte-for-byte check gives) or the output is not a measurement;
    ///   ``IPCError/Code/transportFailure`` for any other failure.
    func measure(mode: String, payload: Int, warmup: Int, count: Int) async throws -> ReferenceMeasurement {
        guard let pid else {
            throw IPCError(code: .transportFailure, message: "ref:\(reference.system) \(mode) of \(payload) B: its server is not running")
        }
        var arguments = [
            "measure", "--system", reference.system, "--address", address.path, "--server-pid", String(pid),
            "--mode", mode, "--payload", String(payload), "--warmup", String(warmup), "--count", String(count),
        ]
        if let clientCPU { arguments += ["--cpu", String(clientCPU)] }
        let executable = reference.executable
        let system = reference.system
        let (status, output, errors) = try await runBlocking { [arguments] in
            let process = Process()
            process.executableURL = executable
            process.arguments = arguments
            let output = Pipe()
            let errors = Pipe()
            process.standardOutput = output
            process.standardError = errors
            process.standardInput = FileHandle.nullDevice
            try process.run()
            // Standard error on a thread of its own, so that neither pipe can fill and stall the client.
            let errorText = Mutex<Data>(Data())
            let errorsRead = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                let data = errors.fileHandleForReading.readDataToEndOfFile()
                errorText.withLock { $0 = data }
                errorsRead.signal()
            }
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            errorsRead.wait()
            return (process.terminationStatus, data, String(decoding: errorText.withLock { $0 }, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
        }
        let what = "ref:\(system) \(mode) of \(payload) B"
        switch status {
        case 0:
            break
        case 4:
            throw ReferenceUnsupported(reason: errors.isEmpty ? "the system cannot carry it" : errors)
        case 3:
            throw IPCError(code: .malformedPayload, message: "\(what): the reference's own check failed: \(errors)")
        default:
            throw IPCError(code: .transportFailure, message: "\(what): measure exited with status \(status): \(errors)")
        }
        let measurement: ReferenceMeasurement
        do {
            measurement = try JSONDecoder().decode(ReferenceMeasurement.self, from: output)
        } catch {
            throw IPCError(code: .malformedPayload, message: "\(what): measure printed no measurement (\(error)): \(String(decoding: output.prefix(200), as: UTF8.self))")
        }
        let shapeIsRight = mode == "latency"
            ? measurement.samplesNs?.count == count && measurement.samplesNs?.allSatisfy({ $0 > 0 }) == true
            : measurement.messages == count && (measurement.elapsedNs ?? 0) > 0
        guard measurement.mode == mode, shapeIsRight else {
            throw IPCError(code: .malformedPayload, message: "\(what): the measurement does not have \(count) positive samples")
        }
        return measurement
    }

    /// What a reference client did when its server was killed under it.
    struct PeerDeath {
        /// From `kill(2)` returning to the client's exit (the end of its standard error).
        var nanoseconds: UInt64
        /// Whether the client noticed (exit status 3 before its own no-progress deadline).
        var detected: Bool
        /// The client's error line.
        var said: String
    }

    /// The client's own deadline: a wait that makes no progress for this long fails.
    static let clientDeadline: Duration = .seconds(10)

    /// Starts a long latency `measure` (64 B round trips), SIGKILLs this server once the client
    /// is in its loop — `settle` after its start, and once the server has made 20 context
    /// switches more than before the client started, the sign that it serves round trips — and
    /// times until the client exits. The server is dead afterwards; ``stop()`` still reaps it and
    /// removes its directory. Not for a spinning server, whose switches say nothing.
    /// - Throws: ``IPCError/Code/transportFailure`` if the client ends before the kill, if the
    ///   server shows no sign of serving it within 10 s, or if the client does not end within 5 s
    ///   after its own deadline.
    func killDuringRoundTrips(settle: Duration = .milliseconds(500)) async throws -> PeerDeath {
        guard let pid else { throw IPCError(code: .transportFailure, message: "ref:\(reference.system): its server is not running") }
        var arguments = [
            "measure", "--system", reference.system, "--address", address.path, "--server-pid", String(pid),
            "--mode", "latency", "--payload", "64", "--warmup", "0", "--count", "2000000",
        ]
        if let clientCPU { arguments += ["--cpu", String(clientCPU)] }
        let client = Process()
        client.executableURL = reference.executable
        client.arguments = arguments
        let errors = Pipe()
        client.standardOutput = FileHandle.nullDevice
        client.standardError = errors
        client.standardInput = FileHandle.nullDevice
        let serverPID = pid
        try client.run()
        let system = reference.system
        return try await runBlocking {
            // Standard error ends when the client exits: that moment is the one timed.
            let ended = DispatchSemaphore(value: 0)
            let said = Mutex<(Data, UInt64)>((Data(), 0))
            Thread.detachNewThread {
                let data = errors.fileHandleForReading.readDataToEndOfFile()
                let at = monotonicNanoseconds()
                said.withLock { $0 = (data, at) }
                ended.signal()
            }
            func endedEarly() -> IPCError {
                client.waitUntilExit()
                let text = String(decoding: said.withLock { $0.0 }, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
                return IPCError(code: .transportFailure, message: "ref:\(system): the client ended (status \(client.terminationStatus)) before its server was killed: \(text)")
            }
            if ended.wait(timeout: .now() + .nanoseconds(Int(settle.wholeNanoseconds))) == .success { throw endedEarly() }
            // Counted from after the settling time, so that the client's start and connect, and
            // the server's own timers, are not taken for round trips.
            let switchesBefore = processContextSwitches(pid: serverPID) ?? 0
            let serving = monotonicNanoseconds() &+ 10_000_000_000
            while (processContextSwitches(pid: serverPID) ?? 0) < switchesBefore + 20 {
                guard monotonicNanoseconds() < serving else {
                    kill(client.processIdentifier, SIGKILL)
                    client.waitUntilExit()
                    throw IPCError(code: .transportFailure, message: "ref:\(system): its server showed no sign of serving the client (20 context switches) within 10 s")
                }
                if ended.wait(timeout: .now() + .milliseconds(10)) == .success { throw endedEarly() }
            }
            let killedAt = monotonicNanoseconds()
            kill(serverPID, SIGKILL)
            let limit = Self.clientDeadline + .seconds(5)
            guard ended.wait(timeout: .now() + .nanoseconds(Int(limit.wholeNanoseconds))) == .success else {
                kill(client.processIdentifier, SIGKILL)
                client.waitUntilExit()
                throw IPCError(code: .transportFailure, message: "ref:\(system): the client neither noticed its server's death nor gave up within \(limit)")
            }
            client.waitUntilExit()
            let (data, endedAt) = said.withLock { $0 }
            // The client ended between the last look and the kill: it was not killed under.
            guard endedAt >= killedAt else { throw endedEarly() }
            let elapsed = endedAt - killedAt
            let text = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            guard client.terminationReason == .exit else {
                throw IPCError(code: .transportFailure, message: "ref:\(system): the client died of signal \(client.terminationStatus) \(elapsed / 1_000_000) ms after its server was killed: \(text)")
            }
            // A client that noticed exits 3 with what it saw; one that waited out its own
            // deadline exits 3 too, but only after that deadline.
            let detected = client.terminationStatus == 3 && elapsed < UInt64((Self.clientDeadline - .milliseconds(500)).wholeNanoseconds)
            return PeerDeath(nanoseconds: elapsed, detected: detected, said: text.split(separator: "\n").last.map(String.init) ?? "status \(client.terminationStatus)")
        }
    }

    /// How long ``stop(exitSeenWithin:)`` waits, after SIGKILL, for a server's exit to be seen.
    static let exitSeenBound: Duration = .seconds(30)

    /// Closes the server's standard input (its signal to stop) and waits up to 5 s before
    /// SIGKILL, then up to `exitSeenWithin` (``exitSeenBound``) more for the exit to be seen;
    /// nothing if it is not running.
    ///
    /// Foundation's `Process` sees a child's exit (and reaps it) only once every copy of the
    /// child's end of a socket pair has closed, so a process the server started and that kept a
    /// copy would hold `waitUntilExit()` for as long as it lives. The references pass no
    /// descriptor on (Benchmarks/References/README.md, "Descriptors"); should one ever do, the
    /// run goes on after those 30 s, says so on standard error, and the server is reaped
    /// whenever that copy closes.
    func stop(exitSeenWithin: Duration = exitSeenBound) {
        guard let (process, input) = server.withLock({ running in defer { running = nil }; return running }) else { return }
        end(process, input: input, exitSeenWithin: exitSeenWithin)
    }

    /// Ends a server (``stop(exitSeenWithin:)``) that may already have exited.
    private func end(_ process: Process, input: Pipe, exitSeenWithin: Duration = exitSeenBound) {
        try? input.fileHandleForWriting.close()
        let deadline = Date().addingTimeInterval(5)
        while process.isRunning, Date() < deadline { usleep(10_000) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        let seen = Date().addingTimeInterval(Double(exitSeenWithin.wholeNanoseconds) / 1e9)
        while process.isRunning, Date() < seen { usleep(10_000) }
        if process.isRunning {
            let message = "ipcbench: ref:\(reference.system): serve (pid \(process.processIdentifier)) was stopped, but its exit was not seen within \(exitSeenWithin): a process it started still holds a descriptor it inherited; going on\n"
            FileHandle.standardError.write(Data(message.utf8))
        }
        try? FileManager.default.removeItem(at: address)
    }
}

