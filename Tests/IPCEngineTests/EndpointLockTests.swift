import Foundation
import IPCCore
import IPCSystem
import IPCTestSupport
import Synchronization
import Testing

/// Who holds an endpoint: the listener's exclusive claim, and the moments other processes hold
/// its lock without being its listener.
@Suite("EndpointLock: the owner is the listener, never a process tidying up after one")
struct EndpointLockTests {
    @Test("owner(of:) names the process that claimed the endpoint, and nobody once the claim is let go")
    func ownerIsTheClaimant() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("claimed")
        #expect(EndpointLock.owner(of: endpoint) == nil)
        let claim = try EndpointLock(endpoint: endpoint)
        #expect(EndpointLock.owner(of: endpoint) == getpid())
        #expect(throws: IPCError.self) { try EndpointLock(endpoint: endpoint) }
        claim.release()
        // Polled: a process another test forks at that moment holds a copy of the descriptor
        // until it execs, and the lock with it.
        #expect(await poll(seconds: 10) { EndpointLock.owner(of: endpoint) == nil })
    }

    @Test("while a process tidies up after a dead listener (ifUnheld), nobody owns the endpoint, and a listener that starts then waits for the tidying to end instead of failing with endpointInUse")
    func tidyingIsNoOwner() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("tidied")
        let claimed = Mutex<Result<EndpointLock, any Error>?>(nil)
        let ownerDuring = Mutex<Int32?>(-1)
        EndpointLock.ifUnheld(endpoint) {
            // A client connecting now must find nobody (it waited for this process's answer, a
            // connect timeout long, when the tidying held the lock exclusively).
            ownerDuring.withLock { $0 = EndpointLock.owner(of: endpoint) }
            Thread.detachNewThread {
                let result = Result { try EndpointLock(endpoint: endpoint) }
                claimed.withLock { $0 = result }
            }
            usleep(30_000)
            #expect(claimed.withLock { $0 } == nil, "a listener claimed the endpoint while it was being tidied")
        }
        #expect(ownerDuring.withLock { $0 } == nil, "the tidying process was taken for the endpoint's owner (pid \(ownerDuring.withLock { $0 }.map(String.init) ?? "nil"))")
        #expect(await poll(seconds: 10) { claimed.withLock { $0 } != nil })
        let claim = try #require(try claimed.withLock { $0 }?.get(), "the listener that started during the tidying did not claim the endpoint")
        #expect(EndpointLock.owner(of: endpoint) == getpid())
        claim.release()
    }
}
