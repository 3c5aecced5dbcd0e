import IPCCore
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
    }
}
