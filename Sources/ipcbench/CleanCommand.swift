import ArgumentParser
import IPCBenchKit
import IPCSystem

struct CleanCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "clean",
        abstract: "Remove the message queues that killed ipcbench processes left behind.",
        discussion: """
        POSIX message queues outlive the processes that made them. A message-port server or an \
        mqueue floor that was killed (SIGKILL, a crash, an OOM kill) leaves its queues in \
        /dev/mqueue, where they count against this user's RLIMIT_MSGQUEUE (`ulimit -q`, 800 KiB \
        by default) until removed; once it is used up, every message-port connect of this user \
        fails. This removes this user's queues named /ipcb.… or ….floor-… that no live process \
        holds open (found through /proc/<pid>/fd), and prints each one. Queues of live \
        processes and other users' queues are never touched. Message ports and the floors do \
        the same on their own when a create meets the quota.
        """
    )

    @Flag(help: "List what would be removed, remove nothing.")
    var dryRun = false

    func run() throws {
        let found = dryRun
            ? MessageQueue.abandoned(matching: LeftoverQueues.madeByIPCBench)
            : MessageQueue.removeAbandoned(matching: LeftoverQueues.madeByIPCBench)
        for name in found { print((dryRun ? "would remove " : "removed ") + name) }
        print("\(found.count) abandoned message queue\(found.count == 1 ? "" : "s") \(dryRun ? "found" : "removed")")
    }
}
