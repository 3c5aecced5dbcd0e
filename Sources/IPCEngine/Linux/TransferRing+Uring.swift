#if os(Linux)
import CIPCShims
import Glibc
import IPCCore
import SystemPackage

/// The event loop's io_uring ring for the rest of large frames (docs/ENGINE.md, "Large frames in
/// the kernel's hands"). The rest of a frame being sent goes to the kernel as one `sendmsg`, the
/// rest of one being received as one `recv`, both with `MSG_WAITALL`. The kernel goes on with
/// them each time the peer makes room or sends more, and the loop hears once, when all of it
/// moved (or the connection broke or ended).
///
/// While any is in flight the loop waits in the ring (``wait(watching:)``), not in `epoll_wait`:
/// the kernel's retries then run inside that wait, with no return to user space between them,
/// and the epoll descriptor is watched by a poll request on the ring, so that every other event
/// still wakes the loop.
///
/// Loop thread only: made by ``EventLoop/transferRing()``, used by the connections, waited on
/// and reaped by the loop. It lives as long as the loop, that is, the process.
package final class TransferRing: @unchecked Sendable {
    // @unchecked: every field but the immutable ones is touched on the loop's thread only.

    /// Transfers in flight at once; a connection that finds every slot taken moves its bytes
    /// the epoll way.
    static let slotCount = 64

    private let ring: OpaquePointer

    private struct InFlight {
        /// What holds the memory the kernel reads or writes until the completion: a frame
        /// whose payload is being sent (its array's storage, whose address was handed over,
        /// stays where it is while it lives unchanged), or the connection that owns a receive
        /// buffer.
        let keeping: Any
        let done: (Int) -> Void
    }

    @exclusivity(unchecked) private var inFlight: [InFlight?]

    /// A ring, or the reason the kernel gave for none.
    static func make() -> Result<TransferRing, Errno> {
        guard let ring = ipc_ring_open(CInt(slotCount)) else { return .failure(Errno(rawValue: errno)) }
        return .success(TransferRing(ring))
    }

    private init(_ ring: OpaquePointer) {
        self.ring = ring
        inFlight = Array(repeating: nil, count: Self.slotCount)
    }

    /// Closes a ring that has nothing in flight (one made only to see that the kernel allows it).
    func close() {
        precondition(!hasTransfersInFlight, "a transfer ring closed with transfers in flight")
        ipc_ring_close(ring)
    }

    /// Whether a transfer's completion is still to come: the loop then waits in the ring.
    var hasTransfersInFlight: Bool { ipc_ring_in_flight(ring) > 0 }

    /// Hands `head` (copied now) then `payload` (read by the kernel until `done` runs) to the
    /// kernel to send on `fd`, all of it. `payload` must be bytes of `frame.payload`'s own
    /// storage. `done` runs on the loop's thread, once, with the bytes sent (fewer than all when
    /// the kernel stopped short, or the connection broke), or `-errno`. Returns the transfer's slot, or
    /// `nil` if it was not taken (every slot in flight, or the kernel refused): nothing was
    /// sent then.
    func send(fd: CInt, head: UnsafeRawBufferPointer, payload: UnsafeRawBufferPointer, keeping frame: Frame, done: @escaping (Int) -> Void) -> Int? {
        let slot = ipc_ring_send(ring, fd, head.baseAddress, head.count, payload.baseAddress, payload.count)
        guard slot >= 0 else { return nil }
        inFlight[Int(slot)] = InFlight(keeping: frame, done: done)
        return Int(slot)
    }

    /// Hands a receive of `buffer.count` bytes on `fd` into `buffer` to the kernel. `buffer`
    /// must stay valid, and be left alone, until `done` runs (on the loop's thread, once, with
    /// the bytes received, fewer if the stream ended or broke first, or `-errno`); `owner` is
    /// kept until then. Returns the transfer's slot, or `nil` if it was not taken.
    func receive(fd: CInt, into buffer: UnsafeMutableRawBufferPointer, keeping owner: AnyObject, done: @escaping (Int) -> Void) -> Int? {
        let slot = ipc_ring_receive(ring, fd, buffer.baseAddress, buffer.count)
        guard slot >= 0 else { return nil }
        inFlight[Int(slot)] = InFlight(keeping: owner, done: done)
        return Int(slot)
    }

    /// Asks the kernel to stop the transfer in `slot`: its completion still comes, with
    /// `-ECANCELED` or what moved. Returns whether the request was made (the kernel may refuse
    /// it, out of memory).
    @discardableResult
    func cancel(_ slot: Int) -> Bool {
        guard inFlight[slot] != nil else { return false }
        return ipc_ring_cancel(ring, CInt(slot)) == 0
    }

    /// Waits until a transfer completes or `epollDescriptor` is readable (the loop's other
    /// events, its wake-ups and its timers all show there). A signal ends the wait early.
    /// Returns whether epoll may have events: `false` when only transfers completed, so the
    /// loop need not ask it (a system call a large frame's rest would otherwise cost).
    func wait(watching epollDescriptor: CInt) -> Bool {
        ipc_ring_wait(ring, epollDescriptor) != 0
    }

    /// Runs the `done` of each completed transfer (loop thread).
    func reap() {
        withUnsafeTemporaryAllocation(of: CInt.self, capacity: 2 * Self.slotCount) { buffer in
            let slots = buffer.baseAddress!
            let results = slots + Self.slotCount
            while true {
                let count = Int(ipc_ring_reap(ring, slots, results, CInt(Self.slotCount)))
                for index in 0..<count {
                    let slot = Int(slots[index])
                    let entry = inFlight[slot]
                    inFlight[slot] = nil
                    // Freed only now: a transfer that an earlier `done` of this batch started
                    // cannot have taken it, and so cannot be handed this one's result.
                    ipc_ring_release(ring, CInt(slot))
                    entry?.done(Int(results[index]))
                }
                if count < Self.slotCount { return }
            }
        }
    }
}
#endif
