/// Named, payload-less notifications shared by the processes of a group: the notify(3) model, as
/// a protocol so that the conformance suite (area 8) can check any implementation, not only
/// `NotifyCenter`.
///
/// The contract the suite checks: K posts in a row from another process give between 1 and K
/// calls of a handler registered before them, never 0 (posts may coalesce, never vanish); a
/// post made after ``register(_:handler:)`` returns is never missed; the 64-bit state of a name
/// reads the same in every process; after ``NamedNotificationRegistration/cancel()`` returns the
/// handler is not running and never runs again (also when cancelled from inside the handler);
/// posts while suspended give one call on resume.
public protocol NamedNotificationCenter: Sendable {
    associatedtype Registration: NamedNotificationRegistration

    /// Posts `name`: every registration for it, in every process of the group, is called.
    func post(_ name: String) throws

    /// Sets the 64-bit state value of `name`, which every process of the group reads.
    func setState(_ value: UInt64, for name: String) throws

    /// The 64-bit state value of `name` (0 until set).
    func state(for name: String) throws -> UInt64

    /// Calls `handler` after posts of `name` (posts that arrive together may give one call).
    func register(_ name: String, handler: @escaping @Sendable () -> Void) throws -> Registration
}

/// A handler registered with a ``NamedNotificationCenter``.
public protocol NamedNotificationRegistration: AnyObject, Sendable {
    /// After it returns, the handler is not running and never runs again.
    func cancel()
    /// Stops calls until ``resume()``; posts meanwhile are kept.
    func suspend()
    /// Resumes calls: one call if the name was posted while suspended.
    func resume()
}

/// MMWormhole's mailbox between the processes of a group, as a protocol so that the
/// conformance suite (area 10) can check any implementation, not only `Wormhole`.
///
/// The contract the suite checks: the last message passed under an identifier is read, whole
/// and unchanged, by any process of the group, also one started after its sender exited or
/// was killed; a read never returns part of a message or a mix of two; listeners in other
/// processes are given the messages passed, and a stream ends at ``stopListening(forIdentifier:)``;
/// clearing removes what is stored, as every process sees.
public protocol WormholeMailbox: Sendable {
    /// Stores `payload` as the message of `identifier` and tells its listeners.
    func passMessage(_ payload: [UInt8], identifier: String) throws
    /// The last message stored under `identifier`, or `nil`.
    func message(withIdentifier identifier: String) throws -> [UInt8]?
    /// Removes the message of `identifier`.
    func clearMessageContents(forIdentifier identifier: String) throws
    /// Removes every message.
    func clearAllMessageContents() throws
    /// The messages passed under `identifier` from now on (a listener late to read may see only
    /// the latest, as MMWormhole's do).
    func listen(forIdentifier identifier: String) throws -> AsyncStream<[UInt8]>
    /// Ends the streams of `identifier`'s listeners in this process.
    func stopListening(forIdentifier identifier: String)
}
