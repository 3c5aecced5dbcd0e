import Foundation
public import IPCCore

/// The floor peer's side, run by `ipcbench floor-peer`: creates the responder end of a floor
/// channel, prints `READY <pid>` as `ipcbench peer` does, and echoes until the initiator says
/// goodbye. When standard input closes (the parent went away) it removes its names and exits,
/// so an orphaned floor peer never lingers and leaves nothing behind.
public struct FloorPeerService: Sendable {
    public var mechanism: FloorMechanism
    public var group: GroupDirectory
    public var maximumPayload: Int

    public init(mechanism: FloorMechanism, group: GroupDirectory, maximumPayload: Int = NativeFloor.defaultMaximumPayload) {
        self.mechanism = mechanism
        self.group = group
        self.maximumPayload = maximumPayload
    }

    /// Serves until the initiator says goodbye (returns) or standard input closes (exits).
    /// - Throws: ``IPCError`` if the channel cannot be created, or a request is malformed.
    public func run() throws {
        let responder = try FloorResponder(mechanism: mechanism, directory: group.path, maximumPayload: maximumPayload)
        FileHandle.standardOutput.write(Data("READY \(getpid())\n".utf8))
        Thread.detachNewThread {
            var byte: UInt8 = 0
            while read(STDIN_FILENO, &byte, 1) > 0 {}
            responder.removeNames()
            exit(0)
        }
        // On this thread, so the echo loop runs on the thread the process was pinned with.
        try responder.serve()
    }
}
