import CIPCShims
import Glibc
import IPCCore

/// Starts a detached kernel thread that runs `body`: the event loop's, and the receive threads
/// of the transports that cannot be polled (see `docs/ENGINE.md`).
public enum PosixThread {
    private final class Box {
        let body: () -> Void
        init(_ body: @escaping () -> Void) { self.body = body }
    }

    /// - Throws: ``IPCError/Code/transportFailure`` if the kernel refuses a new thread.
    public static func detach(name: String, _ body: @escaping @Sendable () -> Void) throws {
        let box = Unmanaged.passRetained(Box(body)).toOpaque()
        var thread = pthread_t()
        let result = pthread_create(&thread, nil, { context in
            let box = Unmanaged<Box>.fromOpaque(context!).takeRetainedValue()
            box.body()
            return nil
        }, box)
        guard result == 0 else {
            Unmanaged<Box>.fromOpaque(box).release()
            throw IPCError(code: .transportFailure, message: "pthread_create failed for \(name): error \(result)")
        }
        _ = String(name.prefix(15)).withCString { ipc_set_thread_name(thread, $0) }
        pthread_detach(thread)
    }
}
