import Foundation
import IPCCore

/// Starts the long-lived child of a peer (``ConformancePeer/Grandchild``). The child reads its
/// standard input, the peer's pipe from the suite, until end of file, so it ends when the suite
/// stops the peer, or when the suite itself exits, and never lingers.
enum GrandchildProcess {
    /// Starts the child and returns its pid.
    /// - Throws: ``IPCError/Code/transportFailure`` if it cannot be started.
    static func start(_ kind: ConformancePeer.Grandchild) throws -> Int32 {
        switch kind {
        case .spawn:
            return try spawnReader()
        case .spawnLeakingDescriptors:
            clearCloseOnExecOnEveryDescriptor()
            return try spawnReader()
        case .fork:
            let pid = fork()
            if pid == 0 {
                // Only async-signal-safe calls after fork in a multithreaded process.
                var byte: UInt8 = 0
                while read(STDIN_FILENO, &byte, 1) > 0 {}
                _exit(0)
            }
            guard pid > 0 else {
                throw IPCError(code: .transportFailure, message: "fork failed: errno \(errno)")
            }
            return pid
        }
    }

    /// `cat > /dev/null` through `posix_spawn` (not Foundation's `Process`, which closes every
    /// descriptor in the child and so would hide a leaked one).
    private static func spawnReader() throws -> Int32 {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0)
        var pid: pid_t = 0
        let arguments: [UnsafeMutablePointer<CChar>?] = [strdup("cat"), nil]
        defer { arguments.forEach { free($0) } }
        let result = posix_spawnp(&pid, "cat", &actions, nil, arguments, environ)
        guard result == 0 else {
            throw IPCError(code: .transportFailure, message: "posix_spawn of cat failed: error \(result)")
        }
        return pid
    }

    private static func clearCloseOnExecOnEveryDescriptor() {
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        for fd in descriptors.compactMap({ CInt($0) }) where fd > STDERR_FILENO {
            let flags = fcntl(fd, F_GETFD)
            if flags >= 0 { _ = fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) }
        }
    }
}
