public import Foundation
public import IPCCore
public import IPCSecureCoding

/// What the suite runs against: a transport, how to start peer processes that speak it, and
/// the optional extras some areas need.
public struct ConformanceSubject: Sendable {
    /// The name reports show, by default the transport's ``MessageTransport/name``.
    public var name: String
    public var capabilities: TransportCapabilities
    /// Starts peer processes running ``ConformancePeer`` over the same transport.
    public var peers: any ConformancePeerLauncher
    /// A raw byte stream to the transport's endpoints, for the framing cases (area 2). `nil`
    /// for transports that carry no byte stream: those cases are then not applicable.
    public var rawStream: RawStreamAccess?
    /// The codecs the secure-decoding cases (area 3) carry across the transport.
    public var payloadCodecs: [any PayloadCodec]
    /// Makes the endpoint called `name` in a case's group directory. By default the name is
    /// scoped to the group (`<group identifier>.<name>`), which every transport accepts and
    /// transports with app-group scoped names (message ports) require.
    public var makeEndpoint: @Sendable (_ group: GroupDirectory, _ name: String) throws -> Endpoint
    /// Where each case's private group directory is created.
    public var temporaryDirectory: String
    /// Removes what processes killed by a case left outside its group directory that no
    /// transport can reclaim (for example a POSIX queue a client created just before it was
    /// killed, which no listener ever heard of). Runs after each case, once its peers are gone.
    public var removeLeftovers: (@Sendable (GroupDirectory) -> Void)?
    /// The subject's named-notification center, for the notification cases (area 8). `nil`
    /// for a subject without one: those cases are then not applicable.
    public var notifications: NotificationCenterAccess?
    /// The subject's file presenters and coordinators, for the file-coordination cases
    /// (area 9). `nil` for a subject without them: those cases are then not applicable.
    public var fileCoordination: FileCoordinationAccess?
    /// The subject's wormhole mailbox, for the wormhole cases (area 10). `nil` for a subject
    /// without one: those cases are then not applicable.
    public var wormhole: WormholeAccess?

    let transport: ErasedTransport

    /// - Parameters:
    ///   - transport: the transport under test, in this process.
    ///   - peers: starts peers in other processes; see ``ExecutablePeerLauncher``.
    ///   - rawStream: for stream transports, how to reach an endpoint's byte stream.
    ///   - name: the name reports show; the transport's name by default.
    public init(
        _ transport: some MessageTransport,
        peers: any ConformancePeerLauncher,
        rawStream: RawStreamAccess? = nil,
        name: String? = nil
    ) {
        self.transport = ErasedTransport(transport)
        self.name = name ?? transport.name
        self.capabilities = transport.capabilities
        self.peers = peers
        self.rawStream = rawStream
        self.payloadCodecs = [.json, .propertyList, .keyedArchive, .binaryCodable]
        self.makeEndpoint = { group, name in try Endpoint(group: group, name: group.identifier + "." + name) }
        self.temporaryDirectory = NSTemporaryDirectory()
    }
}

/// Options for one run of the suite.
public struct ConformanceOptions: Sendable {
    /// Id prefixes of the cases to run (see ``ConformanceCase/isSelected(by:)``); empty runs all.
    public var cases: [String]
    /// Id prefixes of cases expected to fail: such a case that fails is graded
    /// ``ConformanceResult/Grade/expectedFailure``, and one that passes
    /// ``ConformanceResult/Grade/unexpectedPass``.
    public var expectedFailures: [String]
    /// How soon after a peer's death (or a local invalidation) the survivor must report
    /// invalidation. Generous against scheduling noise; the measured time is recorded.
    public var invalidationDeadline: Duration
    /// Payload sizes are sampled up to the declared maximum or this, whichever is smaller.
    public var largestSampledPayload: Int
    /// A case still running after this long fails.
    public var caseTimeLimit: Duration
    /// Called after each case, for progress output.
    public var onResult: (@Sendable (ConformanceResult) -> Void)?

    public init(
        cases: [String] = [],
        expectedFailures: [String] = [],
        invalidationDeadline: Duration = .seconds(2),
        largestSampledPayload: Int = 16 << 20,
        caseTimeLimit: Duration = .seconds(120),
        onResult: (@Sendable (ConformanceResult) -> Void)? = nil
    ) {
        self.cases = cases
        self.expectedFailures = expectedFailures
        self.invalidationDeadline = invalidationDeadline
        self.largestSampledPayload = largestSampledPayload
        self.caseTimeLimit = caseTimeLimit
        self.onResult = onResult
    }

    /// Reads an expected-failures file: one id prefix per line; `#` starts a comment.
    /// - Throws: what reading the file throws.
    public static func expectedFailures(fromFile path: String) throws -> [String] {
        try String(contentsOfFile: path, encoding: .utf8)
            .split(whereSeparator: \.isNewline)
            .compactMap { line in
                let entry = line.prefix { $0 != "#" }.trimmingCharacters(in: .whitespaces)
                return entry.isEmpty ? nil : entry
            }
    }
}

/// How the notification cases (area 8) reach a ``NamedNotificationCenter``: the center in this
/// process, and a program that posts and reads state from another process.
///
/// The program keeps `notifyutil`'s contract (`ipcbench notifyutil` does): the suite runs it with
/// ``posterArguments``, then `--group DIR`, then one of `--post NAME --count K` (K posts in a
/// row), `--set NAME=VALUE` or `--get NAME` (prints the value and a newline); exit status 0 on
/// success.
public struct NotificationCenterAccess: Sendable {
    public var poster: URL
    public var posterArguments: [String]
    let open: @Sendable (GroupDirectory) throws -> ErasedNotificationCenter

    /// - Parameter open: opens the center of a group directory in this process.
    public init<Center: NamedNotificationCenter>(poster: URL, posterArguments: [String] = [], open: @escaping @Sendable (GroupDirectory) throws -> Center) {
        self.poster = poster
        self.posterArguments = posterArguments
        self.open = { group in ErasedNotificationCenter(try open(group)) }
    }
}

/// A ``NamedNotificationCenter`` of any type, for the cases.
struct ErasedNotificationCenter: Sendable {
    let post: @Sendable (String) throws -> Void
    let setState: @Sendable (UInt64, String) throws -> Void
    let state: @Sendable (String) throws -> UInt64
    let register: @Sendable (String, @escaping @Sendable () -> Void) throws -> any NamedNotificationRegistration

    init<Center: NamedNotificationCenter>(_ center: Center) {
        post = { try center.post($0) }
        setState = { try center.setState($0, for: $1) }
        state = { try center.state(for: $0) }
        register = { try center.register($0, handler: $1) }
    }
}
