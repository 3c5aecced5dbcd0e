import IPCCore
import IPCFraming
/// One behaviour the suite checks: a stable id grouped by area (`"2.3"`, `"6.5.1"`), a one-line
/// statement, what a transport must declare for the case to apply, and the check itself.
///
/// Ids never change meaning once published: a case that is withdrawn leaves its id unused, so
/// expected-failure lists and CI history stay valid across releases.
public struct ConformanceCase: Sendable, Identifiable {
    public let id: String
    /// What a conforming transport does, in one line.
    public let statement: String
    /// What the subject must declare for the case to apply.
    public let requirements: [ConformanceRequirement]
    let body: @Sendable (CaseContext) async throws -> CaseOutcome

    init(
        _ id: String,
        _ statement: String,
        requires requirements: ConformanceRequirement...,
        body: @escaping @Sendable (CaseContext) async throws -> CaseOutcome
    ) {
        self.id = id
        self.statement = statement
        self.requirements = requirements
        self.body = body
    }

    /// The area the case belongs to: the first component of its id.
    public var area: ConformanceArea {
        ConformanceArea(rawValue: Int(id.prefix { $0 != "." }) ?? 0) ?? .delivery
    }

    /// Whether `prefix` selects this case: `"6"` selects `6.1` and `6.5.2` but not `16.1`;
    /// `"6.5"` selects `6.5`, `6.5.1` and `6.5.2`.
    public func isSelected(by prefix: String) -> Bool {
        let prefix = prefix.hasSuffix(".") ? String(prefix.dropLast()) : prefix
        return id == prefix || id.hasPrefix(prefix + ".")
    }
}

/// The areas of the suite, numbered as the first component of their cases' ids.
public enum ConformanceArea: Int, Sendable, CaseIterable, Codable, CustomStringConvertible {
    case delivery = 1
    case framing = 2
    case secureDecoding = 3
    case requestReply = 4
    case lifecycle = 5
    case peerDeath = 6
    case service = 7
    case notifications = 8
    case fileCoordination = 9
    case wormhole = 10
    case serving = 11

    public var description: String {
        switch self {
        case .delivery: "Delivery"
        case .framing: "Framing"
        case .secureDecoding: "Secure decoding"
        case .requestReply: "Request/reply"
        case .lifecycle: "Lifecycle"
        case .peerDeath: "Peer death"
        case .service: "Service semantics"
        case .notifications: "Named notifications"
        case .fileCoordination: "File coordination"
        case .wormhole: "Wormhole mailbox"
        case .serving: "Serving"
        }
    }
}

/// Something a case needs the subject to declare. A subject that does not is graded
/// ``ConformanceResult/Grade/notApplicable``, with ``description`` as the reason.
public struct ConformanceRequirement: Sendable, CustomStringConvertible {
    public let description: String
    let isMet: @Sendable (ConformanceSubject) -> Bool

    static let preservesOrder = ConformanceRequirement(description: "the transport does not declare preservesOrder") {
        $0.capabilities.preservesOrder
    }
    static let requestReply = ConformanceRequirement(description: "the transport does not declare supportsRequestReply") {
        $0.capabilities.supportsRequestReply
    }
    static let broadcast = ConformanceRequirement(description: "the transport does not declare supportsBroadcast") {
        $0.capabilities.supportsBroadcast
    }
    static let rawByteStream = ConformanceRequirement(description: "the subject offers no raw byte stream to its endpoints (not a stream transport)") {
        $0.rawStream != nil
    }
    static let acceptFilter = ConformanceRequirement(description: "the transport does not declare supportsAcceptFilter") {
        $0.capabilities.supportsAcceptFilter
    }
    static let connectionLimit = ConformanceRequirement(description: "the transport does not declare supportsConnectionLimit") {
        $0.capabilities.supportsConnectionLimit
    }
    static let llbsdFraming = ConformanceRequirement(description: "the subject's raw byte stream does not speak the LLBSD-compatible framing (llbsd)") {
        $0.rawStream?.framing == .llbsd
    }
    static let payloadCodecs = ConformanceRequirement(description: "the subject names no payload codecs") {
        !$0.payloadCodecs.isEmpty
    }
    static let peerDeathDetection = ConformanceRequirement(description: "the transport declares that it cannot detect peer death") {
        $0.capabilities.peerDeathDetection != .none
    }
    static let notificationCenter = ConformanceRequirement(description: "the subject offers no named-notification center") {
        $0.notifications != nil
    }
    static let fileCoordination = ConformanceRequirement(description: "the subject offers no file coordination (presenters and coordinators)") {
        $0.fileCoordination != nil
    }
    static let wormhole = ConformanceRequirement(description: "the subject offers no wormhole mailbox") {
        $0.wormhole != nil
    }
    static let processWatch = ConformanceRequirement(
        description: "the transport detects peer death by end of file (peerDeathDetection is not processWatch), which a process holding the peer's descriptors postpones"
    ) {
        $0.capabilities.peerDeathDetection == .processWatch
    }
}
