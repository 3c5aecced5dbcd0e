/// A read that the spinning loop made ahead of time (``EngineChannel/pollWhileSpinning()``),
/// kept for the read that follows it: its outcome, a count or the error, is handed over once.
/// One per reader, used on the loop's thread only.
package struct PolledRead {
    private var kept: Result<Int, any Error>?

    package init() {}

    /// Whether a read is kept.
    package var isHolding: Bool { kept != nil }

    /// The spinning loop's poll: reads with `read` (`nil`: nothing there) unless a read is
    /// already kept, and keeps the outcome. Returns whether there is one to hand over.
    package mutating func poll(_ read: () throws -> Int?) -> Bool {
        if kept != nil { return true }
        do {
            guard let count = try read() else { return false }
            kept = .success(count)
        } catch {
            kept = .failure(error)
        }
        return true
    }

    /// The kept outcome, once; otherwise what `read` gives now.
    package mutating func take(_ read: () throws -> Int?) throws -> Int? {
        guard let outcome = kept else { return try read() }
        kept = nil
        return try outcome.get()
    }
}
