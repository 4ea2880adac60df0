// UCX channels between this test process and transport_peer processes, over tcp and shared memory.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "conveyor/transport/frame_codec.hpp"
#include "conveyor/transport/ucx_context.hpp"
#include "frame_pattern.hpp"
#include "peer_process.hpp"

namespace conveyor::transport {
namespace {

using namespace std::chrono_literals;
using test::peer_process;

/// How long a dead peer may take to turn into errors on every pending operation. tcp sees the socket
/// close at once; shared memory relies on UCX keepalive (500 ms interval here).
constexpr auto failure_bound = 3s;

class UcxChannel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ucx_config cfg;
    cfg.tls = GetParam();
    cfg.net_devices = "lo";
    auto ctx = ucx_context::create(cfg);
    ASSERT_TRUE(ctx.ok()) << ctx.err().message;
    ctx_ = std::move(*ctx);
  }

  /// Starts a peer in `mode` and opens a channel to it.
  std::unique_ptr<channel> open(peer_process& peer, channel_options opts = {}) {
    worker_address a = peer.address();
    EXPECT_FALSE(a.empty()) << "the peer printed no address";
    peer.send_address(ctx_->address());
    auto ch = ctx_->connect(a, opts);
    EXPECT_TRUE(ch.ok()) << ch.err().message;
    return ch.ok() ? std::move(*ch) : nullptr;
  }

  std::vector<std::string> args(const std::string& mode, std::vector<std::string> more = {}) {
    std::vector<std::string> v = {mode, GetParam()};
    v.insert(v.end(), more.begin(), more.end());
    return v;
  }

  /// Sends one frame and checks that the echo comes back identical.
  void echo_once(channel& ch, std::uint64_t id, std::size_t bytes, std::size_t blocks = 4) {
    auto payload = test::pattern(bytes, id);
    auto header = test::test_header(id, bytes, blocks);
    auto s = ch.send(header, {payload.data(), payload.size()});
    ASSERT_TRUE(s.ok()) << s.err().message;
    auto f = ch.receive(after(60s));
    ASSERT_TRUE(f.ok()) << f.err().message;
    ASSERT_TRUE(s->wait(after(10s)).ok());
    EXPECT_EQ(f->header, header);
    ASSERT_EQ(f->payload.size(), bytes);
    EXPECT_EQ(0, std::memcmp(f->payload.data(), payload.data(), bytes)) << "payload of " << bytes << " bytes differs";
  }

  std::unique_ptr<ucx_context> ctx_;
};

TEST_P(UcxChannel, EchoesPayloadsByteExactFromFourBytesTo256MiB) {
  peer_process peer(args("echo"));
  auto ch = open(peer);
  ASSERT_TRUE(ch);
  std::uint64_t id = 0;
  for (std::size_t bytes : {std::size_t{0}, std::size_t{4}, std::size_t{1000}, std::size_t{8192},
                            std::size_t{65540}, std::size_t{1} << 20, std::size_t{16} << 20, std::size_t{256} << 20}) {
    echo_once(*ch, id++, bytes);
  }
}

TEST_P(UcxChannel, ManyFramesInFlightArriveInOrder) {
  peer_process peer(args("echo"));
  auto ch = open(peer);
  ASSERT_TRUE(ch);
  constexpr int n = 400;
  const std::size_t sizes[] = {4, 4000, 65536, 1u << 20};  // eager and rendezvous mixed
  std::vector<std::vector<std::byte>> payloads;
  std::vector<send_handle> sends;
  for (int i = 0; i < n; ++i) {
    payloads.push_back(test::pattern(sizes[i % 4], i));
    auto s = ch->send(test::test_header(i, sizes[i % 4]), {payloads.back().data(), payloads.back().size()});
    ASSERT_TRUE(s.ok()) << s.err().message;
    sends.push_back(*s);
  }
  for (int i = 0; i < n; ++i) {
    auto f = ch->receive(after(60s));
    ASSERT_TRUE(f.ok()) << f.err().message;
    ASSERT_EQ(f->header.microbatch_id, static_cast<std::uint64_t>(i)) << "out of order";
    ASSERT_EQ(f->payload.size(), payloads[i].size());
    ASSERT_EQ(0, std::memcmp(f->payload.data(), payloads[i].data(), payloads[i].size()));
  }
  for (auto& s : sends) EXPECT_TRUE(s.wait(after(10s)).ok());
}

TEST_P(UcxChannel, HeaderTooBigForAnAmHeaderTravelsSeparately) {
  peer_process peer(args("echo"));
  auto ch = open(peer);
  ASSERT_TRUE(ch);
  echo_once(*ch, 1, 4096, 20000);         // ~80 KB of block table
  echo_once(*ch, 2, 8u << 20, 20000);     // with a rendezvous payload
  echo_once(*ch, 3, 64, 4);               // and back to the inline path
}

TEST_P(UcxChannel, ReceiveDeadlinePassesWithoutBreakingTheChannel) {
  peer_process peer(args("echo"));
  auto ch = open(peer);
  ASSERT_TRUE(ch);
  auto t0 = clock::now();
  auto f = ch->receive(after(100ms));
  auto waited = clock::now() - t0;
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.err().message.find("deadline"), std::string::npos) << f.err().message;
  EXPECT_GE(waited, 100ms);
  EXPECT_LT(waited, 1s);
  EXPECT_TRUE(ch->health().ok());
  echo_once(*ch, 7, 1024);
  // The same with a timeout instead of a deadline (it starts when the wait first reads the clock,
  // at most a spin batch late): it passes, no sooner, and the channel still works.
  frame g;
  t0 = clock::now();
  auto st = ch->receive_into(g, clock::duration(100ms));
  waited = clock::now() - t0;
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("deadline"), std::string::npos) << st.err().message;
  EXPECT_GE(waited, 100ms);
  EXPECT_LT(waited, 1s);
  auto payload = test::pattern(16, 9);
  auto s = ch->send(test::test_header(9, payload.size()), {payload.data(), payload.size()});
  ASSERT_TRUE(s.ok()) << s.err().message;
  ASSERT_TRUE(ch->receive_into(g, clock::duration(10s)).ok());
  EXPECT_EQ(g.header.microbatch_id, 9u);
  ASSERT_EQ(g.payload.size(), payload.size());
  EXPECT_EQ(0, std::memcmp(g.payload.data(), payload.data(), payload.size()));
}

TEST_P(UcxChannel, PeerKilledWithSendsPendingFailsEverySendWithinBound) {
  peer_process peer(args("hold", {"max_buffered=4194304"}));
  auto ch = open(peer);
  ASSERT_TRUE(ch);
  // The peer takes one 4 MiB frame and then holds the rest at this end (its buffer budget is full).
  std::vector<std::byte> payload = test::pattern(4u << 20, 1);
  std::vector<send_handle> sends;
  for (int i = 0; i < 16; ++i) {
    auto s = ch->send(test::test_header(i, payload.size()), {payload.data(), payload.size()});
    ASSERT_TRUE(s.ok()) << s.err().message;
    sends.push_back(*s);
  }
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(sends.back().done()) << "the peer should be holding these sends";
  auto t0 = clock::now();
  peer.kill();
  int failed = 0;
  for (auto& s : sends) {
    if (!s.wait(t0 + failure_bound + 1s).ok()) ++failed;
  }
  auto took = clock::now() - t0;
  EXPECT_GE(failed, 14);
  EXPECT_LT(took, failure_bound) << "pending sends took "
                                 << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms to fail";
  auto f = ch->receive(after(failure_bound));
  ASSERT_FALSE(f.ok());
  EXPECT_FALSE(ch->health().ok());
  std::printf("[ bound    ] %s: %d pending sends failed %lld ms after SIGKILL: %s\n", GetParam().c_str(), failed,
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()),
              ch->health().err().message.c_str());
  // A new send fails at once, and a new peer can take the same channel id.
  auto late = ch->send(test::test_header(99, 4), {payload.data(), 4});
  EXPECT_FALSE(late.ok());
  ch.reset();
  peer_process next(args("echo"));
  auto ch2 = open(next);
  ASSERT_TRUE(ch2);
  echo_once(*ch2, 5, 1u << 20);
}

TEST_P(UcxChannel, PeerKilledMidStreamFailsTheReceiverWithinBound) {
  peer_process peer(args("source", {"count=0", "size=4194304"}));
  channel_options opts;
  opts.max_buffered_bytes = 16u << 20;
  auto ch = open(peer, opts);
  ASSERT_TRUE(ch);
  for (int i = 0; i < 3; ++i) {
    auto f = ch->receive(after(30s));
    ASSERT_TRUE(f.ok()) << f.err().message;
    auto want = test::pattern(4u << 20, i);
    ASSERT_EQ(0, std::memcmp(f->payload.data(), want.data(), want.size()));
  }
  auto t0 = clock::now();
  peer.kill();
  result<frame> f = make_error(errc::internal, "unset");
  int drained = 0;
  while ((f = ch->receive(after(failure_bound + 2s))).ok()) ++drained;
  auto took = clock::now() - t0;
  EXPECT_LT(took, failure_bound) << f.err().message;
  EXPECT_FALSE(ch->health().ok());
  std::printf("[ bound    ] %s: receiver saw the dead peer after %lld ms (%d frames drained): %s\n",
              GetParam().c_str(),
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()), drained,
              f.err().message.c_str());
  ch.reset();
  peer_process next(args("echo"));
  auto ch2 = open(next);
  ASSERT_TRUE(ch2);
  echo_once(*ch2, 5, 4u << 20);
}

TEST_P(UcxChannel, ABigFrameOvertakenBySmallOnesIsNotStarvedByFlowControl) {
  // Big payloads travel on a second endpoint (tcp), so smaller frames sent after a big one can
  // arrive first and fill the receive budget; the big frame, which every later one waits for, must
  // still be admitted, or the channel stalls until the receive deadline.
  peer_process peer(args("source", {"count=24", "size=2097152", "small=4096"}));
  channel_options opts;
  opts.max_buffered_bytes = 1u << 20;
  auto ch = open(peer, opts);
  ASSERT_TRUE(ch);
  std::this_thread::sleep_for(300ms);  // let the small frames pile up against the budget
  for (int i = 0; i < 24; ++i) {
    auto f = ch->receive(after(20s));
    ASSERT_TRUE(f.ok()) << "frame " << i << ": " << f.err().message;
    std::size_t n = i % 8 == 0 ? 2097152 : 4096;
    auto want = test::pattern(n, i);
    ASSERT_EQ(f->payload.size(), n);
    ASSERT_EQ(0, std::memcmp(f->payload.data(), want.data(), want.size())) << "frame " << i;
  }
}

TEST_P(UcxChannel, PeerThatClosesIsReportedAsClosed) {
  peer_process peer(args("source", {"count=2", "size=64", "close=1"}));
  auto ch = open(peer);
  ASSERT_TRUE(ch);
  ASSERT_TRUE(ch->receive(after(10s)).ok());
  ASSERT_TRUE(ch->receive(after(10s)).ok());
  auto f = ch->receive(after(10s));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.err().message.find("closed"), std::string::npos) << f.err().message;
  EXPECT_EQ(peer.wait(), 0);
}

TEST_P(UcxChannel, MalformedTruncatedAndOversizeFramesAreRejectedWithReasons) {
  peer_process peer(args("bad"));
  channel_options opts;
  opts.max_payload_bytes = 1u << 20;
  auto ch = open(peer, opts);
  ASSERT_TRUE(ch);
  auto expect_error = [&](const char* needle) {
    auto f = ch->receive(after(10s));
    ASSERT_FALSE(f.ok()) << "expected an error mentioning '" << needle << "'";
    EXPECT_EQ(f.err().code, errc::bad_format);
    EXPECT_NE(f.err().message.find(needle), std::string::npos) << f.err().message;
  };
  auto first = ch->receive(after(10s));
  ASSERT_TRUE(first.ok()) << first.err().message;
  EXPECT_EQ(first->header.microbatch_id, 0u);
  expect_error("malformed");
  expect_error("truncated");
  expect_error("over this end's limit");
  expect_error("start_pos");
  auto last = ch->receive(after(10s));
  ASSERT_TRUE(last.ok()) << last.err().message;
  EXPECT_EQ(last->header.microbatch_id, 5u);
  EXPECT_TRUE(ch->health().ok());
}

TEST_P(UcxChannel, ReceiveIntoOneFrameStaysByteExactAcrossSizesHeadersAndRejections) {
  // One frame object for every receive (channel::receive_into keeps and reuses its buffers, and the
  // echo peer does the same), one send handle at a time (the channel reuses its send state): sizes
  // inline, eager, rendezvous and empty, headers inline and separate, shrinking and growing.
  {
    peer_process peer(args("echo"));
    auto ch = open(peer);
    ASSERT_TRUE(ch);
    frame f;
    const std::pair<std::size_t, std::size_t> cases[] = {{8, 4},    {0, 1},       {4, 7},     {70000, 2}, {2u << 20, 3},
                                                         {8, 20000}, {300, 1},    {8, 4},     {4096, 1},  {8, 2}};
    std::uint64_t id = 0;
    for (auto [bytes, blocks] : cases) {
      auto payload = test::pattern(bytes, id);
      auto header = test::test_header(id, bytes, blocks);
      auto s = ch->send(header, {payload.data(), payload.size()});
      ASSERT_TRUE(s.ok()) << s.err().message;
      auto st = ch->receive_into(f, after(60s));
      ASSERT_TRUE(st.ok()) << st.err().message;
      ASSERT_TRUE(s->wait(after(10s)).ok());
      EXPECT_EQ(f.header, header) << "frame " << id;
      ASSERT_EQ(f.payload.size(), bytes);
      EXPECT_EQ(0, std::memcmp(f.payload.data(), payload.data(), bytes)) << "payload of " << bytes << " bytes differs";
      ++id;
    }
  }
  {
    peer_process peer(args("bad"));
    channel_options opts;
    opts.max_payload_bytes = 1u << 20;
    auto ch = open(peer, opts);
    ASSERT_TRUE(ch);
    frame f;
    ASSERT_TRUE(ch->receive_into(f, after(10s)).ok());
    EXPECT_EQ(f.header.microbatch_id, 0u);
    for (const char* needle : {"malformed", "truncated", "over this end's limit", "start_pos"}) {
      auto st = ch->receive_into(f, after(10s));
      ASSERT_FALSE(st.ok()) << "expected an error mentioning '" << needle << "'";
      EXPECT_EQ(st.err().code, errc::bad_format);
      EXPECT_NE(st.err().message.find(needle), std::string::npos) << st.err().message;
    }
    auto st = ch->receive_into(f, after(10s));
    ASSERT_TRUE(st.ok()) << st.err().message;
    EXPECT_EQ(f.header.microbatch_id, 5u);
    EXPECT_TRUE(ch->health().ok());
  }
}

TEST_P(UcxChannel, SenderRefusesFramesThatCannotBeValid) {
  peer_process peer(args("echo", {"max_payload=1048576"}));
  auto ch = open(peer);
  ASSERT_TRUE(ch);
  std::vector<std::byte> big(2u << 20);
  auto over = ch->send(test::test_header(1, big.size()), {big.data(), big.size()});
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.err().message.find("limit"), std::string::npos) << over.err().message;
  auto mismatch = ch->send(test::test_header(2, 1024), {big.data(), 1000});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.err().message.find("truncated"), std::string::npos) << mismatch.err().message;
  // Debian's UCX reports host memory only (ucp_context_query): a device payload is refused with
  // that reason, not handed to UCX (which would read a device address as a host one).
  if (!ctx_->device_memory()) {
    auto device = ch->send(test::test_header(3, 16), {big.data(), 16, memory_type::cuda});
    ASSERT_FALSE(device.ok());
    EXPECT_EQ(device.err().code, errc::unsupported);
    EXPECT_NE(device.err().message.find("CUDA-aware"), std::string::npos) << device.err().message;
  }
  echo_once(*ch, 4, 1024);  // nothing was sent, so the channel is fine
}

TEST_P(UcxChannel, ConnectToAPeerThatNeverAnswersTimesOut) {
  peer_process peer(args("idle"));
  worker_address a = peer.address();
  peer.send_address(ctx_->address());
  channel_options opts;
  opts.connect_timeout = 300ms;
  auto t0 = clock::now();
  auto ch = ctx_->connect(a, opts);
  auto took = clock::now() - t0;
  ASSERT_FALSE(ch.ok());
  EXPECT_NE(ch.err().message.find("hello"), std::string::npos) << ch.err().message;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 2s);
}

TEST_P(UcxChannel, TwoChannelsOnOneWorkerNeedDistinctIds) {
  peer_process a(args("echo", {"channel=7"}));
  peer_process b(args("echo", {"channel=8"}));
  channel_options o7, o8;
  o7.channel_id = 7;
  o8.channel_id = 8;
  auto ch7 = open(a, o7);
  auto ch8 = open(b, o8);
  ASSERT_TRUE(ch7 && ch8);
  echo_once(*ch7, 1, 1u << 20);
  echo_once(*ch8, 2, 1u << 20);
  auto dup = ctx_->connect(ctx_->address(), o7);
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.err().message.find("already open"), std::string::npos) << dup.err().message;
}

TEST_P(UcxChannel, ASenderAThreadSpinningOnReceiveAndAConnectShareTheWorker) {
  // Callers send and progress the worker themselves (the progress thread steps aside while one
  // spins): a receiving thread in long spins must not stall sends from another thread, rendezvous
  // frames, or a connect (whose hello goes through the worker's posted commands).
  ucx_config cfg;
  cfg.tls = GetParam();
  cfg.net_devices = "lo";
  cfg.busy_poll = std::chrono::microseconds(5000);
  auto spinning_ctx = ucx_context::create(cfg);
  ASSERT_TRUE(spinning_ctx.ok()) << spinning_ctx.err().message;
  ctx_ = std::move(*spinning_ctx);
  peer_process peer(args("echo", {"channel=3"}));
  channel_options o3;
  o3.channel_id = 3;
  auto ch = open(peer, o3);
  ASSERT_TRUE(ch);
  constexpr int frames = 120;
  auto size_of = [](int i) { return i % 10 == 9 ? std::size_t{1} << 20 : std::size_t{64}; };  // eager and rendezvous
  std::vector<std::vector<std::byte>> payloads;
  for (int i = 0; i < frames; ++i) payloads.push_back(test::pattern(size_of(i), i));
  std::atomic<int> received{0};
  std::string receive_error;
  std::thread receiver([&] {
    for (int i = 0; i < frames; ++i) {
      auto f = ch->receive(after(60s));
      if (!f.ok()) {
        receive_error = f.err().message;
        return;
      }
      if (f->header.microbatch_id != static_cast<std::uint64_t>(i) || f->payload.size() != size_of(i) ||
          std::memcmp(f->payload.data(), payloads[i].data(), size_of(i)) != 0) {
        receive_error = "frame " + std::to_string(i) + " out of order or corrupted";
        return;
      }
      ++received;
    }
  });
  std::deque<send_handle> pending;
  for (int i = 0; i < frames; ++i) {
    auto s = ch->send(test::test_header(i, size_of(i)), {payloads[i].data(), payloads[i].size()});
    ASSERT_TRUE(s.ok()) << s.err().message;
    pending.push_back(*s);
    if (pending.size() > 8) {
      ASSERT_TRUE(pending.front().wait(after(30s)).ok());
      pending.pop_front();
    }
    if (i == frames / 2) {
      // A second channel opened while the receiver spins on the same worker.
      peer_process other(args("echo", {"channel=4"}));
      channel_options o4;
      o4.channel_id = 4;
      auto ch4 = open(other, o4);
      ASSERT_TRUE(ch4);
      echo_once(*ch4, 1, 4096);
    }
  }
  for (auto& s : pending) ASSERT_TRUE(s.wait(after(30s)).ok());
  receiver.join();
  EXPECT_EQ(receive_error, "");
  EXPECT_EQ(received.load(), frames);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxChannel, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

TEST(UcxConfig, UnknownTransportIsAnErrorNotACrash) {
  ucx_config cfg;
  cfg.tls = "no_such_transport";
  auto ctx = ucx_context::create(cfg);
  ASSERT_FALSE(ctx.ok());
  EXPECT_NE(ctx.err().message.find("no_such_transport"), std::string::npos) << ctx.err().message;
  cfg.tls = "tcp; rm -rf";
  EXPECT_FALSE(ucx_context::create(cfg).ok());
}

}  // namespace
}  // namespace conveyor::transport
