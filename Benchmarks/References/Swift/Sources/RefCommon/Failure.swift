/// A failure of the contract (a wrong echo, a closed connection), carried through futures and
/// async calls to the top level, which prints it as the one stderr line and exits with `status`.
public struct ReferenceFailure: Error, CustomStringConvertible {
    public var message: String
    public var status: Int32

    public init(_ message: String, status: Int32 = ExitStatus.failure) {
        self.message = message
        self.status = status
    }

    public var description: String { self.message }
}

extension Reference {
    /// Exits with the failure's status and message, or status 3 and the error's description.
    public static func exit(_ error: any Error, context: String) -> Never {
        if let failure = error as? ReferenceFailure {
            Reference.exit(failure.message, status: failure.status)
        }
        Reference.exit("\(context): \(error)")
    }
}
