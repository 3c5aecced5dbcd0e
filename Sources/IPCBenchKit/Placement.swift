/// Where the two processes of a measurement run. Placement dominates latency on a small VM
/// (waking a sleeping peer on another core costs more than the kernel's own work), so every
/// figure names its placement.
public enum Placement: String, Sendable, Hashable, Codable, CaseIterable, CustomStringConvertible {
    /// Both processes pinned to CPU 0.
    case sameCore = "same-core"
    /// The measuring process on CPU 0, the peer on CPU 1.
    case splitCores = "split-cores"
    /// No pinning: the scheduler decides, and results move between the other two.
    case unpinned

    public var description: String { rawValue }

    /// The CPU for the measuring process and for the peer, or `nil` for no pinning.
    public var cpus: (local: Int, peer: Int)? {
        switch self {
        case .sameCore: (0, 0)
        case .splitCores: (0, 1)
        case .unpinned: nil
        }
    }

    /// Whether the two processes are kept on different cores: the only placement where a
    /// spinning wait can pay (with one core, a spinner delays the peer it waits for).
    public var spreadsProcesses: Bool { self == .splitCores }

    /// CPUs this placement needs.
    public var requiredCPUCount: Int { self == .splitCores ? 2 : 1 }
}
