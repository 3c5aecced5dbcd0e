// Seam: kernel threads. pthreads on Linux and Darwin alike; the entry point's parameter and
// thread naming differ. The Darwin branch has never been compiled (docs/DARWIN.md).
#if os(Linux)
import CIPCShims
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import IPCCore

/// Starts a detached kernel thread that runs `body`: the event loop's, and the receive threads
/// of the transports that cannot be polled (see `docs/ENGINE.md`).
package enum PosixThread {
    private final class Box {
        let name: String
        let body: () -> Void
        init(_ name: String, _ body: @escaping () -> Void) {
            self.name = String(name.prefix(15))
            self.body = body
        }

        /// Runs on the new thread: names it (Linux allows at most 15 bytes), then the body.
        static func run(_ context: UnsafeMutableRawPointer) {
            let box = Unmanaged<Box>.fromOpaque(context).takeRetainedValue()
            #if os(Linux)
            _ = box.name.withCString { ipc_set_thread_name(pthread_self(), $0) }
            #elseif canImport(Darwin)
            _ = box.name.withCString { pthread_setname_np($0) }
            #endif
            box.body()
        }
    }

    /// - Throws: ``IPCError/Code/transportFailure`` if the kernel refuses a new thread.
    package static func detach(name: String, _ body: @escaping @Sendable () -> Void) throws {
        let box = Unmanaged.passRetained(Box(name, body)).toOpaque()
        #if os(Linux)
        var thread = pthread_t()
        let result = pthread_create(&thread, nil, { context in
            Box.run(context!)
            return nil
        }, box)
        #elseif canImport(Darwin)
        var thread: pthread_t?
        let result = pthread_create(&thread, nil, { context in
            Box.run(context)
            return nil
        }, box)
        #endif
        guard result == 0 else {
            Unmanaged<Box>.fromOpaque(box).release()
            throw IPCError(code: .transportFailure, message: "pthread_create failed for \(name): error \(result)")
        }
        #if os(Linux)
        pthread_detach(thread)
        #elseif canImport(Darwin)
        if let thread { pthread_detach(thread) }
        #endif
    }
}
