import Foundation
import Glibc
import IPCConformance
import IPCBenchKit
import IPCCore
import IPCTestSupport
import NotifyTransport
import Synchronization
import Testing
import SystemPackage

/// The notification center against a second process (`ipcbench notifyutil`).
///
/// Its tests wait for deliveries that take a few hops between threads (the watcher's thread, a
/// Dispatch thread, the waiting task), so they run on threads of their own: on Swift's
/// cooperative pool, two threads that every other test of the process also queues on, each hop
/// waited behind the rest (a full run here saw one test's task wait 16-32 s to start, and a
/// delivery 15 s to reach its loop, so that three deliveries missed a 30 s deadline).
@Suite("Notify center", .elasticThreads)
struct NotifyCenterTests {
    private func notifyutil(_ group: borrowing TestGroup, _ arguments: [String]) async throws -> (status: Int32, output: String) {
        try await PeerProcess.runToCompletion(["notifyutil", "--group", group.directory.path] + arguments)
    }

    @Test("K rapid posts from another process give between 1 and K deliveries, never 0", arguments: [1, 10, 1000])
    func coalescing(posts: Int) async throws {
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        let deliveries = Mutex(0)
        let registration = try center.register("test.burst") { deliveries.withLock { $0 += 1 } }
        defer { registration.cancel() }
        #expect(try await notifyutil(group, ["--post", "test.burst", "--count", String(posts)]).status == 0)
        // Deliveries are asynchronous: wait (generously) for at least one, then let stragglers land.
        let deadline = ContinuousClock.now + .seconds(10)
        while deliveries.withLock({ $0 }) == 0, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        try await Task.sleep(for: .milliseconds(200))
        let count = deliveries.withLock { $0 }
        #expect(count >= 1)
        #expect(count <= posts)
    }

    @Test("a post from this process wakes a waiter in another process")
    func crossProcessWake() async throws {
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        let waiter = Process()
        waiter.executableURL = try PeerProcess.executableURL()
        waiter.arguments = ["notifyutil", "--group", group.directory.path, "--wait", "test.wake", "--timeout", "20"]
        let output = try ChildProcess.run(waiter, output: true).output!
        // Post only once the waiter has registered (it prints READY).
        var seen = Data()
        while !String(decoding: seen, as: UTF8.self).contains("READY"), let chunk = try output.read(upToCount: 1), !chunk.isEmpty {
            seen += chunk
        }
        try center.post("test.wake")
        waiter.waitUntilExit()
        seen += output.readDataToEndOfFile()
        #expect(waiter.terminationStatus == 0)
        #expect(String(decoding: seen, as: UTF8.self).contains("notified"))
    }

    @Test("300 registrations run no thread each, and each is called after a post of its name")
    func manyRegistrations() async throws {
        guard ChildProcessTest.isChildRun else {
            return try await ChildProcessTest.run(filter: "manyRegistrations")
        }
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        let count = 300
        let calls = Mutex([Int](repeating: 0, count: count))
        let before = ChildProcessTest.threadCount()
        let registrations = try (0..<count).map { index in
            try center.register("test.many.\(index)") { calls.withLock { $0[index] += 1 } }
        }
        defer { registrations.forEach { $0.cancel() } }
        // One waiting thread per 127 registrations (futex_waitv's 128 words, one its own).
        let after = ChildProcessTest.threadCount()
        #expect(after <= before + 3, "threads \(before) before \(count) registrations, \(after) after")
        for index in 0..<count { try center.post("test.many.\(index)") }
        let deadline = ContinuousClock.now + .seconds(30)
        while calls.withLock({ $0.contains(0) }), ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        let uncalled = calls.withLock { calls in calls.indices.filter { calls[$0] == 0 } }
        #expect(uncalled.isEmpty, "registrations never called: \(uncalled.prefix(10))")
        print("notify: \(count) registrations, threads \(before) → \(after)")
    }

    @Test("after cancel no callback arrives, including when cancelled from inside the handler")
    func cancellation() async throws {
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        let cancelledCalls = Mutex(0)
        let cancelled = try center.register("test.cancel") { cancelledCalls.withLock { $0 += 1 } }
        cancelled.cancel()

        let selfCancelCalls = Mutex(0)
        let holder = Mutex<NotifyRegistration?>(nil)
        let selfCancelling = try center.register("test.cancel") {
            selfCancelCalls.withLock { $0 += 1 }
            holder.withLock { $0 }?.cancel()
        }
        holder.withLock { $0 = selfCancelling }

        for _ in 0..<5 {
            #expect(try await notifyutil(group, ["--post", "test.cancel"]).status == 0)
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(cancelledCalls.withLock { $0 } == 0)
        #expect(selfCancelCalls.withLock { $0 } == 1)
    }

    @Test("a registration released without cancel is cancelled: its handler never runs again")
    func releasedRegistration() async throws {
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        let calls = Mutex(0)
        var registration: NotifyRegistration? = try center.register("test.release") { calls.withLock { $0 += 1 } }
        #expect(try await notifyutil(group, ["--post", "test.release"]).status == 0)
        try await withDeadline(seconds: 30, "the first delivery") {
            while calls.withLock({ $0 }) == 0 { try await Task.sleep(for: .milliseconds(10)) }
        }
        #expect(registration?.name == "test.release")
        registration = nil
        let before = calls.withLock { $0 }
        for _ in 0..<5 {
            #expect(try await notifyutil(group, ["--post", "test.release"]).status == 0)
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(calls.withLock { $0 } == before)
    }

    @Test("a notification table overwritten with garbage by another process: no crash, no hang, and it heals as names are used")
    func garbageTable() async throws {
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        try center.setState(7, for: "test.before")
        // Every byte after the header, random, written by dd(1).
        let dd = Process()
        dd.executableURL = URL(fileURLWithPath: "/bin/dd")
        dd.arguments = ["if=/dev/urandom", "of=\(group.directory.path)/notify.center", "bs=64", "seek=1", "count=\(NotifyCenter.capacity * 2)", "conv=notrunc", "status=none"]
        try dd.run()
        dd.waitUntilExit()
        #expect(dd.terminationStatus == 0)
        // A name claimed over garbage starts from state 0, not from the garbage's bytes, here
        // and in another process.
        for index in 0..<20 {
            #expect(try center.state(for: "test.never.\(index)") == 0)
        }
        #expect(try await notifyutil(group, ["--get", "test.never.remote"]).output == "0\n")
        // Names are claimed anew over the garbage, and work across processes again.
        for index in 0..<50 {
            try center.setState(UInt64(index), for: "test.after.\(index)")
            #expect(try center.state(for: "test.after.\(index)") == UInt64(index))
        }
        #expect(try await notifyutil(group, ["--set", "test.shared=42"]).status == 0)
        #expect(try center.state(for: "test.shared") == 42)
        let token = try center.checkToken(for: "test.after.3")
        _ = token.check()
        #expect(try await notifyutil(group, ["--post", "test.after.3"]).status == 0)
        #expect(token.check())
    }

    @Test("a notification table cut to 0 bytes by another process under live centers: no SIGBUS, the table is put back (emptied), and names work again")
    func truncatedTable() async throws {
        let group = try TestGroup()
        let path = group.directory.path + "/notify.center"
        let center = try NotifyCenter(group: group.directory)
        try center.setState(7, for: "test.kept")
        let token = try center.checkToken(for: "test.kept")
        _ = token.check()
        let calls = Mutex(0)
        let before = try center.register("test.before") { calls.withLock { $0 += 1 } }
        defer { before.cancel() }
        // Cut by another process (truncate(1)): every page of this process's mapping is gone, and
        // a plain access to one would end the process with SIGBUS.
        func cut() async throws {
            let truncate = Process()
            truncate.executableURL = URL(fileURLWithPath: "/usr/bin/truncate")
            truncate.arguments = ["--size", "0", path]
            try truncate.run()
            truncate.waitUntilExit()
            // (Not checked to be 0 bytes now: this process's watcher thread may be looking at its
            // counters at this moment, and put the length back at once.)
            #expect(truncate.terminationStatus == 0)
        }
        try await cut()
        // This process's own accesses put the length back; what was cut reads as an empty table.
        #expect(try center.state(for: "test.kept") == 0)
        #expect(try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int == 64 + NotifyCenter.capacity * 128)
        try center.setState(9, for: "test.kept")
        #expect(try await notifyutil(group, ["--get", "test.kept"]).output == "9\n")
        // Cut again: a check token's look, and the watcher's thread woken to wait again (by a
        // suspend and a resume) while the file is short, each touch the mapping first.
        try await cut()
        _ = token.check()
        before.suspend()
        before.resume()
        try await Task.sleep(for: .milliseconds(100))
        #expect(try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int == 64 + NotifyCenter.capacity * 128)
        // A name registered now is delivered a post from another process.
        let after = Mutex(0)
        let registration = try center.register("test.after") { after.withLock { $0 += 1 } }
        defer { registration.cancel() }
        #expect(try await notifyutil(group, ["--post", "test.after"]).status == 0)
        try await withDeadline(seconds: 30, "the delivery after the cut") {
            while after.withLock({ $0 }) == 0 { try await Task.sleep(for: .milliseconds(10)) }
        }
        try await cut()
        // The registration is moved to its name's slot claimed again (with one call for the
        // move), within a period; a post then is delivered.
        #expect(try await notifyutil(group, ["--set", "test.after=1"]).status == 0)
        try await Task.sleep(for: .seconds(3))
        let settled = after.withLock { $0 }
        #expect(try await notifyutil(group, ["--post", "test.after"]).status == 0)
        try await withDeadline(seconds: 30, "a delivery after the second cut") {
            while after.withLock({ $0 }) == settled { try await Task.sleep(for: .milliseconds(10)) }
        }
    }

    @Test("a notify.center that is another user's file, or no regular file, is refused with invalidEndpoint: never mapped")
    func foreignTable() async throws {
        let group = try TestGroup()
        let path = group.directory.path + "/notify.center"
        if geteuid() == 0 {
            // Another user's table (as after the group directory was swapped for theirs): they
            // could cut it under this process's mapping, or read and write its names.
            #expect(FileManager.default.createFile(atPath: path, contents: Data(count: 64 + NotifyCenter.capacity * 128), attributes: [.posixPermissions: 0o666]))
            #expect(chown(path, 65534, 65534) == 0)
            await expectIPCError(.invalidEndpoint) { try NotifyCenter(group: group.directory) }
            #expect(unlink(path) == 0)
        }
        #expect(mkfifo(path, 0o600) == 0)
        await expectIPCError(.invalidEndpoint) { try NotifyCenter(group: group.directory) }
        #expect(unlink(path) == 0)
        _ = try NotifyCenter(group: group.directory)
    }

    @Test("a table lock kept by another holder: a new name fails with coordinationTimeout after the lock timeout, names already in the table go on")
    func tableLockKept() async throws {
        let group = try TestGroup()
        let path = group.directory.path + "/notify.center"
        let center = try NotifyCenter(group: group.directory)
        try center.setState(3, for: "test.known")
        // The lock held on a descriptor of this test's own: another open file description, as
        // another process's would be, so the center's own open of the file conflicts with it.
        let holder = open(path, O_RDWR | O_CLOEXEC)
        #expect(holder >= 0)
        defer { close(holder) }
        #expect(flock(holder, LOCK_EX | LOCK_NB) == 0)
        #expect(try center.state(for: "test.known") == 3)
        try center.post("test.known")
        let started = ContinuousClock.now
        await expectIPCError(.coordinationTimeout) { try center.post("test.new") }
        #expect(ContinuousClock.now - started >= NotifyCenter.tableLockTimeout)
        // Another process's call fails the same way, with a typed error, and ends.
        let other = try await notifyutil(group, ["--post", "test.new2"])
        #expect(other.status != 0)
        // Let go, a new name is claimed again.
        #expect(flock(holder, LOCK_UN) == 0)
        try center.post("test.new")
    }

    @Test("a table removed, or replaced by another file, under live registrations: they move to the file the path names now and are delivered its posts; this process posts there too")
    func replacedTable() async throws {
        let group = try TestGroup()
        let path = group.directory.path + "/notify.center"
        let center = try NotifyCenter(group: group.directory)
        let calls = Mutex(0)
        let registration = try center.register("test.moved") { calls.withLock { $0 += 1 } }
        defer { registration.cancel() }
        let token = try center.checkToken(for: "test.moved")
        _ = token.check()
        /// Waits until the handler has been called more than `count` times.
        func delivered(after count: Int, _ what: String) async throws {
            try await withDeadline(seconds: 30, what) {
                while calls.withLock({ $0 }) <= count { try await Task.sleep(for: .milliseconds(10)) }
            }
        }
        /// Lets the registration's move, and the call it makes, happen (within a period, a
        /// second), then returns the count of calls.
        func settled() async throws -> Int {
            try await Task.sleep(for: .seconds(3))
            return calls.withLock { $0 }
        }
        // Removed: a process that posts makes a new file, and posts there.
        #expect(unlink(path) == 0)
        #expect(try await notifyutil(group, ["--post", "test.moved"]).status == 0)
        try await delivered(after: 0, "the registration's call after the table was removed")
        // The registration now waits in the new file: a post there is delivered (counted from
        // after the move's own call).
        var before = try await settled()
        #expect(try await notifyutil(group, ["--post", "test.moved"]).status == 0)
        try await delivered(after: before, "a post to the new table")
        #expect(token.check())
        // Replaced by another file of the user (renamed over it).
        let other = group.directory.path + "/other.center"
        #expect(FileManager.default.createFile(atPath: other, contents: nil, attributes: [.posixPermissions: 0o600]))
        #expect(rename(other, path) == 0)
        #expect(try await notifyutil(group, ["--set", "test.moved=1"]).status == 0)
        before = try await settled()
        #expect(try await notifyutil(group, ["--post", "test.moved"]).status == 0)
        try await delivered(after: before, "a post to the table that replaced it")
        // Removed again: this process's center, which mapped the old file, posts into the file
        // the path names now, where a process started since waits.
        #expect(unlink(path) == 0)
        let waiter = Task { try await notifyutil(group, ["--wait", "test.moved", "--timeout", "30"]) }
        let poster = Task.detached {
            while !Task.isCancelled {
                try center.post("test.moved")
                try await Task.sleep(for: .milliseconds(100))
            }
        }
        #expect(try await waiter.value.status == 0)
        poster.cancel()
        _ = try? await poster.value
    }

    @Test("a cut table whose names are claimed again in each other's slots: registrations follow their names, none is left on another's slot")
    func cutTableReclaimedInOtherSlots() async throws {
        // Two names with one home slot (FNV-1a 32 mod 1024, WIRE-FORMAT section 6): the first
        // registered takes the slot, the second the next one.
        func home(_ name: String) -> UInt32 {
            var hash: UInt32 = 0x811c_9dc5
            for byte in name.utf8 { hash = (hash ^ UInt32(byte)) &* 0x0100_0193 }
            return (hash == 0 ? 1 : hash) % UInt32(NotifyCenter.capacity)
        }
        var seen: [UInt32: String] = [:]
        var pair: (String, String)?
        for index in 0..<100_000 where pair == nil {
            let name = "test.slot.\(index)"
            if let other = seen[home(name)] { pair = (other, name) } else { seen[home(name)] = name }
        }
        let (first, second) = try #require(pair)
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        let counts = Mutex([0, 0])
        let registrations = try [first, second].enumerated().map { index, name in
            try center.register(name) { counts.withLock { $0[index] += 1 } }
        }
        defer { registrations.forEach { $0.cancel() } }
        // Cut by another process, then claimed again in the other order, by another process: the
        // second name now has the home slot, the first the next one.
        let truncate = Process()
        truncate.executableURL = URL(fileURLWithPath: "/usr/bin/truncate")
        truncate.arguments = ["--size", "0", group.directory.path + "/notify.center"]
        try truncate.run()
        truncate.waitUntilExit()
        #expect(try await notifyutil(group, ["--set", "\(second)=1", "--set", "\(first)=1"]).status == 0)
        // The registrations move within a period, each with one call; then they are quiet.
        try await Task.sleep(for: .seconds(3))
        var before = counts.withLock { $0 }
        for (index, name) in [first, second].enumerated() {
            #expect(try await notifyutil(group, ["--post", name]).status == 0)
            let start = before[index]
            try await withDeadline(seconds: 30, "the delivery of \(name) to its registration") {
                while counts.withLock({ $0[index] }) == start { try await Task.sleep(for: .milliseconds(10)) }
            }
            try await Task.sleep(for: .milliseconds(300))
            let after = counts.withLock { $0 }
            #expect(after[1 - index] == before[1 - index], "a post of \(name) reached the other name's registration")
            before = after
        }
    }

    @Test("a check token reports posts without a handler")
    func checkToken() async throws {
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        let token = try center.checkToken(for: "test.check")
        #expect(token.check())
        #expect(!token.check())
        #expect(try await notifyutil(group, ["--post", "test.check", "--count", "3"]).status == 0)
        #expect(token.check())
        #expect(!token.check())
    }

    @Test("state values round-trip across processes", arguments: [UInt64.min, 1, 0xDEAD_BEEF_CAFE_F00D, UInt64.max])
    func stateRoundTrip(value: UInt64) async throws {
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        #expect(try await notifyutil(group, ["--set", "test.state=\(value)"]).status == 0)
        #expect(try center.state(for: "test.state") == value)
        try center.setState(value ^ 1, for: "test.other")
        #expect(try await notifyutil(group, ["--get", "test.other"]).output == "\(value ^ 1)\n")
    }

    @Test("posts while suspended are not delivered, and coalesce into one delivery on resume")
    func suspendAndResume() async throws {
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        let calls = Mutex(0)
        let registration = try center.register("test.suspend") { calls.withLock { $0 += 1 } }
        defer { registration.cancel() }
        registration.suspend()
        for _ in 0..<3 {
            #expect(try await notifyutil(group, ["--post", "test.suspend", "--count", "4"]).status == 0)
        }
        try await Task.sleep(for: .milliseconds(300))
        #expect(calls.withLock { $0 } == 0)
        registration.resume()
        try await withDeadline(seconds: 30, "the delivery on resume") {
            while calls.withLock({ $0 }) == 0 { try await Task.sleep(for: .milliseconds(10)) }
        }
        try await Task.sleep(for: .milliseconds(300))
        #expect(calls.withLock { $0 } == 1)
        // Resumed: a post is delivered again.
        #expect(try await notifyutil(group, ["--post", "test.suspend"]).status == 0)
        try await withDeadline(seconds: 30, "the delivery after resuming") {
            while calls.withLock({ $0 }) < 2 { try await Task.sleep(for: .milliseconds(10)) }
        }
        // Resuming with nothing posted delivers nothing; cancelling a suspended registration ends it.
        registration.suspend()
        registration.resume()
        registration.suspend()
        registration.cancel()
        try await Task.sleep(for: .milliseconds(200))
        #expect(calls.withLock { $0 } == 2)
    }

    @Test("posts from another process arrive as an AsyncSequence; cancel ends the loop")
    func asyncSequence() async throws {
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        let notifications = try center.notifications("test.sequence")
        let path = group.directory.path
        // The poster and the loop are child tasks, so that they run where the test does (the
        // suite's own threads); a detached task queued on the cooperative pool, behind the rest
        // of the process's tests (a full run here: 19 s before its first post).
        let received = try await withDeadline(seconds: 30, "three deliveries") {
            try await withThrowingTaskGroup(of: Int?.self) { tasks in
                // Until the loop has seen three: a post may coalesce with the one before.
                tasks.addTask {
                    while !Task.isCancelled {
                        _ = try? await PeerProcess.runToCompletion(["notifyutil", "--group", path, "--post", "test.sequence"])
                        try? await Task.sleep(for: .milliseconds(20))
                    }
                    return nil
                }
                tasks.addTask {
                    var count = 0
                    for await _ in notifications {
                        count += 1
                        if count == 3 { break }
                    }
                    return count
                }
                while let result = try await tasks.next() {
                    if let count = result {
                        tasks.cancelAll()
                        return count
                    }
                }
                return 0
            }
        }
        #expect(received == 3)
        // A loop waiting on the sequence ends when it is cancelled.
        try await withDeadline(seconds: 30, "the loop to end after cancel") {
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                tasks.addTask { for await _ in notifications {} }
                try await Task.sleep(for: .milliseconds(50))
                notifications.cancel()
                try await tasks.waitForAll()
            }
        }
    }

    @Test("posts from another process make a pollable descriptor readable until acknowledged; cancel closes it")
    func fileDescriptor() async throws {
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        let registration = try center.registerFileDescriptor("test.fd")
        func readable(within milliseconds: Int32) -> Bool {
            var entry = pollfd(fd: registration.descriptor.rawValue, events: Int16(POLLIN), revents: 0)
            return poll(&entry, 1, milliseconds) == 1 && entry.revents & Int16(POLLIN) != 0
        }
        #expect(!readable(within: 0))
        #expect(!registration.acknowledge())
        #expect(try await notifyutil(group, ["--post", "test.fd", "--count", "5"]).status == 0)
        #expect(readable(within: 30_000))
        // Let the five posts' deliveries land, then one acknowledgement takes them all.
        try await Task.sleep(for: .milliseconds(200))
        #expect(registration.acknowledge())
        #expect(!readable(within: 0))
        #expect(!registration.acknowledge())
        let descriptor = registration.descriptor
        registration.cancel()
        #expect(fcntl(descriptor.rawValue, F_GETFD) == -1 && errno == EBADF)
        registration.cancel()
    }

    @Test("names are bounded")
    func nameLimits() throws {
        let group = try TestGroup()
        let center = try NotifyCenter(group: group.directory)
        #expect(throws: IPCError.self) { try center.post("") }
        #expect(throws: IPCError.self) { try center.post(String(repeating: "n", count: NotifyCenter.maximumNameLength + 1)) }
        try center.post(String(repeating: "n", count: NotifyCenter.maximumNameLength))
    }
}
