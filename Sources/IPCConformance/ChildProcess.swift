public import Foundation
import IPCCore
import Synchronization

/// Starts child processes whose pipes no other child inherits.
///
/// Foundation's `Pipe` makes descriptors without close-on-exec, and its `Process` does not close
/// the parent's other descriptors in the child. Two peers started at the same moment from two
/// threads could then each inherit the other's standard-input pipe, so that closing it no longer
/// told the peer to finish (seen here: a test run hung, two peers each waiting for the other to
/// exit). The pipes made here are close-on-exec from the moment they exist, under a lock that
/// every start through here holds, so no start in between can copy them; the child still gets
/// its end as its standard input or output (`dup2` makes a copy without the flag).
public enum ChildProcess {
    private static let gate = Mutex(())

    /// Starts `process`, with a pipe as its standard input if `input` is set and as its standard
    /// output if `output` is set (else whatever `process` says; `errorToOutput` sends its
    /// standard error into the output pipe too). Returns this side's ends: write to `input`, read
    /// `output`; each closes when released.
    /// - Throws: what `Process.run()` throws; ``IPCError/Code/transportFailure`` if a pipe cannot
    ///   be made.
    public static func run(_ process: Process, input: Bool = false, output: Bool = false, errorToOutput: Bool = false) throws -> (input: FileHandle?, output: FileHandle?) {
        try gate.withLock { _ in
            let inputPipe = input ? try makePipe() : nil
            let outputPipe = output ? try makePipe() : nil
            if let inputPipe { process.standardInput = FileHandle(fileDescriptor: inputPipe.read, closeOnDealloc: false) }
            if let outputPipe {
                let handle = FileHandle(fileDescriptor: outputPipe.write, closeOnDealloc: false)
                process.standardOutput = handle
                if errorToOutput { process.standardError = handle }
            }
            do {
                try process.run()
            } catch {
                for fd in [inputPipe?.read, inputPipe?.write, outputPipe?.read, outputPipe?.write].compactMap({ $0 }) { close(fd) }
                throw error
            }
            // The child's ends are the child's now.
            if let inputPipe { close(inputPipe.read) }
            if let outputPipe { close(outputPipe.write) }
            return (
                inputPipe.map { FileHandle(fileDescriptor: $0.write, closeOnDealloc: true) },
                outputPipe.map { FileHandle(fileDescriptor: $0.read, closeOnDealloc: true) }
            )
        }
    }

    /// Starts `executable` with `arguments`, its standard input and output piped to this side.
    /// - Throws: what ``run(_:input:output:errorToOutput:)`` throws.
    public static func start(_ executable: URL, arguments: [String]) throws -> (process: Process, input: FileHandle, output: FileHandle) {
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        let (input, output) = try run(process, input: true, output: true)
        return (process, input!, output!)
    }

    private static func makePipe() throws -> (read: CInt, write: CInt) {
        var fds: [CInt] = [-1, -1]
        guard pipe(&fds) == 0 else {
            throw IPCError(code: .transportFailure, message: "pipe failed: errno \(errno)")
        }
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        return (fds[0], fds[1])
    }
}
