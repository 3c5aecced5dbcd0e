/// How a listener that exits when idle leaves its listening socket, so that no connection is
/// lost in the hand-over to the next instance.
public enum IdleHandOver: String, Sendable, CaseIterable {
    /// The launcher keeps its own reference to the socket and starts the service again on the
    /// next connection (systemd, launchd): a connection that arrives after the listener's last
    /// look waits in the socket's backlog for the next instance. The socket is closed, not shut
    /// down. Under a launcher that does not keep it, closing the last reference refuses new
    /// connects at once, but one that arrives between the last look and the close (the same
    /// turn of the event loop) is reset: use ``refuseNewConnections`` there.
    case launcherKeepsSocket = "keep-socket"
    /// The socket dies with the service (a launcher that `exec`s it, as
    /// `systemd-socket-activate` does): the listener first shuts the socket down for reading,
    /// so the kernel refuses new connects (`ECONNREFUSED`: ``IPCError/Code/endpointNotFound``,
    /// which `ConnectRetry` and `ServiceConnection` retry), then serves what it accepted until
    /// idle. Never use it under a launcher that keeps the socket: its socket would refuse from
    /// then on.
    case refuseNewConnections = "refuse"
}

/// A listener that can close itself when nobody uses it, without losing a connection that
/// arrives meanwhile.
public protocol IdleClosingListener: MessageListener {
    /// On the listener's event loop: accepts what waits in the socket's backlog; then, if no
    /// connection is open and no client is in the middle of connecting, closes the listener (as
    /// ``MessageListener/close()``, but a launcher's socket file stays) and returns `true`.
    /// Otherwise returns `false` and goes on serving. After a call with
    /// ``IdleHandOver/refuseNewConnections`` the listener accepts nothing new: call again until
    /// it returns `true`.
    func closeIfIdle(handOver: IdleHandOver) async -> Bool
}

/// A transport whose listener can take its listening socket from a launcher: the systemd
/// socket-activation protocol (`LISTEN_PID`, `LISTEN_FDS`, `LISTEN_FDNAMES`; `sd_listen_fds(3)`),
/// Linux's counterpart of launchd's on-demand services. The launcher listens on
/// ``activationSocketPath(for:)`` and starts the service on the first connection; the
/// service calls ``listenActivated(at:options:acceptFilter:)``.
///
/// unix-socket, notify and file-presenter: their endpoint (or rendezvous) is a socket.
/// message-port cannot: its endpoint is a POSIX message queue, which no launcher holds or
/// passes; it offers ``ServiceConnection``'s on-demand start from the client instead.
public protocol SocketActivatedTransport: MessageTransport where Listener: IdleClosingListener {
    /// The socket a launcher must listen on for `endpoint` (inside the endpoint's group
    /// directory, which must exist, owner-only, before the launcher binds).
    func activationSocketPath(for endpoint: Endpoint) -> String

    /// Listens on `endpoint` with the listening socket the launcher passed (the one bound to
    /// ``activationSocketPath(for:)``), taking the endpoint's lock as ``listen(at:options:acceptFilter:)``
    /// does. Closing the listener leaves the socket file to the launcher.
    /// - Throws: ``IPCError/Code/invalidEndpoint`` if the process was not socket-activated, the
    ///   variables are not for this process, or no passed descriptor is a listening `AF_UNIX`
    ///   stream socket bound to that path; otherwise what ``listen(at:options:acceptFilter:)``
    ///   throws.
    func listenActivated(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> Listener
}
