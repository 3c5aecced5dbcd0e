import CIPCShims
@testable import FilePresenterTransport
@testable import IPCFileCoordination
import Foundation
import Glibc
import Synchronization
import IPCCore
import IPCTestSupport
import Testing

/// Journals on their own: appending, reading from the consumed offset, torn tails, compaction.
@Suite("File presenter: journal")
struct JournalTests {
    private let capacity = 64 * 1024
    /// A record of ``frame(_:size:)`` with the default size takes this many bytes in the journal.
    private let recordLength = RecordHeader.length + 20 + 1000
    private let sender = RecordHeader(kind: .frame, sender: SenderID(pid: 1, serial: 2))

    private func frame(_ index: Int, size: Int = 1000) -> Frame {
        Frame(kind: .message, msgid: UInt32(index), payload: [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: size))
    }

    private func makeJournal(_ group: borrowing TestGroup, capacity: Int? = nil) throws -> (path: String, reader: JournalReader, appender: JournalAppender) {
        let path = group.directory.path + "/j.inbox"
        let reader = JournalReader(try Journal.create(at: path, in: group.directory, capacity: capacity ?? self.capacity), maximumPayloadLength: 1 << 20)
        return (path, reader, JournalAppender(try JournalFile(CoordinatedFile(path: path, create: false), timeout: .seconds(1))))
    }

    private func readAll(_ reader: JournalReader) throws -> [Frame] {
        var frames: [Frame] = []
        try reader.readCommitted(keepWaiting: { false }) { record in
            if case .frame(_, let frame, _) = record { frames.append(frame) }
            return true
        }
        return frames
    }

    private func committedEnd(_ path: String) throws -> Int {
        try FileCoordinator().coordinate(readingItemAt: path, timeout: .seconds(1)) { try Journal.readHeader($0) }.committedEnd
    }

    @Test("records are read once, in order, from where the last read stopped; a torn tail is not read and is written over")
    func readingFromTheConsumedOffset() async throws {
        let group = try TestGroup()
        let (path, reader, appender) = try makeJournal(group)
        try appender.append(sender, frame: frame(0), timeout: .seconds(1))
        try appender.append(sender, frame: frame(1), timeout: .seconds(1))
        #expect(try readAll(reader) == [frame(0), frame(1)])
        #expect(try readAll(reader) == [])

        // A writer that died mid-record: bytes past the committed end, which stays put.
        let end = try committedEnd(path)
        try FileCoordinator().coordinate(writingItemAt: path, timeout: .seconds(1)) { access in
            try access.write(sender.bytes + [0x49, 0x50, 1, 1, 0, 0, 0, 9], at: end)
        }
        #expect(try readAll(reader) == [])
        try appender.append(sender, frame: frame(2, size: 3), timeout: .seconds(1))
        #expect(try readAll(reader) == [frame(2, size: 3)])
        #expect(try committedEnd(path) == end + RecordHeader.length + 20 + 3)
    }

    @Test("a lender's answer decides each message's record: taken is lent (never copied), declined comes back offered, not offered comes back to be offered; requests are never lent")
    func lendingOutcomes() async throws {
        let group = try TestGroup()
        let (_, reader, appender) = try makeJournal(group)
        for index in 0..<3 { try appender.append(sender, frame: frame(index, size: 64), timeout: .seconds(1)) }
        let request = Frame(kind: .request, msgid: 9, correlation: 5, payload: [1, 2, 3])
        try appender.append(sender, frame: request, timeout: .seconds(1))
        var lentPayloads: [[UInt8]] = []
        var records: [String] = []
        try reader.readCommitted(keepWaiting: { false }, lend: { record, header, payload in
            #expect(record.sender == sender.sender)
            guard header.msgid < 3 else {
                Issue.record("a \(header.kind) was lent")
                return .notOffered
            }
            lentPayloads.append(Array(payload))
            return [JournalLending.taken, .declined, .notOffered][Int(header.msgid)]
        }) { record in
            switch record {
            case .lent: records.append("lent")
            case .frame(_, let frame, let offered): records.append("\(frame.msgid) \(offered ? "offered" : "not offered")")
            default: records.append("other")
            }
            return true
        }
        #expect(lentPayloads == (0..<3).map { frame($0, size: 64).payload })
        #expect(records == ["lent", "1 offered", "2 not offered", "9 not offered"])
    }

    @Test("a reader that stops gets nothing more; the rest come first in the next reads, then what was appended since, each once")
    func stoppingKeepsTheRest() async throws {
        let group = try TestGroup()
        let (_, reader, appender) = try makeJournal(group)
        for index in 0..<5 { try appender.append(sender, frame: frame(index), timeout: .seconds(1)) }
        var read: [Frame] = []
        // Stop after each second record, as a reader whose application buffer fills does.
        func readTwo() throws {
            var taken = 0
            try reader.readCommitted(keepWaiting: { false }) { record in
                if case .frame(_, let frame, _) = record { read.append(frame) }
                taken += 1
                return taken < 2
            }
        }
        try readTwo()
        #expect(read == [frame(0), frame(1)])
        try appender.append(sender, frame: frame(5), timeout: .seconds(1))
        try readTwo()
        #expect(read == (0..<4).map { frame($0) }, "the kept records come before anything new")
        // One kept record is left, and handed out; the next read goes on to what was appended since.
        try readTwo()
        #expect(read == (0..<5).map { frame($0) })
        try readTwo()
        #expect(read == (0..<6).map { frame($0) })
        #expect(try readAll(reader) == [])
    }

    @Test("a forged committed end is a typed error for the reader and the writer, never an arithmetic trap")
    func forgedCommittedEnd() async throws {
        let group = try TestGroup()
        let (path, reader, appender) = try makeJournal(group)
        let header = JournalHeader(ownerPID: 1, capacity: capacity)
        for forged in [UInt64(1) << 63 - 16, UInt64(Int.max), UInt64(header.maximumCommittedEnd) + 1] {
            try FileCoordinator().coordinate(writingItemAt: path, timeout: .seconds(1)) { access in
                try access.write(withUnsafeBytes(of: forged.bigEndian, Array.init), at: JournalHeader.committedEndOffset)
            }
            await expectIPCError(.malformedFrame) { try appender.append(sender, frame: frame(0), timeout: .seconds(1)) }
            await expectIPCError(.malformedFrame) { _ = try readAll(reader) }
        }
        // The admission rule itself, at the extremes (it added these once, and trapped).
        #expect(!header.admits(Int.max, committedEnd: JournalHeader.length + capacity))
        #expect(!header.admits(64, committedEnd: Int.max))
        #expect(header.admits(Int.max - JournalHeader.length, committedEnd: JournalHeader.length))
    }

    @Test("once the threshold is consumed the journal is compacted, and records appended meanwhile arrive")
    func compaction() async throws {
        let group = try TestGroup()
        let (path, reader, appender) = try makeJournal(group)
        let threshold = JournalHeader.compactionThreshold(capacity: capacity)
        let perRound = threshold / recordLength + 1
        var next = 0
        var read: [Frame] = []
        for _ in 0..<20 {
            for _ in 0..<perRound {
                try appender.append(sender, frame: frame(next), timeout: .seconds(1))
                next += 1
            }
            // Three more while the reader handles the first record: the read compacted the
            // journal already (the records are in memory), so they land at its start.
            var appendedMeanwhile = false
            try reader.readCommitted(keepWaiting: { false }) { record in
                if case .frame(_, let frame, _) = record { read.append(frame) }
                guard !appendedMeanwhile else { return true }
                appendedMeanwhile = true
                for _ in 0..<3 {
                    try? appender.append(sender, frame: self.frame(next), timeout: .seconds(1))
                    next += 1
                }
                return true
            }
            #expect(try committedEnd(path) == JournalHeader.length + 3 * recordLength, "compaction moved the committed end back to the start")
            let size = try #require(FileManager.default.attributesOfItem(atPath: path)[.size] as? Int)
            #expect(size <= JournalHeader.length + threshold)
            read += try readAll(reader)
        }
        #expect(read.map(\.msgid) == (0..<next).map { UInt32($0) })
        #expect(read == (0..<next).map { frame($0) })
    }

    /// A writer waiting for the room a compaction makes writes nothing meanwhile, so no change of
    /// the file brings the reader back: a compaction a lock put off must be done at the next
    /// fill, even one that finds nothing new (its owner calls it from a timer). Before, it was
    /// tried only after a read that found records, and a stream stalled about one run in ten.
    @Test("a compaction a held lock put off is done at the next fill, even one that finds nothing new")
    func compactionPutOffByALock() async throws {
        let group = try TestGroup()
        let (path, reader, appender) = try makeJournal(group)
        let threshold = JournalHeader.compactionThreshold(capacity: capacity)
        var appended = 0
        while appended * recordLength < threshold + recordLength {
            try appender.append(sender, frame: frame(appended), timeout: .seconds(1))
            appended += 1
        }
        // Another descriptor's shared lock: the reader's read goes on, its compaction (which
        // takes the lock exclusively) cannot.
        let other = try CoordinatedFile(path: path, create: false)
        #expect(try other.tryLock(exclusive: false))
        #expect(try reader.fill() == appended * recordLength)
        #expect(reader.compactionOwed)
        other.unlock()
        var handedOut = 0
        while try reader.next(offering: false, lend: { _, _, _ in .declined }) != nil { handedOut += 1 }
        #expect(handedOut == appended)
        #expect(try committedEnd(path) == JournalHeader.length + appended * recordLength)
        #expect(try reader.fill() == 0)
        #expect(!reader.compactionOwed)
        #expect(try committedEnd(path) == JournalHeader.length, "the put-off compaction moved the committed end back to the start")
        try appender.append(sender, frame: frame(appended), timeout: .seconds(1))
        #expect(try readAll(reader) == [frame(appended)])
    }

    @Test("a writer waits while the journal is over capacity, and goes on once the reader compacts")
    func capacityAndLargeRecords() async throws {
        let group = try TestGroup()
        let (_, reader, appender) = try makeJournal(group)
        var appended = 0
        await expectIPCError(.sendTimeout) {
            while appended < 1000 {
                try appender.append(sender, frame: frame(appended), timeout: .milliseconds(100))
                appended += 1
            }
        }
        #expect(appended * recordLength <= capacity)
        #expect(appended * recordLength > capacity - recordLength)
        #expect(try readAll(reader).count == appended)
        try appender.append(sender, frame: frame(0), timeout: .milliseconds(100))
        #expect(try readAll(reader) == [frame(0)])
        // One record larger than the whole capacity still goes into a journal within the threshold.
        try appender.append(sender, frame: frame(1, size: 2 * capacity), timeout: .seconds(1))
        #expect(try readAll(reader) == [frame(1, size: 2 * capacity)])
    }

    /// 64 B records (gathered behind their headers), and records whose payload is above the
    /// gather limit and below the mapped limit (head and payload copied apart), in a journal
    /// whose window (half its capacity, up to 1 MiB) holds them all.
    @Test(
        "a record that fits the mapped window wakes the reader once, with the record committed and the lock free, even when the reader preempts the writer",
        arguments: [(size: 64, appends: 200), (size: 20_000, appends: 40)]
    )
    func wakesAfterCommit(size: Int, appends: Int) async throws {
        let group = try TestGroup()
        let (path, _, appender) = try makeJournal(group, capacity: 4 << 20)
        let watch = inotify_init1(CInt(IN_CLOEXEC))
        try #require(watch >= 0)
        defer { close(watch) }
        try #require(inotify_add_watch(watch, path, UInt32(IN_MODIFY)) >= 0)
        let probe = try CoordinatedFile(path: path, create: false)
        let length = RecordHeader.length + 20 + size
        // Both threads on one CPU: the woken reader then runs before the writer goes on, as a
        // journal's reader does against a writer on its CPU, and sees what the writer had done
        // when the wake-up came.
        let wakes = Mutex<[(events: Int, lockFree: Bool, end: Int)]>([])
        let observed = DispatchSemaphore(value: 0)
        let writerDone = DispatchSemaphore(value: 0)
        let observer = Thread {
            var cpu: CInt = 0
            _ = ipc_set_affinity(0, &cpu, 1)
            for _ in 0..<appends {
                var poller = pollfd(fd: watch, events: Int16(POLLIN), revents: 0)
                guard poll(&poller, 1, 10_000) == 1 else { break }
                let lockFree = (try? probe.tryLock(exclusive: false)) == true
                if lockFree { probe.unlock() }
                var header = [UInt8](repeating: 0, count: JournalHeader.length)
                let got = pread(probe.descriptor, &header, header.count, 0)
                let end = got == header.count ? Int(header[16..<24].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }) : -1
                var events = [UInt8](repeating: 0, count: 4096)
                let read = Glibc.read(watch, &events, events.count)
                wakes.withLock { $0.append((read / MemoryLayout<inotify_event>.size, lockFree, end)) }
                observed.signal()
            }
        }
        let writer = Thread {
            var cpu: CInt = 0
            _ = ipc_set_affinity(0, &cpu, 1)
            for index in 0..<appends {
                guard (try? appender.append(sender, frame: frame(index, size: size), timeout: .seconds(10))) != nil,
                    observed.wait(timeout: .now() + 10) == .success
                else { break }
            }
            writerDone.signal()
        }
        observer.start()
        writer.start()
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                _ = writerDone.wait(timeout: .now() + 60)
                continuation.resume()
            }
        }
        let seen = wakes.withLock { $0 }
        #expect(seen.count == appends)
        for (index, wake) in seen.enumerated() {
            #expect(wake.events == 1, "append \(index): \(wake.events) events")
            #expect(wake.lockFree, "append \(index): the writer held the lock when the reader woke")
            #expect(wake.end == JournalHeader.length + (index + 1) * length, "append \(index): the committed end was \(wake.end) when the reader woke")
        }
    }

    @Test("a journal its reader does not keep at the mapped length (as a reader may that follows only the rules before it) still gets every record whole")
    func shortJournal() async throws {
        let group = try TestGroup()
        let path = group.directory.path + "/short.inbox"
        // Only the header, as Journal.create made it before it kept the file long.
        let file = try CoordinatedFile(path: path)
        try FileCoordinator().coordinate(writingItemAt: path, timeout: .seconds(1)) { access in
            try access.write(JournalHeader(ownerPID: getpid(), capacity: capacity).bytes, at: 0)
        }
        let reader = JournalReader(try JournalFile(file, timeout: .seconds(1)), maximumPayloadLength: 1 << 20)
        let appender = JournalAppender(try JournalFile(CoordinatedFile(path: path, create: false), timeout: .seconds(1)))
        // Sizes that end records in the middle of a page, on its boundary and across it.
        let sizes = [0, 1, 64, 4000, 4096 - 24 - 32, 5000, 12_000, 64]
        for (index, size) in sizes.enumerated() {
            try appender.append(sender, frame: frame(index, size: size), timeout: .seconds(1))
        }
        #expect(try readAll(reader) == sizes.enumerated().map { frame($0, size: $1) })
        let fileLength = try #require(FileManager.default.attributesOfItem(atPath: path)[.size] as? Int)
        #expect(try committedEnd(path) <= fileLength)
    }

    @Test("a journal cut shorter than its reader keeps it, under the writer's mapping, makes the next read a typed error, never a crash")
    func journalCutUnderTheWindow() async throws {
        let group = try TestGroup()
        let (path, reader, appender) = try makeJournal(group)
        try appender.append(sender, frame: frame(0, size: 64), timeout: .seconds(1))
        #expect(try readAll(reader) == [frame(0, size: 64)])
        // Cut inside the page the next record goes to: a copy there does not fault, and the
        // part past the new end is not in the file, so the committed end is past it.
        let end = try committedEnd(path)
        #expect(truncate(path, off_t(end + 10)) == 0)
        try appender.append(sender, frame: frame(1, size: 64), timeout: .seconds(1))
        await expectIPCError(.truncatedFrame) { _ = try readAll(reader) }
        // Cut to nothing: the writer's copy faults, and the fault is caught.
        #expect(truncate(path, 0) == 0)
        await expectIPCError(.truncatedFrame) { try appender.append(sender, frame: frame(2, size: 64), timeout: .seconds(1)) }
    }
}

extension JournalReader {
    /// What a reader on the loop does, in one call: ``fill()`` (one try of the lock; `keepWaiting`
    /// is asked whether to try again while a writer holds it), then the records in order, until
    /// `handle` asks to stop; the rest are handed out first by the next call.
    fileprivate func readCommitted(keepWaiting: () -> Bool, lend: JournalLender? = nil, _ handle: (JournalRecord) throws -> Bool) throws {
        while try fill() == nil {
            guard keepWaiting() else { return }
        }
        while let record = try next(offering: lend != nil, lend: lend ?? { _, _, _ in .notOffered }) {
            guard try handle(record) else { return }
        }
    }
}
