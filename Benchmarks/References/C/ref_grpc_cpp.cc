/*
 * ref_grpc_cpp.cc: gRPC C++ (the C core under grpc++, Debian libgrpc++-dev) over a Unix domain
 * socket, as a reference system of ipcbench (system "grpc-cpp"), on the same wire contract as the
 * Swift ref-grpc: the same method paths, raw bytes as messages, no protobuf and no generated code
 * (grpc::GenericStub on the client, grpc::AsyncGenericService on the server, grpc::ByteBuffer).
 *
 *   /ipcbench.Echo/Echo  unary: the request's bytes come back (latency).
 *   /ipcbench.Echo/Push  client streaming: N messages one way; the single response, sent once the
 *                        server has taken and checked the last one, carries (taken, mismatched) as
 *                        two big-endian UInt64s (throughput). The payload size travels as request
 *                        metadata "ipcbench-payload".
 *
 * Configured for low latency the way the gRPC C++ documentation suggests: the completion-queue
 * (async) API on both sides, so that the thread that waits is the thread that polls the socket
 * and runs the call (no hand-off between threads on the way in or out). The client drives its
 * own CompletionQueue from the measuring thread; the server runs one thread on its
 * ServerCompletionQueue. Insecure credentials, message size limits raised to 80 MiB both ways.
 *
 * The command-line contract is in ../README.md; the shared parts are in ref_common.h.
 */
#include "ref_common.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

static const char *const systems[] = {"grpc-cpp", NULL};
static const char socket_name[] = "grpc-cpp.sock";
static const char echo_method[] = "/ipcbench.Echo/Echo";
static const char push_method[] = "/ipcbench.Echo/Push";
static const char payload_key[] = "ipcbench-payload";
/* Above the 4 MiB default, so that every payload up to --payload's limit is carried. */
static const int max_message_bytes = 80 << 20;

static struct ref_args args;

static std::chrono::system_clock::time_point ref_deadline(void)
{
    return std::chrono::system_clock::now() + std::chrono::milliseconds(REF_TIMEOUT_MS);
}

/* ----------------------------------------------------------------------------------------------
 * Messages: a grpc::ByteBuffer holds a list of slices; a message is checked slice by slice
 * against the pattern (no copy), and copied into one piece only to say why it is wrong.
 */

static grpc::ByteBuffer make_message(const void *data, size_t size)
{
    grpc::Slice slice(data, size); /* copies the bytes */
    return grpc::ByteBuffer(&slice, 1);
}

static std::vector<uint8_t> flatten(const grpc::ByteBuffer &buffer)
{
    std::vector<uint8_t> bytes;
    std::vector<grpc::Slice> slices;
    if (buffer.Valid() && buffer.Dump(&slices).ok())
        for (const grpc::Slice &slice : slices) bytes.insert(bytes.end(), slice.begin(), slice.end());
    return bytes;
}

static bool message_matches(const struct ref_pattern *pattern, uint64_t k, const grpc::ByteBuffer &buffer)
{
    size_t length = buffer.Valid() ? buffer.Length() : 0;
    if (length != pattern->payload) return false;
    if (length == 0) return true;
    std::vector<grpc::Slice> slices;
    if (!buffer.Dump(&slices).ok()) return false;
    const uint8_t *expected = ref_message(pattern, k);
    size_t offset = 0;
    for (const grpc::Slice &slice : slices) {
        if (slice.size() && memcmp(slice.begin(), expected + offset, slice.size()) != 0) return false;
        offset += slice.size();
    }
    return offset == pattern->payload;
}

static const char *code_name(grpc::StatusCode code)
{
    switch (code) {
    case grpc::OK: return "OK";
    case grpc::CANCELLED: return "CANCELLED";
    case grpc::UNKNOWN: return "UNKNOWN";
    case grpc::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND: return "NOT_FOUND";
    case grpc::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::ABORTED: return "ABORTED";
    case grpc::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::INTERNAL: return "INTERNAL";
    case grpc::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::DATA_LOSS: return "DATA_LOSS";
    case grpc::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "status";
    }
}

__attribute__((noreturn)) static void fail_status(const char *what, const grpc::Status &status)
{
    if (status.error_code() == grpc::DEADLINE_EXCEEDED)
        ref_fail("%s: no progress for %d s (call deadline exceeded)", what, REF_TIMEOUT_MS / 1000);
    ref_fail("%s failed: %s (%d): %s", what, code_name(status.error_code()), (int)status.error_code(),
             status.error_message().c_str());
}

/* ----------------------------------------------------------------------------------------------
 * Server: one thread runs the ServerCompletionQueue; each call is a small state machine whose
 * address is its tag. One call is always requested, so clients are served one after another (or
 * at once, should several come).
 */

class ServerCall {
  public:
    ServerCall(grpc::AsyncGenericService *service, grpc::ServerCompletionQueue *cq)
        : service_(service), cq_(cq), stream_(&context_)
    {
        service_->RequestCall(&context_, &stream_, cq_, cq_, this);
    }

    /* A completion of this call's last operation. */
    void proceed(bool ok)
    {
        switch (state_) {
        case REQUESTED:
            if (!ok) { delete this; return; } /* the server is shutting down */
            new ServerCall(service_, cq_);    /* the next call */
            start();
            return;
        case READING_ECHO:
            if (!ok) return finish_error(grpc::Status(grpc::INVALID_ARGUMENT, "no request message"));
            reply();
            return;
        case READING_PUSH:
            if (ok) {
                if (!message_matches(&pattern_, taken_, message_)) mismatched_++;
                taken_++;
                stream_.Read(&message_, this);
            } else { /* the client has half-closed: every message is in */
                uint8_t ack[16];
                for (int i = 0; i < 8; i++) {
                    ack[i] = (uint8_t)(taken_ >> (56 - 8 * i));
                    ack[8 + i] = (uint8_t)(mismatched_ >> (56 - 8 * i));
                }
                state_ = FINISHING;
                stream_.WriteAndFinish(make_message(ack, sizeof ack), grpc::WriteOptions(), grpc::Status::OK, this);
            }
            return;
        case FINISHING:
            delete this;
            return;
        }
    }

  private:
    enum State { REQUESTED, READING_ECHO, READING_PUSH, FINISHING };

    void start()
    {
        const std::string &method = context_.method();
        if (method == echo_method) {
            state_ = READING_ECHO;
            stream_.Read(&message_, this);
        } else if (method == push_method) {
            const auto &metadata = context_.client_metadata();
            auto entry = metadata.find(payload_key);
            long payload = -1;
            if (entry != metadata.end()) {
                std::string text(entry->second.data(), entry->second.size());
                char *end = NULL;
                errno = 0;
                long value = strtol(text.c_str(), &end, 10);
                if (!errno && end != text.c_str() && *end == '\0' && value >= 0 && value <= REF_MAX_PAYLOAD)
                    payload = value;
            }
            if (payload < 0)
                return finish_error(grpc::Status(grpc::INVALID_ARGUMENT, "metadata ipcbench-payload is missing"));
            ref_pattern_init(&pattern_, (size_t)payload);
            state_ = READING_PUSH;
            stream_.Read(&message_, this);
        } else {
            finish_error(grpc::Status(grpc::UNIMPLEMENTED, "unknown method " + method));
        }
    }

    /* The echo: the request's own slices (no copy), or under serve --corrupt a wrong copy. */
    void reply()
    {
        state_ = FINISHING;
        if (!args.corrupt) {
            stream_.WriteAndFinish(message_, grpc::WriteOptions(), grpc::Status::OK, this);
            return;
        }
        std::vector<uint8_t> bytes = flatten(message_);
        size_t size = bytes.size();
        uint8_t *wrong = ref_corrupted_copy(bytes.data(), &size);
        stream_.WriteAndFinish(make_message(wrong, size), grpc::WriteOptions(), grpc::Status::OK, this);
        free(wrong);
    }

    void finish_error(const grpc::Status &status)
    {
        state_ = FINISHING;
        stream_.Finish(status, this);
    }

    ~ServerCall() { free(pattern_.base); }

    grpc::AsyncGenericService *service_;
    grpc::ServerCompletionQueue *cq_;
    grpc::GenericServerContext context_;
    grpc::GenericServerAsyncReaderWriter stream_;
    State state_ = REQUESTED;
    grpc::ByteBuffer message_;
    struct ref_pattern pattern_ = {NULL, 0};
    uint64_t taken_ = 0, mismatched_ = 0;
};

static char *server_socket_path;

static void remove_socket(void)
{
    if (server_socket_path) unlink(server_socket_path);
}

static int serve(void)
{
    struct ref_stop stop;
    ref_stop_init(&stop);
    server_socket_path = ref_path(&args, socket_name);
    ref_on_exit = remove_socket;
    std::string target = std::string("unix:") + server_socket_path;

    grpc::AsyncGenericService service;
    grpc::ServerBuilder builder;
    int bound = 0;
    builder.AddListeningPort(target, grpc::InsecureServerCredentials(), &bound);
    builder.RegisterAsyncGenericService(&service);
    builder.SetMaxReceiveMessageSize(max_message_bytes);
    builder.SetMaxSendMessageSize(max_message_bytes);
    std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (!server || !bound) ref_fail("cannot listen on %s (gRPC could not bind it; see its log above)", target.c_str());

    new ServerCall(&service, cq.get());
    std::thread worker([&cq] {
        void *tag;
        bool ok;
        while (cq->Next(&tag, &ok)) static_cast<ServerCall *>(tag)->proceed(ok);
    });
    ref_ready();

    for (;;) {
        struct pollfd fds[2] = {{stop.signal_fd, POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            ref_fail("poll: %s", strerror(errno));
        }
        if (ref_stop_check(&stop, fds[0].revents, fds[1].revents)) break;
    }

    /* Stop: no new connection, calls in flight cancelled at once, the queue drained (every call
     * object is deleted by its last completion), the socket removed. A backstop ends the process
     * should gRPC's shutdown hang. */
    remove_socket();
    std::thread([] {
        sleep(3);
        _exit(0);
    }).detach();
    server->Shutdown(std::chrono::system_clock::now());
    cq->Shutdown();
    worker.join();
    server.reset();
    cq.reset();
    remove_socket();
    return 0;
}

/* ----------------------------------------------------------------------------------------------
 * Client: a GenericStub whose calls complete on a CompletionQueue that the measuring thread
 * itself drives (AsyncNext with the 10 s deadline), so the thread that waits is the one that reads
 * the socket. Each unary call also carries a 10 s call deadline.
 */

struct client {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<grpc::GenericStub> stub;
    grpc::CompletionQueue cq;
    struct ref_pattern pattern = {NULL, 0};
    std::unique_ptr<grpc::ClientContext> push_context;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> push;
};

/* Waits for the completion of tag: its ok, or exit 3 after 10 s without it. */
static bool wait_for(struct client *client, void *expected, const char *what)
{
    void *tag = NULL;
    bool ok = false;
    switch (client->cq.AsyncNext(&tag, &ok, ref_deadline())) {
    case grpc::CompletionQueue::TIMEOUT:
        ref_fail("%s: no progress for %d s", what, REF_TIMEOUT_MS / 1000);
    case grpc::CompletionQueue::SHUTDOWN:
        ref_fail("%s: the completion queue was shut down", what);
    case grpc::CompletionQueue::GOT_EVENT:
        break;
    }
    if (tag != expected) ref_fail("%s: an unexpected completion", what);
    return ok;
}

static uint64_t round_trip(void *state, uint64_t k)
{
    struct client *client = (struct client *)state;
    grpc::ByteBuffer reply;
    grpc::Status status;

    uint64_t start = ref_now_ns();
    grpc::ByteBuffer request = make_message(ref_message(&client->pattern, k), client->pattern.payload);
    grpc::ClientContext context;
    context.set_deadline(ref_deadline());
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
        client->stub->PrepareUnaryCall(&context, echo_method, request, &client->cq);
    call->StartCall();
    call->Finish(&reply, &status, (void *)1);
    wait_for(client, (void *)1, "unary Echo");
    uint64_t end = ref_now_ns();

    if (!status.ok()) fail_status("unary Echo", status);
    if (!message_matches(&client->pattern, k, reply)) {
        std::vector<uint8_t> bytes = flatten(reply);
        ref_check_echo(&client->pattern, k, bytes.data(), bytes.size()); /* fails, saying why */
        ref_fail("wrong echo %" PRIu64, k);
    }
    return ref_sample(start, end);
}

static void send_one(void *state, const void *data, size_t size)
{
    struct client *client = (struct client *)state;
    grpc::ByteBuffer message = make_message(data, size);
    client->push->Write(message, (void *)2);
    if (!wait_for(client, (void *)2, "Push write")) {
        /* The call has ended: its status says why. */
        grpc::Status status;
        client->push->Finish(&status, (void *)3);
        wait_for(client, (void *)3, "Push status");
        fail_status("client stream Push", status);
    }
}

/* One client-streaming call of count messages; fails unless the receiver took all, all right. */
static void push(struct client *client, long count, int corrupt_first)
{
    grpc::Status status;
    client->push_context.reset(new grpc::ClientContext());
    client->push_context->AddMetadata(payload_key, std::to_string(client->pattern.payload));
    client->push = client->stub->PrepareCall(client->push_context.get(), push_method, &client->cq);
    if (!client->push) ref_fail("cannot start the client stream Push");
    client->push->StartCall((void *)4);
    if (!wait_for(client, (void *)4, "Push start")) {
        client->push->Finish(&status, (void *)3);
        wait_for(client, (void *)3, "Push status");
        fail_status("client stream Push", status);
    }
    ref_send_stream(&client->pattern, count, corrupt_first, send_one, client);
    client->push->WritesDone((void *)5);
    wait_for(client, (void *)5, "Push half-close");
    grpc::ByteBuffer reply;
    bool got_reply = false;
    client->push->Read(&reply, (void *)6);
    got_reply = wait_for(client, (void *)6, "Push acknowledgement");
    client->push->Finish(&status, (void *)3);
    wait_for(client, (void *)3, "Push status");
    if (!status.ok()) fail_status("client stream Push", status);
    if (!got_reply) ref_fail("client stream Push ended without an acknowledgement");
    std::vector<uint8_t> ack = flatten(reply);
    if (ack.size() != 16) ref_fail("unexpected acknowledgement of %zu bytes", ack.size());
    uint64_t taken = 0, mismatched = 0;
    for (int i = 0; i < 8; i++) taken = taken << 8 | ack[i], mismatched = mismatched << 8 | ack[8 + i];
    if (mismatched) ref_fail("the receiver found %" PRIu64 " of %" PRIu64 " messages wrong", mismatched, taken);
    if (taken != (uint64_t)count) ref_fail("the receiver took %" PRIu64 " messages, expected %ld", taken, count);
    client->push.reset();
    client->push_context.reset();
    ref_progress();
}

static int measure(void)
{
    ref_watchdog_start();
    struct ref_accounting accounting;
    memset(&accounting, 0, sizeof accounting);
    ref_accounting_add_server(&accounting, args.server_pid);
    char *path = ref_path(&args, socket_name);
    ref_require_socket(path);

    {
        struct client client;
        ref_pattern_init(&client.pattern, (size_t)args.payload);
        grpc::ChannelArguments channel_arguments;
        channel_arguments.SetMaxReceiveMessageSize(max_message_bytes);
        channel_arguments.SetMaxSendMessageSize(max_message_bytes);
        client.channel = grpc::CreateCustomChannel(std::string("unix:") + path, grpc::InsecureChannelCredentials(),
                                                   channel_arguments);
        client.stub.reset(new grpc::GenericStub(client.channel));

        if (args.mode == REF_LATENCY) {
            uint64_t *samples = ref_latency_round_trips(&args, &accounting, round_trip, &client);
            ref_print_latency(&args, samples, &accounting);
            free(samples);
        } else {
            if (args.warmup > 0) push(&client, args.warmup, 0);
            ref_accounting_start(&accounting);
            uint64_t start = ref_now_ns();
            push(&client, args.count, args.corrupt);
            uint64_t end = ref_now_ns();
            ref_accounting_stop(&accounting);
            ref_print_throughput(&args, ref_sample(start, end), &accounting);
        }
        client.cq.Shutdown();
        void *tag;
        bool ok;
        while (client.cq.Next(&tag, &ok)) {}
        free(client.pattern.base);
    }
    free(path);
    return 0;
}

int main(int argc, char **argv)
{
    ref_parse_args(argc, argv, systems, &args);
    ref_pin(&args); /* before gRPC starts any thread */
    return args.command == REF_SERVE ? serve() : measure();
}
