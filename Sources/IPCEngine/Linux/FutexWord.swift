#if canImport(Glibc)
import CIPCShims

/// A 32-bit word in this process's memory that threads sleep on until another thread moves
/// it: `FUTEX_WAIT_PRIVATE` and `FUTEX_WAKE_PRIVATE`, the hand-off the C floor
/// `unix-stream+epoll+handoff` makes to its worker. Heap-allocated (the kernel keys a waiter by
/// the word's address, which must not move).
package final class FutexWord: @unchecked Sendable {
    // @unchecked: the word is only touched through atomic and futex calls.
    private let word: UnsafeMutablePointer<UInt32>

    package init() {
        word = .allocate(capacity: 1)
        word.initialize(to: 0)
    }

    deinit { word.deallocate() }

    /// The word now (an acquiring load).
    package var value: UInt32 { ipc_atomic_load_u32(word) }

    /// Moves the word on (sequentially consistent) and wakes up to `count` threads sleeping on
    /// it: a thread about to sleep on the old value returns at once instead.
    package func bump(waking count: Int32) {
        _ = ipc_atomic_fetch_add_u32(word, 1)
        _ = ipc_futex_wake_private(word, count)
    }

    /// Sleeps while the word holds `seen`. Returns when woken, at once if the word has moved
    /// already, and sometimes for no reason (a signal): the caller looks again either way.
    package func wait(whileEquals seen: UInt32) {
        _ = ipc_futex_wait_private(word, seen, -1)
    }
}
#endif
