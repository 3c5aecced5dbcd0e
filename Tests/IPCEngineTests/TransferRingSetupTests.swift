import Foundation
import IPCEngine
import Testing

/// A loop makes its transfer ring at the first frame whose rest it hands to the kernel, or on
/// request (`makeTransferRingNow`), so that a census of the process's descriptors (the soak's)
/// can count it before it looks for leaks.
@Suite("Engine: the loop's transfer ring, made on request")
struct TransferRingSetupTests {
    #if os(Linux)
    @Test("a loop asked for io_uring makes its ring on request where the kernel allows one, and keeps it")
    func madeOnRequest() async throws {
        let loop = try EventLoop(name: "ring-setup-test", stallThreshold: .seconds(30), largeTransfers: .ioUring) { _ in }
        let made = await loop.makeTransferRingNow()
        let first = await Self.ring(of: loop)
        // The answer is the loop's own: a ring it holds, or a refusal it remembers (the loop
        // then moves large frames the epoll way).
        #expect(made == (first != nil))
        #expect(made == !loop.noTransferRing)
        // Where the kernel allows io_uring to everyone and no seccomp filter is on this
        // process (a container's may refuse io_uring_setup), the ring is made.
        if Self.procLine("/proc/sys/kernel/io_uring_disabled") == "0", Self.procField("Seccomp") == "0" {
            #expect(made, "kernel.io_uring_disabled is 0 and no seccomp filter, yet the loop made no ring")
        }
        // Asked again, the loop keeps what it has: the same ring, not a second one.
        #expect(await loop.makeTransferRingNow() == made)
        let second = await Self.ring(of: loop)
        #expect(first === second)
    }

    /// The loop's ring, read on its thread (`nil`: none).
    private static func ring(of loop: EventLoop) async -> TransferRing? {
        await withCheckedContinuation { (done: CheckedContinuation<TransferRing?, Never>) in
            loop.execute { done.resume(returning: loop.transferRing()) }
        }
    }

    private static func procLine(_ path: String) -> String? {
        (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// A field of /proc/self/status, such as `Seccomp` (0: no filter).
    private static func procField(_ name: String) -> String? {
        procLine("/proc/self/status")?.split(separator: "\n")
            .first { $0.hasPrefix(name + ":") }
            .map { $0.dropFirst(name.count + 1).trimmingCharacters(in: .whitespaces) }
    }
    #endif

    @Test("a loop asked to move large frames the epoll way makes no ring")
    func noneForEpoll() async throws {
        let loop = try EventLoop(name: "ring-setup-epoll-test", stallThreshold: .seconds(30), largeTransfers: .epoll) { _ in }
        #expect(await loop.makeTransferRingNow() == false)
        #if os(Linux)
        // Its connections are told so, and look for no ring when a large frame's rest is left.
        #expect(loop.noTransferRing)
        #endif
    }
}
