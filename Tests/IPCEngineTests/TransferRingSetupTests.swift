import Foundation
import IPCEngine
import Testing

/// A loop makes its transfer ring at the first frame whose rest it hands to the kernel, or on
/// request (`makeTransferRingNow`), so that a census of the process's descriptors (the soak's)
/// can count it before it looks for leaks.
@Suite("Engine: the loop's transfer ring, made on request")
struct TransferRingSetupTests {
    @Test("a loop asked for io_uring makes its ring on request where the kernel allows one, and keeps it")
    func madeOnRequest() async throws {
        let loop = try EventLoop(name: "ring-setup-test", stallThreshold: .seconds(30), largeTransfers: .ioUring) { _ in }
        let made = await loop.makeTransferRingNow()
        // A refusal is remembered, and said: the loop then moves large frames the epoll way.
        #expect(made == !loop.transferRingRefused)
        // Where the kernel allows io_uring to everyone, the ring is made.
        if let disabled = try? String(contentsOfFile: "/proc/sys/kernel/io_uring_disabled", encoding: .utf8),
            disabled.trimmingCharacters(in: .whitespacesAndNewlines) == "0"
        {
            #expect(made, "kernel.io_uring_disabled is 0, yet the loop made no ring")
        }
        // Asked again, the loop has the same answer (the ring it made, or the refusal).
        #expect(await loop.makeTransferRingNow() == made)
    }

    @Test("a loop asked to move large frames the epoll way makes no ring")
    func noneForEpoll() async throws {
        let loop = try EventLoop(name: "ring-setup-epoll-test", stallThreshold: .seconds(30), largeTransfers: .epoll) { _ in }
        #expect(await loop.makeTransferRingNow() == false)
    }
}
