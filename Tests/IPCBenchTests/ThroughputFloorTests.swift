@testable import IPCBenchKit
import IPCFraming
import Testing

/// Which floor stream each throughput row is divided by, from hand-made rows: a batched row by
/// the floor stream batched the same, every row (batched or not) by the best per-message
/// event-driven stream as well, and no per-message comparison by a batched floor.
@Suite("Throughput floors")
struct ThroughputFloorTests {
    static func row(_ transport: String, batch: Int? = nil, perSecond: Double, placement: Placement = .sameCore) -> ThroughputResult {
        ThroughputResult(
            transport: transport, framing: transport.hasPrefix("floor:") ? nil : .binary, placement: placement, waitStrategy: "blocking",
            payloadBytes: 64, messagesPerRepetition: 1000, repetitionMessagesPerSecond: [perSecond], messagesPerSecond: perSecond,
            bytesPerSecond: perSecond * 64, localCPUPerMessage: nil, peerCPUPerMessage: nil, batch: batch
        )
    }

    /// The batched floor first and fastest, so that a lookup that ignored `batch` would find it.
    static let rows = [
        row("floor:unix-stream+epoll", batch: 8, perSecond: 2_000_000),
        row("floor:unix-stream+epoll", batch: 8, perSecond: 1_000_000, placement: .splitCores),
        row("floor:unix-stream", perSecond: 400_000),
        row("floor:unix-stream+epoll", perSecond: 300_000),
        row("floor:unix-stream+io_uring", perSecond: 500_000),
        row("unix-socket", perSecond: 250_000),
        row("unix-socket", batch: 8, perSecond: 1_500_000),
        row("unix-socket", batch: 4, perSecond: 1_200_000),
    ]

    @Test("a batched row's same work is the floor batched the same; the best event-driven stream stays the per-message one")
    func selection() throws {
        let rows = Self.rows
        let perMessage = try #require(rows.first { $0.transport == "unix-socket" && $0.batch == nil })
        let batched = try #require(rows.first { $0.transport == "unix-socket" && $0.batch == 8 })
        #expect(perMessage.floor(in: rows)?.name == "throughput/floor:unix-stream/same-core/64")
        #expect(perMessage.sameWorkFloor(in: rows)?.name == "throughput/floor:unix-stream+io_uring/same-core/64")
        #expect(perMessage.bestEventDrivenFloor(in: rows)?.name == "throughput/floor:unix-stream+io_uring/same-core/64")
        #expect(batched.floor(in: rows)?.name == "throughput/floor:unix-stream/same-core/64")
        #expect(batched.sameWorkFloor(in: rows)?.name == "throughput/floor:unix-stream+epoll/same-core/batched-8/64")
        #expect(batched.bestEventDrivenFloor(in: rows)?.name == "throughput/floor:unix-stream+io_uring/same-core/64")
        // No floor batched by 4 in the run: no same-work floor, rather than another one.
        let byFour = try #require(rows.first { $0.batch == 4 })
        #expect(byFour.sameWorkFloor(in: rows) == nil)
        #expect(byFour.bestEventDrivenFloor(in: rows)?.name == "throughput/floor:unix-stream+io_uring/same-core/64")
        // Floors are not divided by floors.
        #expect(rows.filter { $0.transport.hasPrefix("floor:") }.allSatisfy { $0.sameWorkFloor(in: rows) == nil && $0.bestEventDrivenFloor(in: rows) == nil })
    }

    @Test("the report's throughput table shows both shares")
    func reportColumns() throws {
        let columns = ReportRenderer.throughputColumns
        let sameWork = try #require(columns.firstIndex(of: "÷ same-work floor"))
        let best = try #require(columns.firstIndex(of: "÷ best event-driven"))
        let table = ReportRenderer.throughputRows(Self.rows)
        let batched = try #require(zip(Self.rows, table).first { $0.0.transport == "unix-socket" && $0.0.batch == 8 }?.1)
        // 1.5 M against the batched floor's 2 M, and against io_uring's 500 k.
        #expect(batched[sameWork] == "75%" && batched[best] == "300%")
        let perMessage = try #require(zip(Self.rows, table).first { $0.0.transport == "unix-socket" && $0.0.batch == nil }?.1)
        #expect(perMessage[sameWork] == "50%" && perMessage[best] == "50%")
    }

    @Test("the report's throughput table shows the repetitions' middle half beside their median")
    func repetitionSpread() throws {
        var spread = Self.row("unix-socket", perSecond: 0)
        // Ten repetitions in run order; sorted: 10 20 30 40 50 60 70 80 90 100.
        spread.repetitionMessagesPerSecond = [70, 10, 100, 40, 90, 20, 60, 30, 80, 50]
        spread.messagesPerSecond = 60
        let quartiles = try #require(spread.repetitionQuartiles)
        #expect(quartiles.lower == 30 && quartiles.upper == 80)
        let column = try #require(ReportRenderer.throughputColumns.firstIndex(of: "q1–q3 messages/s"))
        #expect(ReportRenderer.throughputRows([spread])[0][column] == "30–80")
        // Four: the second and third, as far from either end.
        spread.repetitionMessagesPerSecond = [40, 10, 30, 20]
        #expect(spread.repetitionQuartiles.map { [$0.lower, $0.upper] } == [20, 30])
        // Too few repetitions for a spread.
        #expect(Self.row("unix-socket", perSecond: 5).repetitionQuartiles == nil)
        #expect(ReportRenderer.throughputRows([Self.row("unix-socket", perSecond: 5)])[0][column] == "-")
    }
}
