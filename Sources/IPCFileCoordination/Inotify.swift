import Glibc
import IPCCore
import IPCSystem
import SystemPackage

/// The inotify calls of the process-wide instances the event loop reads (the presenters', and
/// the file-presenter transport's journals'), with errors that name the limit that ran out.
package enum Inotify {
    /// Makes a non-blocking, close-on-exec instance for watching `what`.
    /// - Throws: ``IPCError/Code/transportFailure``, naming `fs.inotify.max_user_instances`
    ///   when this user's ran out.
    package static func instance(watching what: String) throws -> CInt {
        let descriptor = inotify_init1(CInt(IN_NONBLOCK | IN_CLOEXEC))
        guard descriptor >= 0 else {
            let error = Errno(rawValue: errno)
            if error == .tooManyOpenFiles {
                throw IPCError(code: .transportFailure, message: "cannot watch \(what): this user's inotify instances (fs.inotify.max_user_instances) are used up", cause: error)
            }
            throw IPCError.syscall("inotify_init1", error, context: what)
        }
        return descriptor
    }

    /// Watches `path` for `mask` on `instance`; `what` names it in an error.
    /// - Returns: the watch descriptor.
    /// - Throws: ``IPCError/Code/transportFailure``, naming `fs.inotify.max_user_watches` when
    ///   this user's ran out.
    package static func watch(_ instance: CInt, _ path: String, mask: UInt32, naming what: String) throws -> CInt {
        let watch = inotify_add_watch(instance, path, mask)
        guard watch >= 0 else {
            let error = Errno(rawValue: errno)
            if error == .noSpace {
                throw IPCError(code: .transportFailure, message: "cannot watch \(what): this user's inotify watches (fs.inotify.max_user_watches) are used up", cause: error)
            }
            throw IPCError.syscall("inotify_add_watch", error, context: what)
        }
        return watch
    }
}
