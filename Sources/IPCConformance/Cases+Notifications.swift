import Foundation
import IPCCore
import Synchronization

/// Area 8: named notifications (notify(3)), for a subject with a ``NamedNotificationCenter``
/// (``ConformanceSubject/notifications``). Posts and state come from another process, through
/// the subject's `notifyutil`-style poster.
enum NotificationCases {
    static let all: [ConformanceCase] = [coalescing, neverMissed, state, cancel, suspend]

    static let coalescing = ConformanceCase(
        "8.1", "K posts in a row from another process give between 1 and K calls of a handler registered before them, never 0",
        requires: .notificationCenter
    ) { context in
        let center = try context.notificationCenter()
        var counts: [String] = []
        for posts in [1, 10, 1000] {
            let name = "conformance.coalescing.\(posts)"
            let calls = Mutex(0)
            let registration = try center.register(name) { calls.withLock { $0 += 1 } }
            defer { registration.cancel() }
            try await context.poster(["--post", name, "--count", String(posts)])
            guard await poll(within: .seconds(10), { calls.withLock { $0 } > 0 }) else {
                throw ConformanceFailure("\(posts) posts from another process gave no call within 10 s")
            }
            // Late calls would show here.
            try await Task.sleep(for: .milliseconds(200))
            let count = calls.withLock { $0 }
            try check(count <= posts, "\(posts) posts gave \(count) calls")
            counts.append("\(posts) → \(count)")
        }
        return .passed("posts → calls: " + counts.joined(separator: ", "))
    }

    static let neverMissed = ConformanceCase(
        "8.2", "A post made after register returns is never missed: 20 posts from another process, one at a time, each gives a call",
        requires: .notificationCenter
    ) { context in
        let center = try context.notificationCenter()
        let name = "conformance.never-missed"
        let calls = Mutex(0)
        let registration = try center.register(name) { calls.withLock { $0 += 1 } }
        defer { registration.cancel() }
        for post in 1...20 {
            try await context.poster(["--post", name])
            guard await poll(within: .seconds(10), { calls.withLock { $0 } >= post }) else {
                throw ConformanceFailure("post \(post) of 20 gave no call within 10 s (\(calls.withLock { $0 }) calls so far)")
            }
        }
        return .passed("20 posts, each called")
    }

    static let state = ConformanceCase(
        "8.3", "A name's 64-bit state set in one process reads the same in another, both ways, over the whole range",
        requires: .notificationCenter
    ) { context in
        let center = try context.notificationCenter()
        let values: [UInt64] = [0, 1, 0xDEAD_BEEF_CAFE_F00D, UInt64.max]
        for value in values {
            try await context.poster(["--set", "conformance.state.in=\(value)"])
            let read = try center.state("conformance.state.in")
            try check(read == value, "another process set \(value); this one reads \(read)")
            try center.setState(value ^ 1, "conformance.state.out")
            let output = try await context.poster(["--get", "conformance.state.out"])
            try check(output == "\(value ^ 1)\n", "this process set \(value ^ 1); another reads \(output.debugDescription)")
        }
        return .passed("\(values.count) values, including 0 and 2^64 - 1, read the same both ways")
    }

    static let cancel = ConformanceCase(
        "8.4", "After cancel returns the handler never runs again, also when cancel is called from inside the handler",
        requires: .notificationCenter
    ) { context in
        let center = try context.notificationCenter()
        let name = "conformance.cancel"
        let cancelledCalls = Mutex(0)
        let cancelled = try center.register(name) { cancelledCalls.withLock { $0 += 1 } }
        cancelled.cancel()
        let selfCancellingCalls = Mutex(0)
        let holder = Mutex<(any NamedNotificationRegistration)?>(nil)
        let selfCancelling = try center.register(name) {
            selfCancellingCalls.withLock { $0 += 1 }
            holder.withLock { $0 }?.cancel()
        }
        holder.withLock { $0 = selfCancelling }
        // A third registration shows that the posts arrive at all.
        let witnessCalls = Mutex(0)
        let witness = try center.register(name) { witnessCalls.withLock { $0 += 1 } }
        defer { witness.cancel() }
        for post in 1...5 {
            try await context.poster(["--post", name])
            guard await poll(within: .seconds(10), { witnessCalls.withLock { $0 } >= post }) else {
                throw ConformanceFailure("post \(post) did not reach a live registration within 10 s")
            }
        }
        try await Task.sleep(for: .milliseconds(200))
        try check(cancelledCalls.withLock { $0 } == 0, "a registration cancelled before the posts was called \(cancelledCalls.withLock { $0 }) times")
        try check(selfCancellingCalls.withLock { $0 } == 1, "a registration that cancelled itself in its first call was called \(selfCancellingCalls.withLock { $0 }) times")
        return .passed("5 posts: none reached the cancelled registration, one the self-cancelling one")
    }

    static let suspend = ConformanceCase(
        "8.5", "Posts while suspended give no call, then one call on resume; a resume with nothing posted gives none",
        requires: .notificationCenter
    ) { context in
        let center = try context.notificationCenter()
        let name = "conformance.suspend"
        let calls = Mutex(0)
        let registration = try center.register(name) { calls.withLock { $0 += 1 } }
        defer { registration.cancel() }
        registration.suspend()
        try await context.poster(["--post", name, "--count", "12"])
        try await Task.sleep(for: .milliseconds(300))
        try check(calls.withLock { $0 } == 0, "12 posts while suspended gave \(calls.withLock { $0 }) calls")
        registration.resume()
        guard await poll(within: .seconds(10), { calls.withLock { $0 } > 0 }) else {
            throw ConformanceFailure("resuming after 12 posts gave no call within 10 s")
        }
        try await Task.sleep(for: .milliseconds(300))
        try check(calls.withLock { $0 } == 1, "resuming after 12 posts gave \(calls.withLock { $0 }) calls, not 1")
        registration.suspend()
        registration.resume()
        try await Task.sleep(for: .milliseconds(300))
        try check(calls.withLock { $0 } == 1, "a resume with nothing posted gave a call")
        return .passed("12 posts while suspended: no call, then one on resume")
    }
}

extension CaseContext {
    /// The subject's center for this case's group.
    func notificationCenter() throws -> ErasedNotificationCenter {
        try subject.notifications!.open(group)
    }

    /// Runs the subject's poster for this case's group with `arguments` and returns what it printed.
    /// - Throws: ``ConformanceFailure`` if it exits with a status other than 0.
    @discardableResult
    func poster(_ arguments: [String]) async throws -> String {
        let access = subject.notifications!
        return try await runProgram(access.poster, access.posterArguments + ["--group", group.path] + arguments)
    }

    /// Runs `program` with `arguments` to its end, on a thread of its own, and returns what it
    /// printed.
    /// - Throws: ``ConformanceFailure`` if it exits with a status other than 0.
    func runProgram(_ program: URL, _ arguments: [String]) async throws -> String {
        let (status, output, errors) = try await runBlocking { () throws -> (Int32, String, String) in
            let process = Process()
            process.executableURL = program
            process.arguments = arguments
            let output = Pipe()
            let errors = Pipe()
            process.standardOutput = output
            process.standardError = errors
            try process.run()
            let printed = output.fileHandleForReading.readDataToEndOfFile()
            let complained = errors.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return (process.terminationStatus, String(decoding: printed, as: UTF8.self), String(decoding: complained, as: UTF8.self))
        }
        try check(status == 0, "\(program.lastPathComponent) \(arguments.joined(separator: " ")) exited with status \(status): \(errors)")
        return output
    }
}
