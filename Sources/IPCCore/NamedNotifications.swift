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
