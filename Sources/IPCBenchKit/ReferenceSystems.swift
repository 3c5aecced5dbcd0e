import Foundation
import IPCConformance
import IPCCore
import Synchronization

/// What a user would pick instead of this package's transports — D-Bus, ZeroMQ, gRPC, a plain
/// SwiftNIO socket — measured in the same run as the transports, through the programs of
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
    ]

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
    let pid: Int32
    private let address: URL
    private let clientCPU: Int?
    private let process: Process
    private let input: Pipe

    /// Starts `serve` in a directory of its own under `group` and waits for its `ready`.
    /// - Throws: ``IPCError/Code/transportFailure`` if it exits or says nothing within 30 s,
    ///   with what it wrote on standard error.
    init(_ reference: ReferenceSystem, placement: Placement, group: URL) throws {
        self.reference = reference
        address = group.appendingPathComponent("ref-\(reference.system)-\(placement.rawValue)")
        try FileManager.default.createDirectory(at: address, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        clientCPU = placement.cpus?.local
        var arguments = ["serve", "--system", reference.system, "--address", address.path]
        if let cpu = placement.cpus?.peer { arguments += ["--cpu", String(cpu)] }
        process = Process()
        process.executableURL = reference.executable
        process.arguments = arguments
        input = Pipe()
        let output = Pipe()
        let errors = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        pid = process.processIdentifier
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
            process.terminate()
            let detail = String(decoding: errors.fileHandleForReading.availableData, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            throw IPCError(
                code: .transportFailure,
                message: "\(reference.executable.lastPathComponent) serve --system \(reference.system) did not say ready within 30 s" + (detail.isEmpty ? "" : ": \(detail)")
            )
        }
    }

    /// Runs `measure` to completion and reads its line.
    /// - Throws: ``ReferenceUnsupported`` if the system cannot carry the payload (exit status 4);
    ///   ``IPCError/Code/malformedPayload`` if the echo was wrong (exit status 3, which a
    ///   reference's byte-for-byte check gives) or the output is not a measurement;
    ///   ``IPCError/Code/transportFailure`` for any other failure.
    func measure(mode: String, payload: Int, warmup: Int, count: Int) async throws -> ReferenceMeasurement {
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

    /// Closes the server's standard input (its signal to stop) and waits up to 5 s before SIGKILL.
    func stop() {
        try? input.fileHandleForWriting.close()
        let deadline = Date().addingTimeInterval(5)
        while process.isRunning, Date() < deadline { usleep(10_000) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        try? FileManager.default.removeItem(at: address)
    }
}

