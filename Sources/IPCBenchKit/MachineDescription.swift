import Foundation

/// What a run's numbers depend on besides the code: the CPU (vendor, family, model, stepping,
/// clock), the number of CPUs, the kernel and its mitigations. Two runs are comparable in
/// absolute time only on the same machine description; across machines, only as ratios to the
/// native floor measured in the same run.
public struct MachineDescription: Codable, Sendable, Hashable {
    public var vendor: String?
    public var family: Int?
    public var model: Int?
    public var stepping: Int?
    public var modelName: String?
    /// The clock `/proc/cpuinfo` reports for the first CPU (it may vary while running).
    public var megahertz: Double?
    /// The highest clock of the first CPU (`cpufreq/cpuinfo_max_freq`), where the kernel says.
    public var maximumMegahertz: Double?
    /// Whether the CPU flags say the system runs under a hypervisor.
    public var hypervisor: Bool?
    public var cpuCount: Int
    /// `uname`'s system, release and machine.
    public var kernel: String
    /// The kernel's view of each CPU vulnerability (`/sys/devices/system/cpu/vulnerabilities`):
    /// name → its text, such as `Mitigation: Retpolines` or `Not affected`.
    public var mitigations: [String: String]

    /// Reads this machine's description.
    public static func current(cpuCount: Int, kernel: String) -> MachineDescription {
        var description = parse(
            cpuinfo: (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8)) ?? "",
            vulnerabilities: "/sys/devices/system/cpu/vulnerabilities",
            cpuCount: cpuCount, kernel: kernel
        )
        if let text = try? String(contentsOfFile: "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", encoding: .utf8),
            let kilohertz = Double(text.trimmingCharacters(in: .whitespacesAndNewlines)) {
            description.maximumMegahertz = kilohertz / 1000
        }
        return description
    }

    /// Parses the first processor's block of `/proc/cpuinfo` text and reads the files of a
    /// vulnerabilities directory. Whatever is missing or unreadable is left out.
    public static func parse(cpuinfo: String, vulnerabilities directory: String, cpuCount: Int, kernel: String) -> MachineDescription {
        var fields: [String: String] = [:]
        for line in cpuinfo.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.trimmingCharacters(in: .whitespaces).isEmpty, !fields.isEmpty { break }
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2 else { continue }
            let key = parts[0].trimmingCharacters(in: .whitespaces)
            if fields[key] == nil { fields[key] = parts[1].trimmingCharacters(in: .whitespaces) }
        }
        var mitigations: [String: String] = [:]
        for name in ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).sorted() {
            guard let text = try? String(contentsOfFile: directory + "/" + name, encoding: .utf8) else { continue }
            mitigations[name] = String(text.trimmingCharacters(in: .whitespacesAndNewlines).prefix(200))
        }
        return MachineDescription(
            vendor: fields["vendor_id"],
            family: fields["cpu family"].flatMap { Int($0) },
            model: fields["model"].flatMap { Int($0) },
            stepping: fields["stepping"].flatMap { Int($0) },
            modelName: fields["model name"],
            megahertz: fields["cpu MHz"].flatMap { Double($0) },
            maximumMegahertz: nil,
            hypervisor: fields["flags"].map { $0.split(separator: " ").contains("hypervisor") },
            cpuCount: cpuCount,
            kernel: kernel,
            mitigations: mitigations
        )
    }

    /// `AMD EPYC 7B12 (AuthenticAMD family 23 model 49 stepping 0, 2250 MHz, hypervisor) × 2`.
    public var summary: String {
        var details: [String] = []
        let identity = [vendor, family.map { "family \($0)" }, model.map { "model \($0)" }, stepping.map { "stepping \($0)" }].compactMap { $0 }
        if !identity.isEmpty { details.append(identity.joined(separator: " ")) }
        if let clock = maximumMegahertz ?? megahertz { details.append(String(format: "%.0f MHz", clock)) }
        if hypervisor == true { details.append("hypervisor") }
        return (modelName ?? "unknown CPU") + (details.isEmpty ? "" : " (\(details.joined(separator: ", ")))") + " × \(cpuCount)"
    }

    /// The vulnerabilities the kernel mitigates or is exposed to (those not `Not affected`), briefly.
    public var mitigationSummary: String {
        let relevant = mitigations.sorted { $0.key < $1.key }.filter { !$0.value.hasPrefix("Not affected") }
        guard !relevant.isEmpty else { return mitigations.isEmpty ? "unknown" : "none needed (not affected)" }
        return relevant.map { "\($0.key): \($0.value)" }.joined(separator: "; ")
    }

    /// Whether absolute times from the two machines can be compared: the same CPU identity,
    /// CPU count, kernel and mitigations. The current clock is not compared (it moves).
    public func isSameMachine(as other: MachineDescription) -> Bool {
        vendor == other.vendor && family == other.family && model == other.model && stepping == other.stepping
            && modelName == other.modelName && maximumMegahertz == other.maximumMegahertz && cpuCount == other.cpuCount
            && kernel == other.kernel && mitigations == other.mitigations
    }
}
