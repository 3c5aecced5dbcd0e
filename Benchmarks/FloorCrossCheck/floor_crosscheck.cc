// The native floor measured by Google Benchmark, as a cross-check of the floor ipcbench reports.
//
// The same C round trips (Sources/CNativeFloor) run between this process and a forked peer with
// the same core placements as ipcbench: this process on CPU 0, the peer on CPU 0 (same-core) or
// CPU 1 (split-cores). Google Benchmark picks the iteration count and reports the real time per
// round trip; each run also records the median round trip (p50_us) from its own per-iteration
// clock readings, comparable with ipcbench's p50 on a noisy machine where means are not.
//
// Benchmarks are named floor/<mechanism>/<placement>/<payload bytes>; the usual flags apply
// (--benchmark_filter, --benchmark_repetitions, --benchmark_out=FILE --benchmark_out_format=json).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "native_floor.h"

namespace {

struct Placement {
    const char *name;
    int local_cpu;
    int peer_cpu;
};

constexpr Placement kPlacements[] = {{"same-core", 0, 0}, {"split-cores", 0, 1}};
constexpr nf_mechanism kMechanisms[] = {NF_UNIX_STREAM, NF_MQUEUE, NF_FUTEX, NF_INOTIFY, NF_PIPE};
constexpr size_t kPayloadSizes[] = {0, 64, 4096, 65536, 1 << 20};
/// Round trips before Google Benchmark's clock starts: they fault in buffers and let both
/// processes settle, as ipcbench's warm-up does.
constexpr int kWarmupRoundTrips = 200;

void pin_to(int cpu) {
    if (nf_pin_calling_thread(cpu) != 0) {
        std::perror("sched_setaffinity");
        std::exit(1);
    }
}

/// A forked responder serving one channel in a private temporary directory.
class Peer {
public:
    Peer(nf_mechanism mechanism, int cpu, size_t max_payload) {
        char tmpl[] = "/tmp/floor-crosscheck-XXXXXX";
        if (mkdtemp(tmpl) == nullptr) fail("mkdtemp");
        directory_ = tmpl;
        int ready[2];
        if (pipe2(ready, O_CLOEXEC) != 0) fail("pipe2");
        pid_ = fork();
        if (pid_ < 0) fail("fork");
        if (pid_ == 0) {
            // The peer must not outlive the benchmark, whatever happens to it.
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(ready[0]);
            pin_to(cpu);
            nf_channel *channel = nf_responder_create(mechanism, directory_.c_str(), max_payload);
            char status = channel != nullptr ? 1 : 0;
            (void)!write(ready[1], &status, 1);
            close(ready[1]);
            int result = channel != nullptr ? nf_responder_serve(channel) : -1;
            nf_close(channel);
            _exit(result == 0 ? 0 : 1);
        }
        close(ready[1]);
        char status = 0;
        bool created = read(ready[0], &status, 1) == 1 && status == 1;
        close(ready[0]);
        if (!created) {
            waitpid(pid_, nullptr, 0);
            rmdir(directory_.c_str());
            fail("peer could not create its channel");
        }
    }

    /// Ends the peer whatever state it is in (the measurement is over; a peer left waiting after
    /// a failed open or round trip must not hang the run). The initiator's nf_close has removed
    /// the names already.
    ~Peer() {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        rmdir(directory_.c_str());
    }

    pid_t pid() const { return pid_; }
    const char *directory() const { return directory_.c_str(); }

private:
    [[noreturn]] static void fail(const char *what) {
        std::perror(what);
        std::exit(1);
    }

    pid_t pid_ = -1;
    std::string directory_;
};

void round_trip_benchmark(benchmark::State &state, nf_mechanism mechanism, Placement placement, size_t size) {
    pin_to(placement.local_cpu);
    Peer peer(mechanism, placement.peer_cpu, size);
    nf_channel *channel = nf_initiator_open(mechanism, peer.directory(), size, peer.pid());
    if (channel == nullptr) {
        state.SkipWithError(std::strerror(errno));
        return;
    }
    std::vector<unsigned char> request(std::max<size_t>(size, 1), 0xA5), reply(std::max<size_t>(size, 1));
    for (int index = 0; index < kWarmupRoundTrips; index++) {
        if (nf_round_trip(channel, request.data(), reply.data(), size) != 0 || std::memcmp(request.data(), reply.data(), size) != 0) {
            state.SkipWithError("warm-up round trip failed");
            nf_close(channel);
            return;
        }
    }
    std::vector<double> microseconds;
    microseconds.reserve(static_cast<size_t>(state.max_iterations));
    for (auto _ : state) {
        auto start = std::chrono::steady_clock::now();
        if (nf_round_trip(channel, request.data(), reply.data(), size) != 0) {
            state.SkipWithError(std::strerror(errno));
            break;
        }
        microseconds.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    nf_close(channel);
    if (microseconds.empty()) return;
    auto middle = microseconds.begin() + static_cast<std::ptrdiff_t>(microseconds.size() / 2);
    std::nth_element(microseconds.begin(), middle, microseconds.end());
    state.counters["p50_us"] = *middle;
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(2 * size));
}

}  // namespace

int main(int argc, char **argv) {
    // A pipe write to a peer that died must fail with EPIPE, not end the run.
    signal(SIGPIPE, SIG_IGN);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    for (nf_mechanism mechanism : kMechanisms) {
        for (const Placement &placement : kPlacements) {
            if (placement.peer_cpu >= cpus) continue;
            for (size_t size : kPayloadSizes) {
                std::string name = std::string("floor/") + nf_mechanism_name(mechanism) + "/" + placement.name + "/" + std::to_string(size);
                benchmark::RegisterBenchmark(name.c_str(), round_trip_benchmark, mechanism, placement, size)
                    ->UseRealTime()
                    ->Unit(benchmark::kMicrosecond);
            }
        }
    }
    benchmark::AddCustomContext("floor_protocol", "4-byte length + payload, echoed; this process on CPU 0, the peer forked");
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
