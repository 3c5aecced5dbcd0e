import Foundation
import Glibc
import IPCCore
@testable import IPCEngine
import IPCSystem
import IPCTestSupport
import Synchronization
import Testing

/// The process watcher, both ways: through pidfds, and by polling `/proc` (where `pidfd_open` is
/// missing or refused, or `IPCBENCH_PROCESS_WATCH=poll`). Each watches real child processes
/// (`/bin/sleep`), started with `posix_spawn` and reaped only after the test has looked, so a
/// killed one stays a zombie meanwhile, as a peer a process has started does until it reaps it.
@Suite("Process watcher", .elasticThreads)
struct ProcessWatcherTests {
    /// A child running `sleep 30`, not reaped until ``reap()``.
    final class Child: Sendable {
        let pid: pid_t

        init(_ words: [String] = ["/bin/sleep", "30"]) throws {
            var pid: pid_t = 0
            let arguments: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) } + [nil]
            defer { arguments.forEach { free($0) } }
            let result = posix_spawn(&pid, words[0], nil, nil, arguments, environ)
            guard result == 0 else { throw POSIXError(POSIXErrorCode(rawValue: result) ?? .EIO) }
            self.pid = pid
        }

        func kill() { _ = Glibc.kill(pid, SIGKILL) }

        func reap() {
            var status: Int32 = 0
            _ = waitpid(pid, &status, 0)
        }
    }

    /// Counts a handler's calls and whether each ran on the loop's thread.
    final class Calls: Sendable {
        private let state = Mutex<(count: Int, onLoop: Bool)>((0, true))
        func record() {
            let onLoop = (try? EventLoop.shared().inEventLoop) ?? false
            state.withLock { $0 = ($0.count + 1, $0.onLoop && onLoop) }
        }
        var count: Int { state.withLock { $0.count } }
        var allOnLoop: Bool { state.withLock { $0.onLoop } }
    }

    @Test("a killed process's exit is reported once, on the loop's thread (a zombie counts as exited)", arguments: [false, true])
    func killedProcess(polling: Bool) async throws {
        let watcher = ProcessWatcher(polling: polling)
        let child = try Child()
        defer {
            child.kill()
            child.reap()
        }
        let calls = Calls()
        _ = try watcher.watch(pid: child.pid) { calls.record() }
        #expect(calls.count == 0)
        child.kill()
        try await withDeadline(seconds: 20, "the exit of \(child.pid) reported") {
            while calls.count == 0 { try await Task.sleep(for: .milliseconds(5)) }
        }
        // Polling goes on: the exit is not reported a second time.
        try await Task.sleep(for: ProcessWatcher.pollInterval * 5)
        #expect(calls.count == 1)
        #expect(calls.allOnLoop)
    }

    @Test("a cancelled watch never calls its handler", arguments: [false, true])
    func cancelled(polling: Bool) async throws {
        let watcher = ProcessWatcher(polling: polling)
        let child = try Child()
        defer {
            child.kill()
            child.reap()
        }
        let calls = Calls()
        let watch = try watcher.watch(pid: child.pid) { calls.record() }
        watcher.cancel(watch)
        child.kill()
        try await Task.sleep(for: ProcessWatcher.pollInterval * 20)
        #expect(calls.count == 0)
    }

    @Test("a process already gone is reported at once, on the calling thread", arguments: [false, true])
    func alreadyGone(polling: Bool) throws {
        let watcher = ProcessWatcher(polling: polling)
        let child = try Child()
        child.kill()
        child.reap()
        let calls = Calls()
        _ = try watcher.watch(pid: child.pid) { calls.record() }
        #expect(calls.count == 1)
    }

    /// A process whose main thread ended first (`pthread_exit`): its state in `/proc` is a
    /// zombie's, yet it runs on in its other thread. Python's main thread calls `pthread_exit`
    /// through ctypes; its other thread ends once the file named by its argument exists.
    static let mainThreadEndsFirst = """
        import ctypes, os, sys, threading, time
        def wait():
            while not os.path.exists(sys.argv[1]): time.sleep(0.005)
        threading.Thread(target=wait).start()
        ctypes.CDLL(None).pthread_exit(None)
        """

    @Test("a process whose main thread ended before its other thread is alive until that one ends; then its exit is reported", arguments: [false, true])
    func mainThreadEndedFirst(polling: Bool) async throws {
        let group = try TestGroup()
        let go = group.directory.path + "/go"
        let child = try Child(["/usr/bin/python3", "-c", Self.mainThreadEndsFirst, go])
        defer {
            child.kill()
            child.reap()
        }
        // Until the main thread has ended: the state says zombie. Looked at once more after the
        // deadline, so that a sleep that overran it (a busy machine's starved task) does not
        // fail a child that did what it should.
        let deadline = ContinuousClock.now + .seconds(30)
        var stat: ProcessStat?
        var last = ProcessStat.Reading.gone
        while true {
            last = ProcessStat.read(pid: child.pid)
            if case .found(let found) = last, found.state == UInt8(ascii: "Z") {
                stat = found
                break
            }
            if ContinuousClock.now >= deadline { break }
            try await Task.sleep(for: .milliseconds(5))
        }
        let leaderEnded = try #require(stat, "the child's main thread did not end within 30 s; its stat: \(last)")
        #expect(leaderEnded.threadsRunOn && !leaderEnded.exited)
        #expect(ProcessWatcher.isAlive(pid: child.pid))
        let watcher = ProcessWatcher(polling: polling)
        let calls = Calls()
        let watch = try watcher.watch(pid: child.pid) { calls.record() }
        defer { watcher.cancel(watch) }
        try await Task.sleep(for: ProcessWatcher.pollInterval * 10)
        #expect(calls.count == 0, "the exit of a process that runs on was reported")
        // Its other thread ends: now it has exited. The wait has a deadline of its own, from
        // `go`: one counted from the test's start had passed already in two full runs on a
        // loaded VM (the main thread's end seen 50 s late), and the child, its other thread still
        // sleeping between looks for `go`, was then found alive at once.
        FileManager.default.createFile(atPath: go, contents: nil)
        let exitDeadline = ContinuousClock.now + .seconds(30)
        while calls.count == 0, ContinuousClock.now < exitDeadline { try await Task.sleep(for: .milliseconds(5)) }
        #expect(calls.count == 1 && calls.allOnLoop, "no single report on the loop; \(Self.threadReport(pid: child.pid)), go exists: \(FileManager.default.fileExists(atPath: go))")
        #expect(!ProcessWatcher.isAlive(pid: child.pid))
        guard case .found(let ended) = ProcessStat.read(pid: child.pid) else {
            Issue.record("no stat for the unreaped child \(child.pid)")
            return
        }
        #expect(ended.exited && !ended.threadsRunOn)
    }

    /// Each of the process's threads: its state, the kernel function it sleeps in and the system
    /// call it is in (from /proc), for a failure's message.
    static func threadReport(pid: pid_t) -> String {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        guard !tasks.isEmpty else { return "no threads listed for \(pid)" }
        return "threads of \(pid): " + tasks.sorted().map { tid in
            func read(_ name: String) -> String {
                ((try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/\(name)", encoding: .utf8)) ?? "?")
                    .trimmingCharacters(in: .whitespacesAndNewlines)
            }
            let stat = read("stat")
            let state = stat.split(separator: ")").last.map { String($0.dropFirst().prefix(1)) } ?? "?"
            return "\(tid) state \(state), wchan \(read("wchan")), syscall \(read("syscall").split(separator: " ").first ?? "?")"
        }.joined(separator: "; ")
    }

    @Test("isAlive: this process is, a killed child not yet reaped is not, a reaped one is not")
    func isAlive() throws {
        #expect(ProcessWatcher.isAlive(pid: getpid()))
        let child = try Child()
        #expect(ProcessWatcher.isAlive(pid: child.pid))
        guard case .found(let running) = ProcessStat.read(pid: child.pid) else {
            Issue.record("no stat for the running child \(child.pid)")
            return
        }
        let startTime = running.startTime
        #expect(!running.exited)
        child.kill()
        // Until the kernel has made it a zombie.
        var waited = 0
        while ProcessStat.read(pid: child.pid) != .found(ProcessStat(state: UInt8(ascii: "Z"), startTime: startTime)), waited < 10_000 {
            usleep(1000)
            waited += 1
        }
        #expect(!ProcessWatcher.isAlive(pid: child.pid))
        #expect(ProcessStat.read(pid: child.pid) == .found(ProcessStat(state: UInt8(ascii: "Z"), startTime: startTime)))
        child.reap()
        #expect(!ProcessWatcher.isAlive(pid: child.pid))
        #expect(ProcessStat.read(pid: child.pid) == .gone)
    }

    /// With every descriptor in use, neither a pidfd nor the stat file can be opened: a process
    /// that is there must still count as alive (a server out of descriptors once took its live
    /// clients for dead ones), and one that is not as dead. In a process of its own, whose
    /// descriptor table this fills.
    @Test("isAlive with no descriptor to spare: a live process is alive, a reaped one is not")
    func isAliveWithoutDescriptors() async throws {
        guard ChildProcessTest.isChildRun else {
            try await ChildProcessTest.run(filter: "isAliveWithoutDescriptors")
            return
        }
        let child = try Child()
        let gone = try Child()
        gone.kill()
        gone.reap()
        var limit = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        let saved = limit
        // Fills the table up to a soft limit a little above the descriptors open now.
        var highest: Int32 = 0
        for fd in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? [] { highest = max(highest, Int32(fd) ?? 0) }
        limit.rlim_cur = rlim_t(highest + 8)
        setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        var fillers: [Int32] = []
        while true {
            let fd = open("/dev/null", O_RDONLY | O_CLOEXEC)
            if fd < 0 { break }
            fillers.append(fd)
        }
        let full = errno == EMFILE
        let childAlive = ProcessWatcher.isAlive(pid: child.pid)
        let goneAlive = ProcessWatcher.isAlive(pid: gone.pid)
        let stat = ProcessStat.read(pid: child.pid)
        fillers.forEach { close($0) }
        limit = saved
        setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        child.kill()
        child.reap()
        #expect(full)
        #expect(stat == .unknown)
        #expect(childAlive)
        #expect(!goneAlive)
    }

    @Test("a stat line is read from its last parenthesis: a command name may hold spaces and ') '")
    func statParsing() throws {
        let tail = " 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21"
        let plain = try #require(ProcessStat.parse(Array("42 (sleep) S\(tail)".utf8)))
        #expect(plain.state == UInt8(ascii: "S") && plain.startTime == 987_654)
        let odd = try #require(ProcessStat.parse(Array("42 (a) Z 1 (b) R\(tail)".utf8)))
        #expect(odd.state == UInt8(ascii: "R") && !odd.exited)
        #expect(ProcessStat.parse(Array("42 (x) Z\(tail)".utf8))?.exited == true)
        // Truncated, no parenthesis, a state of two letters, a start time that is not a number.
        #expect(ProcessStat.parse(Array("42 (sleep) S 1 2 3".utf8)) == nil)
        #expect(ProcessStat.parse(Array("42 sleep S\(tail)".utf8)) == nil)
        #expect(ProcessStat.parse(Array("42 (sleep) SS\(tail)".utf8)) == nil)
        #expect(ProcessStat.parse(Array("42 (sleep) S\(tail.replacingOccurrences(of: "987654", with: "-1"))".utf8)) == nil)
        // This process's own file.
        guard case .found(let own) = ProcessStat.read(pid: getpid()) else {
            Issue.record("no stat for this process")
            return
        }
        #expect(!own.exited && own.startTime > 0)
    }
}
