import IPCCore
import Synchronization
import Testing

@Suite("IPCError: a full listener's answer is told apart from nobody listening")
struct ListenerBusyTests {
    @Test("listenerBusy is endpointNotFound with ListenerBusy as its cause, and only that reads as busy")
    func busyIsMarked() {
        let busy = IPCError.listenerBusy("full")
        #expect(busy.code == .endpointNotFound)
        #expect(busy.isListenerBusy)
        #expect(IPCError(code: .endpointNotFound, message: "wrapped", cause: busy).isListenerBusy)
        #expect(!IPCError(code: .endpointNotFound, message: "nobody listens").isListenerBusy)
        #expect(!IPCError(code: .accessDenied, message: "refused", cause: IPCError.ListenerBusy()).isListenerBusy)
        #expect(!IPCError(code: .interrupted, message: "gone", cause: busy).isListenerBusy)
        #expect("\(busy)".contains("busy"))
        #expect(busy.listenerBusyCause?.answered == true)
        let silent = IPCError.listenerBusy("no answer", answered: false)
        #expect(silent.isListenerBusy)
        #expect(silent.listenerBusyCause?.answered == false)
        #expect(IPCError(code: .endpointNotFound, message: "wrapped", cause: silent).listenerBusyCause?.answered == false)
    }

    @Test("busy answers end an outage: with maximumFailures 2, a connect that finds nobody before a run of busy answers and one after it do not give the service up; two in a row do")
    func busyAnswersEndAnOutage() async throws {
        let nobody = IPCError(code: .endpointNotFound, message: "nobody listens")
        let busy = IPCError.listenerBusy("full")
        // What each connect throws, in order; nobody listening after the script.
        let script = Mutex([nobody, busy, busy, busy, nobody, nobody])
        let service = ServiceConnection(
            connecting: { throw script.withLock { $0.isEmpty ? nobody : $0.removeFirst() } },
            policy: ServiceConnection.Policy(outageLimit: nil, maximumFailures: 2)
        )
        defer { service.invalidate() }
        // The service was never reached, so the one request waits through the back-off (10 ms
        // doubling: about 0.3 s for the six) until the service is given up.
        do {
            _ = try await service.request([1], msgid: 1, sendTimeout: .seconds(60), receiveTimeout: .seconds(1))
            Issue.record("a request was answered by a connect that always throws")
        } catch let error as IPCError {
            #expect(error.code == .invalidated, "the request failed with \(error)")
        }
        #expect(service.invalidationReason?.kind == .serviceUnavailable)
        #expect(service.connectAttempts == 6, "given up after \(service.connectAttempts) connects, not at the second not-listening one in a row (the sixth)")
    }

    @Test("connects a listener holding the endpoint did not answer are an outage, never a reason to start it: with maximumFailures 2 the service is given up at the second, without a start; each request makes one such attempt")
    func unansweredConnectsAreAnOutage() async throws {
        let silent = IPCError.listenerBusy("no answer", answered: false)
        let starts = Mutex(0)
        let service = ServiceConnection(
            connecting: { throw silent },
            policy: ServiceConnection.Policy(outageLimit: nil, maximumFailures: 2),
            startingOnDemand: { starts.withLock { $0 += 1 } }
        )
        defer { service.invalidate() }
        // The first request: one attempt (a connect timeout's worth, for a real transport), then
        // it fails with the silence, though its timeout leaves time for more.
        do {
            _ = try await service.request([1], msgid: 1, sendTimeout: .seconds(60), receiveTimeout: .seconds(1))
            Issue.record("a request was answered by a connect that always throws")
        } catch let error as IPCError {
            #expect(error.listenerBusyCause?.answered == false, "the first request failed with \(error)")
        }
        #expect(service.connectAttempts == 1, "the first request made \(service.connectAttempts) attempts")
        #expect(service.invalidationReason == nil)
        // The second silence in a row gives the service up.
        do {
            _ = try await service.request([2], msgid: 1, sendTimeout: .seconds(60), receiveTimeout: .seconds(1))
            Issue.record("a request was answered by a connect that always throws")
        } catch let error as IPCError {
            #expect(error.code == .invalidated, "the second request failed with \(error)")
        }
        #expect(service.invalidationReason?.kind == .serviceUnavailable)
        #expect(service.connectAttempts == 2)
        #expect(starts.withLock { $0 } == 0, "the service was started on demand \(starts.withLock { $0 }) times while its listener held the endpoint")
    }
}
