import Foundation
import IPCCore

/// One kind of resource a soak counts before and after: a non-zero ``delta`` after the run
/// is a leak.
public struct SoakResourceCount: Codable, Sendable, Equatable {
    public var resource: String
    /// `nil` where it could not be counted (``note`` says why).
    public var before: Int?
    public var after: Int?
    /// What is left over, for a leak (descriptor targets, file or queue names, pids); at most 20.
    public var leftovers: [String]
    public var note: String?

    public var delta: Int? {
        guard let before, let after else { return nil }
        return after - before
    }

    public var leaked: Bool { (delta ?? 0) > 0 }
}

/// The resources of the harness process and of the soak's group directory that a transport
/// could leave behind, counted from /proc, /dev/mqueue, /dev/shm and the directory itself.
///
/// Only what belongs to this run is counted (queues and shared-memory objects whose names carry
/// the group's identifier; files in its group directory), so other processes on the machine do
/// not disturb the count.
struct SoakCensus {
    /// Entries of each kind, by resource name (a multiset, as sorted names).
    var entries: [String: [String]?]

    static let descriptors = "descriptors (harness)"
    static let mappings = "mappings of group files (harness)"
    static let queues = "message queues (/dev/mqueue)"
    static let sharedMemory = "shared-memory objects (/dev/shm)"
    static let files = "files in the group directory"
    static let children = "child processes"
    static let zombies = "zombie children"
    static let order = [descriptors, mappings, queues, sharedMemory, files, children, zombies]

    static func take(group: GroupDirectory) -> SoakCensus {
        let identifier = group.identifier
        return SoakCensus(entries: [
            descriptors: openDescriptors(),
            // Mappings of group files (file-presenter journals) and of notify stores (memfds).
            mappings: lines(of: "/proc/self/maps").map { $0.filter { $0.contains(group.path + "/") || $0.contains("/memfd:ipcbench-notify") }.map { String($0.split(separator: " ", omittingEmptySubsequences: true).dropFirst(5).joined(separator: " ")) } },
            queues: mountedDirectory("/dev/mqueue", type: "mqueue").map { $0.filter { $0.hasPrefix("ipcb.") && $0.contains("." + identifier + ".") } },
            sharedMemory: mountedDirectory("/dev/shm", type: nil).map { $0.filter { $0.contains(identifier) || $0.hasPrefix("ipcb") } },
            // The endpoints' lock files stay by design (one per endpoint name: see EndpointLock),
            // and so does the group's notification table.
            files: names(in: group.path).map { $0.filter { !$0.hasSuffix(".lock") && $0 != "notify.center" } },
            children: childProcesses().map { $0.map { "pid \($0.pid) (\($0.state))" } },
            zombies: childProcesses().map { $0.filter { $0.state == "Z" }.map { "pid \($0.pid)" } },
        ])
    }

    /// A census once releases still under way have finished: taken again every 100 ms (for up
    /// to 5 s) until nothing exceeds `baseline`, or, without one, until two in a row agree.
    /// Connections release some resources on their own threads after their handler ran.
    static func settled(group: GroupDirectory, baseline: SoakCensus? = nil) -> SoakCensus {
        var census = take(group: group)
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline {
            if let baseline, !compare(baseline, census).contains(where: \.leaked) { break }
            usleep(100_000)
            let next = take(group: group)
            if baseline == nil, next.counts == census.counts { break }
            census = next
        }
        return census
    }

    private var counts: [String: Int?] { entries.mapValues { $0?.count } }

    /// Before and after, per resource, in a fixed order.
    static func compare(_ before: SoakCensus, _ after: SoakCensus) -> [SoakResourceCount] {
        order.map { resource in
            let old = before.entries[resource] ?? nil
            let new = after.entries[resource] ?? nil
            var leftovers: [String] = []
            if let old, let new {
                var remaining = new
                for entry in old {
                    if let index = remaining.firstIndex(of: entry) { remaining.remove(at: index) }
                }
                leftovers = Array(remaining.prefix(20))
            }
            let note: String? = switch (old, resource) {
            case (nil, queues): "not counted: /dev/mqueue is not mounted (mount -t mqueue none /dev/mqueue)"
            case (nil, _): "not counted: not readable here"
            case (_, files): "lock files (one per endpoint name, kept by design) and notify.center not counted"
            default: nil
            }
            return SoakResourceCount(resource: resource, before: old?.count, after: new?.count, leftovers: leftovers, note: note)
        }
    }

    /// What each open descriptor refers to (`socket:[…]`, `pipe:[…]`, a path), with the
    /// socket, pipe and inode numbers dropped so that a closed-and-reopened kind matches.
    private static func openDescriptors() -> [String]? {
        let directory = "/proc/self/fd"
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return nil }
        return names.compactMap { name in
            // The directory's own descriptor is closed by now and cannot be read.
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: directory + "/" + name) else { return nil }
            guard let open = target.range(of: ":["), target.dropLast().suffix(from: open.upperBound).allSatisfy(\.isNumber) else { return target }
            return String(target[..<open.lowerBound])
        }.sorted()
    }

    private static func names(in directory: String) -> [String]? {
        (try? FileManager.default.contentsOfDirectory(atPath: directory))?.sorted()
    }

    private static func lines(of path: String) -> [String]? {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
        return text.split(separator: "\n").map(String.init)
    }

    /// The names in a directory, if it is a mount point of `type` (any type when `nil`).
    private static func mountedDirectory(_ path: String, type: String?) -> [String]? {
        if let type {
            let mounts = lines(of: "/proc/self/mounts") ?? []
            guard mounts.contains(where: { $0.split(separator: " ").dropFirst().prefix(2) == [Substring(path), Substring(type)] }) else { return nil }
        }
        return names(in: path)
    }

    /// This process's children, from /proc: their pids and states (`Z` for a zombie).
    private static func childProcesses() -> [(pid: Int32, state: String)]? {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return nil }
        let me = getpid()
        return names.compactMap { name -> (Int32, String)? in
            guard let pid = Int32(name), let stat = lines(of: "/proc/\(name)/stat")?.first,
                let close = stat.lastIndex(of: ")")
            else { return nil }
            // After the command name in parentheses: state, ppid.
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            guard fields.count >= 2, Int32(fields[1]) == me else { return nil }
            return (pid, String(fields[0]))
        }.sorted { $0.0 < $1.0 }
    }
}
