import Dispatch
import IPCEngine
import Testing

/// Timers scheduled from threads other than the loop's.
@Suite("Engine: timers scheduled from other threads")
struct LoopTimerTests {
    @Test("a timer scheduled from another thread just as the loop goes to sleep still fires: 20,000 in a row, each due 10 µs later")
    func timersFromAnotherThreadAreNotLost() throws {
        let loop = try EventLoop(name: "timer-test", stallThreshold: .seconds(10)) { _ in }
        let fired = DispatchSemaphore(value: 0)
        // Each timer's action wakes this thread, which schedules the next at once: the loop is
        // then between its look at the timers and its sleep, the moment a schedule was lost in.
        for index in 0..<20_000 {
            loop.schedule(at: monotonicNanoseconds() &+ 10_000) { fired.signal() }
            if fired.wait(timeout: .now() + .seconds(10)) == .timedOut {
                Issue.record("timer \(index) did not fire within 10 s of being due")
                // A lost timer fires once something else wakes the loop.
                loop.execute {}
                return
            }
        }
    }
}
