import Foundation

/// The open file descriptors of this process, each with what it refers to (`socket:[123]`,
/// `/dev/mqueue/x`, a file path), from `/proc/self/fd`. Comparing snapshots names the
/// descriptors a connection opened, so a case can check that invalidation closed them; a
/// number that was closed and reused for something else counts as closed.
struct DescriptorSnapshot: Sendable {
    let entries: Set<String>

    /// `nil` where `/proc/self/fd` cannot be read (not Linux).
    static func current() -> DescriptorSnapshot? {
        let directory = "/proc/self/fd"
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return nil }
        var entries = Set<String>()
        for name in names {
            // The directory's own descriptor is gone by now; skip what cannot be read.
            if let target = try? FileManager.default.destinationOfSymbolicLink(atPath: directory + "/" + name) {
                entries.insert(name + " -> " + target)
            }
        }
        return DescriptorSnapshot(entries: entries)
    }

    /// The descriptors open now that were not open in `earlier`.
    func opened(since earlier: DescriptorSnapshot) -> Set<String> {
        entries.subtracting(earlier.entries)
    }

    /// Waits until none of `descriptors` is open; returns those still open after `limit`.
    static func waitUntilClosed(_ descriptors: Set<String>, within limit: Duration) async -> Set<String> {
        let stillOpen: @Sendable () -> Set<String> = { descriptors.intersection(current()?.entries ?? []) }
        _ = await poll(within: limit) { stillOpen().isEmpty }
        return stillOpen()
    }
}
