// The command-line contract of ../README.md for the Swift references, as a thin layer over
// CRefShims, which implements it once (in ../C/ref_common.h) for the C references as well.
import CRefShims

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Exit statuses of the contract.
public enum ExitStatus {
    public static let usage: Int32 = 2
    public static let failure: Int32 = 3
    public static let unsupported: Int32 = 4
}

/// The parsed command line (already checked, and the process already pinned to `--cpu`).
public struct Arguments: Sendable {
    public enum Command: Sendable { case serve, measure }
    public enum Mode: Sendable { case latency, throughput }

    public var command: Command
    public var system: String
    public var address: String
    public var cpu: Int?
    public var serverPID: Int32
    public var mode: Mode
    public var payload: Int
    public var warmup: Int
    public var count: Int
    /// Self-test only: `serve --corrupt` echoes a wrong byte, `measure --corrupt` sends one.
    public var corrupt: Bool

    /// Parses `CommandLine.arguments` for a program serving `systems`; exits 2 on bad arguments,
    /// and pins the process to `--cpu`. Call first, so that every thread started later inherits it.
    public static func parse(systems: [String]) -> Arguments {
        let names = systems.map { strdup($0) }
        var table: [UnsafePointer<CChar>?] = names.map { UnsafePointer($0) }
        table.append(nil)
        var cli = ref_cli()
        table.withUnsafeBufferPointer { pointer in
            ref_cli_parse(CommandLine.argc, CommandLine.unsafeArgv, pointer.baseAddress, &cli)
        }
        return Arguments(
            command: cli.command == Int32(REF_CLI_SERVE) ? .serve : .measure,
            system: String(cString: cli.system),
            address: String(cString: cli.address),
            cpu: cli.cpu >= 0 ? Int(cli.cpu) : nil,
            serverPID: cli.server_pid,
            mode: cli.mode == Int32(REF_CLI_LATENCY) ? .latency : .throughput,
            payload: cli.payload,
            warmup: cli.warmup,
            count: cli.count,
            corrupt: cli.corrupt != 0
        )
    }
}

public enum Reference {
    /// One line on stderr and exit with `status` (3: failure, 4: unsupported).
    public static func exit(_ message: String, status: Int32 = ExitStatus.failure) -> Never {
        ref_cli_exit(status, message)
    }

    /// A file inside `--address`, checked to fit a Unix socket address.
    public static func path(_ name: String) -> String {
        let pointer = ref_cli_path(name)!
        defer { free(pointer) }
        return String(cString: pointer)
    }

    /// Fails at once (status 3) when no server socket is at `path`.
    public static func requireSocket(_ path: String) {
        ref_cli_require_socket(path)
    }

    /// CLOCK_MONOTONIC in nanoseconds.
    @inline(__always)
    public static func now() -> UInt64 { ref_cli_now_ns() }

    // MARK: serving

    /// Catches SIGTERM, SIGINT and SIGHUP (with a process-wide handler) for `waitForStop`.
    public static func catchStopSignals() { ref_cli_catch_stop_signals() }
    /// Prints `ready` and a newline, flushed.
    public static func ready() { ref_cli_ready() }
    /// Blocks the calling thread until SIGTERM/SIGINT/SIGHUP or end of standard input.
    public static func waitForStop() { ref_cli_wait_for_stop() }
    /// Ends the process with `status` after `milliseconds`, whatever is still running then.
    public static func exitLater(milliseconds: Int32, status: Int32) { ref_cli_exit_later(milliseconds, status) }

    // MARK: measuring

    /// Fails the process (status 3) after 10 s without `progress()`.
    public static func startWatchdog() { ref_cli_watchdog_start() }
    @inline(__always)
    public static func progress() { ref_cli_progress() }

    public static func startAccounting() { ref_cli_accounting_start() }
    public static func stopAccounting() { ref_cli_accounting_stop() }
    public static func printLatency(samples: [UInt64]) {
        samples.withUnsafeBufferPointer { ref_cli_print_latency($0.baseAddress) }
    }
    public static func printThroughput(elapsedNs: UInt64) { ref_cli_print_throughput(elapsedNs) }

    /// A round trip too fast for the clock still counts as a positive sample.
    @inline(__always)
    public static func sample(from start: UInt64, to end: UInt64) -> UInt64 { end > start ? end - start : 1 }
}

/// The payload pattern: byte i of message k is (i*31 + k*7 + 1) & 0xff.
public struct Pattern: @unchecked Sendable {
    private let handle: UnsafeRawPointer
    public let payload: Int

    public init(payload: Int) {
        self.payload = payload
        self.handle = ref_cli_pattern(payload)
    }

    /// Message k, valid for the life of the process.
    @inline(__always)
    public func message(_ k: Int) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(start: ref_cli_message(self.handle, UInt64(k)), count: self.payload)
    }

    @inline(__always)
    public func check(_ k: Int, _ bytes: UnsafeRawBufferPointer) -> Bool {
        ref_cli_check(self.handle, UInt64(k), bytes.baseAddress, bytes.count) != 0
    }

    public func describeMismatch(_ k: Int, _ bytes: UnsafeRawBufferPointer) -> String {
        var line = [CChar](repeating: 0, count: 200)
        ref_cli_describe(self.handle, UInt64(k), bytes.baseAddress, bytes.count, &line, line.count)
        return line.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }

    /// What `serve --corrupt` sends instead of `bytes`: one byte flipped, or one byte where none was.
    public static func corrupted(_ bytes: UnsafeRawBufferPointer) -> [UInt8] {
        guard bytes.count > 0 else { return [0x5a] }
        var copy = [UInt8](bytes)
        copy[copy.count / 2] ^= 0xff
        return copy
    }
}
