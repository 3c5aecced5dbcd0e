import Foundation
import IPCFraming

/// The result file `ipcbench` writes. The schema is versioned: readers check ``schema``.
public struct RunResults: Codable, Sendable {
    public static let currentSchema = "ipcbench.results/1"

    public var schema: String
    public var context: RunContext
    public var latency: [LatencyResult]

    public init(context: RunContext, latency: [LatencyResult]) {
        self.schema = Self.currentSchema
        self.context = context
        self.latency = latency
    }
}

/// How and where a run happened, so that numbers are never quoted without their conditions.
public struct RunContext: Codable, Sendable {
    public var date: String
    public var hostname: String
    public var cpuModel: String
    public var cpuCount: Int
    public var kernel: String
    public var swiftVersion: String
    public var buildConfiguration: String
    public var command: String

    public static func current(command: String) -> RunContext {
        var name = utsname()
        uname(&name)
        let kernel = [name.sysname, name.release, name.machine].map { field in
            withUnsafeBytes(of: field) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        }.joined(separator: " ")
        let cpuinfo = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8)) ?? ""
        let model = cpuinfo.split(separator: "\n").first { $0.hasPrefix("model name") }
            .map { $0.split(separator: ":", maxSplits: 1).last.map { $0.trimmingCharacters(in: .whitespaces) } ?? "" } ?? "unknown"
        #if DEBUG
        let configuration = "debug"
        #else
        let configuration = "release"
        #endif
        return RunContext(
            date: ISO8601DateFormatter().string(from: Date()),
            hostname: ProcessInfo.processInfo.hostName,
            cpuModel: model,
            cpuCount: ProcessInfo.processInfo.activeProcessorCount,
            kernel: kernel,
            swiftVersion: Self.swiftVersion,
            buildConfiguration: configuration,
            command: command
        )
    }

    static var swiftVersion: String {
        #if compiler(>=6.4)
        "6.4 or later"
        #elseif compiler(>=6.3)
        "6.3"
        #elseif compiler(>=6.2)
        "6.2"
        #else
        "6.1 or earlier"
        #endif
    }
}

/// Round-trip latency of one transport, framing, placement and payload size.
/// Times are nanoseconds, read from an HDR histogram with three significant digits.
public struct LatencyResult: Codable, Sendable {
    public var transport: String
    /// The framing, for transports that carry a selectable one; `nil` for the others.
    public var framing: Framing?
    public var placement: Placement
    public var payloadBytes: Int
    public var warmup: Int
    public var samples: Int
    public var minimum: UInt64
    public var p50: UInt64
    public var p90: UInt64
    public var p99: UInt64
    public var p999: UInt64
    public var maximum: UInt64
    public var mean: Double
    public var standardDeviation: Double
}
