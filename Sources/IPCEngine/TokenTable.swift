/// Values kept by token, found without hashing: the event loop looks its registrations up by
/// the token epoll reports, once per event, and a dictionary hashed every one of them.
///
/// A token is a slot's index plus one in its low 32 bits and the slot's reuse count in the high
/// 32 (1 to 2³¹ − 1, then 1 again). A removed value's token then finds nothing even once its
/// slot holds another value (until the slot has been reused 2³¹ − 1 more times). Tokens are
/// never 0 and never `UInt64.max` (``Poller``'s own).
package struct TokenTable<Value> {
    private struct Slot {
        var generation: UInt32
        var value: Value?
    }

    private var slots: [Slot] = []
    /// Indexes of the empty slots, most recently emptied last.
    private var free: [Int] = []
    /// The number of values held.
    package private(set) var count = 0

    package init() {}

    /// Stores `value` and returns its token.
    package mutating func insert(_ value: Value) -> UInt64 {
        let index: Int
        if let reused = free.popLast() {
            index = reused
            let next = slots[index].generation &+ 1
            slots[index].generation = next > UInt32(Int32.max) || next == 0 ? 1 : next
            slots[index].value = value
        } else {
            precondition(slots.count < Int(UInt32.max) - 1, "more registrations than tokens")
            index = slots.count
            slots.append(Slot(generation: 1, value: value))
        }
        count += 1
        return UInt64(slots[index].generation) << 32 | UInt64(index + 1)
    }

    /// The slot `token` names, if it is still the one the token was given for.
    private func index(of token: UInt64) -> Int? {
        let index = Int(token & 0xFFFF_FFFF) - 1
        guard index >= 0, index < slots.count, UInt64(slots[index].generation) == token >> 32 else { return nil }
        return index
    }

    /// The value stored under `token`; `nil` once it was removed. Setting an existing token's
    /// value replaces it; setting `nil` removes it; a token no longer held is ignored.
    package subscript(token: UInt64) -> Value? {
        get { index(of: token).flatMap { slots[$0].value } }
        set {
            guard let index = index(of: token), slots[index].value != nil else { return }
            if let newValue {
                slots[index].value = newValue
            } else {
                _ = remove(token)
            }
        }
    }

    /// Runs `body` on the value stored under `token`, in place (no copy of it is made), and
    /// returns what it returns; `nil`, without running it, if the token is no longer held.
    package mutating func update<Result>(_ token: UInt64, _ body: (inout Value) throws -> Result) rethrows -> Result? {
        guard let index = index(of: token), slots[index].value != nil else { return nil }
        return try body(&slots[index].value!)
    }

    /// Every token held with its value, in slot order.
    package var tokensAndValues: [(token: UInt64, value: Value)] {
        slots.indices.compactMap { index in
            slots[index].value.map { (UInt64(slots[index].generation) << 32 | UInt64(index + 1), $0) }
        }
    }

    /// Removes and returns the value stored under `token`, if it is still held.
    @discardableResult
    package mutating func remove(_ token: UInt64) -> Value? {
        guard let index = index(of: token), let value = slots[index].value else { return nil }
        slots[index].value = nil
        free.append(index)
        count -= 1
        return value
    }

    /// Every value held, in slot order.
    package var values: [Value] { slots.compactMap(\.value) }
}
