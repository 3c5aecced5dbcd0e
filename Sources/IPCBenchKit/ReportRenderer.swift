import Foundation
import IPCFraming

/// Renders results as a plain-text table (for the terminal) and as Markdown (for `Reports/`).
public enum ReportRenderer {
    static let latencyColumns = ["transport", "framing", "placement", "wait", "payload", "samples", "p50", "p90", "p99", "p99.9", "max", "p50 ÷ floor", "÷ same-work floor", "CPU/rt", "cs/rt"]

    static func latencyRows(_ results: [LatencyResult]) -> [[String]] {
        results.map { result in
            let floor = result.floor(in: results)
            let sameWork = result.sameWorkFloor(in: results)
            let cpu = result.localCPUPerRoundTrip.flatMap { local in result.peerCPUPerRoundTrip.map { UInt64(local + $0) } }
            return [
                result.transport, result.framing?.rawValue ?? "-", result.placement.rawValue, result.waitDescription,
                formatBytes(result.payloadBytes), String(result.samples), formatMicroseconds(result.p50), formatMicroseconds(result.p90),
                formatMicroseconds(result.p99), formatMicroseconds(result.p999), formatMicroseconds(result.maximum),
                floor.map { String(format: "%.2f×", Double(result.p50) / Double(max(1, $0.p50))) } ?? "-",
                sameWork.map { String(format: "%.2f×", Double(result.p50) / Double(max(1, $0.p50))) } ?? "-",
                cpu.map(formatMicroseconds) ?? "-",
                result.contextSwitchesPerRoundTrip.map { String(format: "%.2f", $0) } ?? "-",
            ]
        }
    }

    /// A fixed-width table; numeric columns are right-aligned.
    public static func table(_ results: [LatencyResult]) -> String {
        fixedWidth([latencyColumns] + latencyRows(results), leftAligned: 5)
    }

    static let throughputColumns = ["transport", "framing", "placement", "wait", "payload", "messages/s", "q1–q3 messages/s", "MB/s", "÷ floor", "÷ same-work floor", "÷ best event-driven", "CPU/msg", "cs/msg", "allocs/msg"]

    static func throughputRows(_ results: [ThroughputResult]) -> [[String]] {
        results.map { result in
            let share = { (floor: ThroughputResult?) in
                floor.map { String(format: "%.0f%%", 100 * result.messagesPerSecond / max(1, $0.messagesPerSecond)) } ?? "-"
            }
            let cpu = result.localCPUPerMessage.flatMap { local in result.peerCPUPerMessage.map { UInt64(local + $0) } }
            return [
                result.transport, result.framing?.rawValue ?? "-", result.placement.rawValue, result.waitDescription, formatBytes(result.payloadBytes),
                String(format: "%.0f", result.messagesPerSecond),
                result.repetitionQuartiles.map { String(format: "%.0f–%.0f", $0.lower, $0.upper) } ?? "-",
                String(format: "%.1f", result.bytesPerSecond / 1e6),
                share(result.floor(in: results)), share(result.sameWorkFloor(in: results)), share(result.bestEventDrivenFloor(in: results)),
                cpu.map(formatMicroseconds) ?? "-",
                result.contextSwitchesPerMessage.map { String(format: "%.2f", $0) } ?? "-",
                result.peerAllocationsPerMessage.map { String(format: "%.2f", $0) } ?? "-",
            ]
        }
    }

    /// One-way throughput, as a fixed-width table.
    public static func throughputTable(_ results: [ThroughputResult]) -> String {
        fixedWidth([throughputColumns] + throughputRows(results), leftAligned: 5)
    }

    static let scaleColumns = ["transport", "placement", "load on", "clients", "offered/s", "served/s", "p50 alone", "p99 alone", "p50 loaded", "p99 loaded", "p99 ratio", "server CPU"]

    static func scaleRows(_ results: [ScaleResult]) -> [[String]] {
        results.map { result in
            [
                "\(result.transport) \(result.framing)", result.placement.rawValue, result.loadCPU.map { "CPU \($0)" } ?? "unpinned",
                String(result.clients), String(format: "%.0f", result.offeredRequestsPerSecond), String(format: "%.0f", result.achievedRequestsPerSecond),
                formatMicroseconds(result.alone.p50), formatMicroseconds(result.alone.p99),
                formatMicroseconds(result.loaded.p50), formatMicroseconds(result.loaded.p99),
                String(format: "%.2f×", result.p99Ratio), result.serverCPUShareLoaded.map { String(format: "%.0f%%", $0 * 100) } ?? "-",
            ]
        }
    }

    /// Whether each scale result meets target 6, as sentences.
    static func scaleVerdicts(_ results: [ScaleResult]) -> [String] {
        results.map { result in
            String(format: "p99 with %d other clients sending is %.2f× the p99 alone (target ≤ %.0f×: %@); %.0f of %.0f offered requests/s served, %llu slots skipped; load process CPU %@.",
                   result.clients, result.p99Ratio, ScaleResult.targetRatio, result.p99Ratio <= ScaleResult.targetRatio ? "met" : "NOT met",
                   result.achievedRequestsPerSecond, result.offeredRequestsPerSecond, result.skippedSlots,
                   result.loadCPUShare.map { String(format: "%.0f%%", $0 * 100) } ?? "unknown")
        }
    }

    /// The scale measurement, as a fixed-width table and a verdict.
    public static func scaleTable(_ results: [ScaleResult]) -> String {
        fixedWidth([scaleColumns] + scaleRows(results), leftAligned: 3) + scaleVerdicts(results).joined(separator: "\n") + "\n"
    }

    static let invalidationColumns = ["transport", "trials", "median", "max"]

    static func invalidationRows(_ results: [InvalidationResult]) -> [[String]] {
        results.map { row in
            guard row.noticed else { return [row.transport, String(row.trials.count), "not detected", String(format: "gave up after %.1f s", Double(row.maximum) / 1e9)] }
            return [row.transport, String(row.trials.count), formatMicroseconds(row.median), formatMicroseconds(row.maximum)]
        }
    }

    /// Time from SIGKILL of the peer to invalidation, as a fixed-width table.
    public static func invalidationTable(_ results: [InvalidationResult]) -> String {
        fixedWidth([invalidationColumns] + invalidationRows(results), leftAligned: 1)
    }

    static let inProcessColumns = ["subject", "operation", "bytes", "ns/op", "M op/s", "GB/s", "allocs/op"]

    static func inProcessRows(_ results: [InProcessResult]) -> [[String]] {
        results.map {
            [
                $0.subject, $0.operation, formatBytes($0.bytes), String(format: "%.0f", $0.nanosecondsPerOperation),
                String(format: $0.operationsPerSecond >= 1e5 ? "%.1f" : "%.4f", $0.operationsPerSecond / 1e6),
                String(format: "%.2f", $0.gigabytesPerSecond), $0.allocationsPerOperation.map { String(format: "%.2f", $0) } ?? "-",
            ]
        }
    }

    /// In-process framing and decoding, as a fixed-width table, then how the fastest codec
    /// compares with `NSKeyedUnarchiver`.
    public static func inProcessTable(_ results: [InProcessResult]) -> String {
        let comparison = InProcessRunner.secureDecodingComparison(results)
        return fixedWidth([inProcessColumns] + inProcessRows(results), leftAligned: 2)
            + (comparison.isEmpty ? "" : "\n" + comparison.joined(separator: "\n") + "\n")
    }

    /// A Markdown table; the first `leftAligned` columns are left-aligned, the others right-aligned.
    static func markdownTable(_ columns: [String], _ rows: [[String]], leftAligned: Int) -> String {
        "| " + columns.joined(separator: " | ") + " |\n"
            + "|" + columns.indices.map { $0 < leftAligned ? "---" : "---:" }.joined(separator: "|") + "|\n"
            + rows.map { "| " + $0.joined(separator: " | ") + " |\n" }.joined()
    }

    static func fixedWidth(_ rows: [[String]], leftAligned: Int) -> String {
        let widths = rows[0].indices.map { column in rows.map { $0[column].count }.max() ?? 0 }
        return rows.map { row in
            row.enumerated().map { column, cell in
                let padding = String(repeating: " ", count: widths[column] - cell.count)
                return column < leftAligned ? cell + padding : padding + cell
            }.joined(separator: "  ")
        }.joined(separator: "\n") + "\n"
    }

    public static func markdown(_ results: RunResults) -> String {
        let context = results.context
        var text = """
        # ipcbench results

        Generated by `ipcbench`; do not edit. Source data: `results.json` (schema `\(results.schema)`).

        | | |
        |---|---|
        | date | \(context.date) |
        | host | \(context.hostname) |
        | CPU | \(context.cpuSummary) |
        | kernel | \(context.kernel) |
        | large frames' rest | \(context.largeTransfers ?? "not recorded") |
        | mitigations | \(context.machine?.mitigationSummary ?? "not recorded") |
        | Swift | \(context.swiftVersion), \(context.buildConfiguration) build |
        | command | `\(context.command)` |
        \(ChoiceReport.markdown(results))
        ## Round-trip latency

        Cross-process request/reply: the peer is a separate `ipcbench peer` process that echoes
        the payload. Times from an HDR histogram (3 significant digits). `same-core` pins both
        processes to CPU 0; `split-cores` pins this process to CPU 0 and the peer to CPU 1.
        `wait` is the wait strategy of both ends: `blocking` sleeps in the kernel at once;
        `spin-then-block` polls for a bounded time first (only ever with split cores); `spin`
        (a reference system's, such as `ref:iceoryx-spin`) polls and never blocks (split cores only).
        `p50 ÷ floor` divides by the native floor's p50 (same mechanism, placement and payload,
        blocking). `÷ same-work floor` divides by the p50 of a C floor that does the kernel work
        the transport's round trip does: for blocking rows the mechanism waited on as an event
        loop waits (`epoll_wait`, then the read; eventfd doorbells for notify) or, for
        file-presenter, the journal protocol (locks, write, inotify, read); for spinning rows a
        floor that spins the same way (polling the socket or queue by receiving without waiting; busy-polling
        shared memory for notify). A row whose peer served off its event loop (the default async
        handler) is divided by the floor that also hands each request from its polling or
        waiting thread to a second thread that answers (`+handoff`; for file-presenter
        `journal+handoff`), where the run measured one. It leaves out what the design costs in the kernel and
        measures what the transport's own code adds. CPU/rt is both processes' CPU time per round trip; cs/rt their context
        switches per round trip (voluntary and involuntary, all threads; a raw C ping-pong makes
        2.00).


        """
        text += markdownTable(latencyColumns, latencyRows(results.latency), leftAligned: 5)
        if let throughput = results.throughput, !throughput.isEmpty {
            text += "\n## One-way throughput\n\nMessages sent back to back, timed from the first send until the receiving process reports that its consumer has taken them all (median of the repetitions; `q1–q3 messages/s` is their spread, the middle half of the repetitions' rates: with ten, the third and eighth by rate). As the round trips are, they are sent from a task on the connection's executor, and with `--full`, for comparison (binary framing), from a task on Swift's global executor (`blocking, global executor`). Over a unix socket the engine holds the one-way frames of up to 65 KiB (a 64 KiB payload and its header) that a task on the connection's executor sends, and writes them together at the end of each round of its loop (docs/ENGINE.md, \"Held writes\"): its 64 B, 4 KiB and 64 KiB rows from that executor make fewer system calls than messages, its 1 MiB rows and the global-executor rows write a message a call. `÷ floor` is the share of the native floor's rate (same mechanism, placement and payload, a C sender and a receiver that takes each message whole, as a message receiver must: one of 256 KiB or more alone into a buffer of its size, smaller ones read through a 1 MiB buffer); floors exist for the mechanisms whose kernel buffers messages. `÷ same-work floor` is the share of the rate of a C floor that does the stream's kernel work: what the transport's own code costs, apart from the event-driven design's. For a row sent one message a `send`, the faster of the C streams that stream as an event loop does (`unix-stream+epoll`: writes that do not block, a full socket waited on with `epoll_wait` with EPOLLOUT added for the wait, and an `epoll_wait` before each read; `unix-stream+io_uring`: the same through io_uring); those floors are measured with `--full`, so a default run leaves the column empty for unix-socket's per-message rows. For a `batched by 8` row, `unix-stream+epoll`'s stream batched the same (its own `batched by 8` row: eight messages, each its header and payload, in one gathering `sendmsg` that does not block, the rest of a partial write sent from the byte where it stopped once `epoll_wait` says there is room), measured wherever the batched row is. `÷ best event-driven` is, for every row, batched or not, the share of the faster per-message event-driven C stream (for a per-message row the same as `÷ same-work floor`). CPU/msg is both processes' CPU time per message; cs/msg their context switches per message (voluntary and involuntary, all threads). allocs/msg is the heap allocations per message on the receiver's receive path (`ipcbench peer` counts them on the thread that runs its handler, which takes each payload in place where the transport lends it; `-` for a floor).\n\n"
            text += markdownTable(throughputColumns, throughputRows(throughput), leftAligned: 5)
        }
        if !results.inProcess.isEmpty {
            text += "\n## In-process framing and secure decoding\n\nMedian of 5 repetitions. Frame decoding runs through the reassembler over back-to-back frames arriving in 64 KiB reads; `bytes` is the payload. Codec rows decode an `Order` (`bytes` is its encoding in that codec), accepted (allow-listed) or refused (empty allow-list); `NSKeyedUnarchiver` rows decode the same order as an `OrderObject` graph with `unarchivedObject(ofClasses:from:)` (secure coding, the allowed classes), from its binary archive and from the codec's XML archive. `M op/s`: millions of frames or messages per second. `allocs/op`: heap allocations (malloc and its kin) per frame or message, counted by the `ipcbench` executable (`-` where not counted).\n\n"
            text += "| " + inProcessColumns.joined(separator: " | ") + " |\n|---|---|---:|---:|---:|---:|---:|\n"
            for row in inProcessRows(results.inProcess) {
                text += "| " + row.joined(separator: " | ") + " |\n"
            }
            let comparison = InProcessRunner.secureDecodingComparison(results.inProcess)
            if !comparison.isEmpty {
                text += "\n" + comparison.map { "- " + $0 + "\n" }.joined()
            }
        }
        if let scale = results.scale, !scale.isEmpty {
            text += "\n## Scale: one client among many\n\nOne `ipcbench peer` Unix socket server (binary framing). This process measures echo round trips alone, then while an `ipcbench load` process keeps `clients` other connections sending echo requests at a fixed rate each (at most one outstanding per client; a slot whose previous reply is late is skipped), the two phases alternating over the repetitions so drift affects both. `served/s` is the replies the load process received per second (median repetition). Placement: this process and the server as `placement` says; the load process as `load on` says. `server CPU`: the server's CPU time over the loaded blocks as a share of one CPU. Target 6: p99 loaded ≤ 2 × p99 alone. The load is paced on purpose: an unthrottled flood of senders on a 2-CPU machine measures CPU saturation, not the server's fairness.\n\n"
            text += markdownTable(scaleColumns, scaleRows(scale), leftAligned: 3)
            text += "\n" + scaleVerdicts(scale).map { "- " + $0 + "\n" }.joined()
        }
        if !results.invalidation.isEmpty {
            text += "\n## Invalidation after SIGKILL\n\nTime from `kill(pid, SIGKILL)` returning to the survivor's invalidation handler starting (an idle client connection of this process; the serving peer killed, unpinned). For a reference system (`ref:`), the time from SIGKILL of its `serve` process, while a `measure` client is in a round-trip loop, to that client's exit with the error it noticed (its own process exit included); `not detected` when the client noticed nothing and gave up at its own 10 s no-progress deadline.\n\n"
            text += "| " + invalidationColumns.joined(separator: " | ") + " |\n|---|---:|---:|---:|\n"
            for row in invalidationRows(results.invalidation) {
                text += "| " + row.joined(separator: " | ") + " |\n"
            }
        }
        return text
    }
}
