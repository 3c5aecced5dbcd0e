import Foundation

/// Where a tester reaches the notify stores a process maps: the transport's stores are sealed
/// memfds that no process keeps a descriptor of, so the way in is
/// `/proc/<pid>/map_files/<range>` (which root can open; the tests run as root).
public enum NotifyStores {
    /// One mapping of a store: a path to open it by, and the memfd's inode, which is the same
    /// in every process that maps it.
    public struct Mapping: Sendable {
        public let path: String
        public let inode: UInt64
    }

    /// The mappings in process `pid` of stores whose memfd is named `label`
    /// (``NotifyTransport/storeLabel``; the name is the connecting client's), in address order.
    /// Tests that run beside others give their transports a label of their own (``uniqueLabel()``).
    public static func mappings(of pid: Int32, label: String = "ipcbench-notify") -> [Mapping] {
        lines(of: pid).compactMap { fields in
            guard fields.count >= 6, fields[5] == "/memfd:\(label)", let inode = UInt64(fields[4]) else { return nil }
            return Mapping(path: "/proc/\(pid)/map_files/\(fields[0])", inode: inode)
        }
    }

    /// The paths of ``mappings(of:label:)``.
    public static func paths(of pid: Int32, label: String = "ipcbench-notify") -> [String] {
        mappings(of: pid, label: label).map(\.path)
    }

    /// Whether process `pid` still maps the memfd with this inode.
    public static func maps(_ pid: Int32, inode: UInt64) -> Bool {
        lines(of: pid).contains { fields in
            fields.count >= 6 && fields[5].hasPrefix("/memfd:") && UInt64(fields[4]) == inode
        }
    }

    /// A store label no other test uses.
    public static func uniqueLabel() -> String {
        "ipcbench-test-" + UUID().uuidString
    }

    /// `/proc/<pid>/maps`, each line split into its fields. Read to the end with `read(2)`: the
    /// file reports a size of 0, and a process with many threads has many pages of mappings.
    private static func lines(of pid: Int32) -> [[Substring]] {
        let fd = open("/proc/\(pid)/maps", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return [] }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count <= 0 { break }
            bytes += chunk.prefix(count)
        }
        return String(decoding: bytes, as: UTF8.self).split(separator: "\n").map { $0.split(separator: " ", omittingEmptySubsequences: true) }
    }
}
