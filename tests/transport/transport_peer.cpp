// The other process in the transport tests: prints its worker address, reads the test's, connects,
// then plays one role. Usage: transport_peer MODE TLS [channel=N] [count=N] [size=N]
//   [max_payload=N] [max_buffered=N]
//   echo    send every frame back unchanged (header bytes forwarded as received)
//   source  send `count` frames of `size` bytes (count=0: forever), then wait for the close
//           (close=1: close the channel itself)
//   sink    receive and drop frames
//   hold    connect and never receive: with a small max_buffered the sender's sends stay pending
//   bad     send good and malformed frames in a fixed order (see test_ucx_channel.cpp)
//   idle    print the address and never connect
#include <chrono>
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include "conveyor/transport/frame_codec.hpp"
#include "conveyor/transport/ucx_context.hpp"
#include "frame_pattern.hpp"
#include "peer_process.hpp"

using namespace conveyor;
using namespace conveyor::transport;

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "transport_peer: %s\n", what.c_str());
  return 2;
}

int run_echo(channel& ch) {
  frame f;  // one frame for all (receive_into reuses its buffers), as a stage does
  for (;;) {
    if (auto st = ch.receive_into(f, after(std::chrono::seconds(60))); !st.ok()) {
      return ch.health().ok() ? fail(st.err().message) : 0;
    }
    auto s = ch.send_encoded(f.header_bytes, {f.payload.data(), f.payload.size()});
    if (!s.ok()) return fail(s.err().message);
    if (auto st = s->wait(after(std::chrono::seconds(60))); !st.ok()) return fail(st.err().message);
  }
}

int run_source(channel& ch, std::uint64_t count, std::size_t size, bool close_after, std::size_t small = 0) {
  // A ring of buffers, so `count=0` (forever) keeps a bounded number of frames in flight.
  constexpr std::size_t ring = 8;
  std::vector<std::vector<std::byte>> buffers(ring);
  std::deque<send_handle> pending;
  for (std::uint64_t i = 0; count == 0 || i < count; ++i) {
    if (pending.size() == ring) {
      if (auto st = pending.front().wait(after(std::chrono::seconds(60))); !st.ok()) return fail(st.err().message);
      pending.pop_front();
    }
    auto& buf = buffers[i % ring];
    // small != 0: one frame of `size` bytes, then seven of `small` bytes, and so on.
    const std::size_t n = small != 0 && i % 8 != 0 ? small : size;
    buf = test::pattern(n, i);
    auto s = ch.send(test::test_header(i, n), {buf.data(), buf.size()});
    if (!s.ok()) return fail(s.err().message);
    pending.push_back(*s);
  }
  for (auto& h : pending) {
    if (auto st = h.wait(after(std::chrono::seconds(60))); !st.ok()) return fail(st.err().message);
  }
  if (close_after) return 0;  // the channel's destructor says bye
  // Stay until the test closes the channel, so the test decides when this end goes away.
  for (;;) {
    auto f = ch.receive(after(std::chrono::seconds(60)));
    if (!f.ok() && !ch.health().ok()) return 0;
  }
}

int run_sink(channel& ch) {
  for (;;) {
    auto f = ch.receive(after(std::chrono::seconds(60)));
    if (!f.ok() && !ch.health().ok()) return 0;
  }
}

int run_bad(channel& ch) {
  std::vector<send_handle> handles;
  auto good = test::pattern(64, 1);
  auto put = [&](result<send_handle> s) {
    if (s.ok()) handles.push_back(*s);
    else std::fprintf(stderr, "transport_peer: send refused: %s\n", s.err().message.c_str());
  };
  // 0: a good frame
  put(ch.send(test::test_header(0, 64), {good.data(), good.size()}));
  // 1: garbage where the Cap'n Proto header should be
  std::vector<std::byte> garbage(40, std::byte{0xab});
  put(ch.send_encoded(garbage, {good.data(), good.size()}));
  // 2: a header for 1024 bytes with only 1000 bytes of payload (truncated)
  auto hdr = encode_header(test::test_header(2, 1024));
  put(ch.send_encoded(*hdr, {good.data(), 60}));
  // 3: a payload over the receiver's limit (the test sets it to 1 MiB)
  std::vector<std::byte> big(2u << 20);
  auto big_hdr = encode_header(test::test_header(3, big.size()));
  put(ch.send_encoded(*big_hdr, {big.data(), big.size()}));
  // 4: a header whose plan is inconsistent (negative start position)
  auto bad_plan = test::test_header(4, 64);
  bad_plan.seqs[0].start_pos = -3;
  put(ch.send_encoded(*encode_header(bad_plan), {good.data(), good.size()}));
  // 5: a good frame again: the channel survives all of the above
  put(ch.send(test::test_header(5, 64), {good.data(), good.size()}));
  for (auto& h : handles) (void)h.wait(after(std::chrono::seconds(30)));  // 3 fails: the receiver refused it
  return run_sink(ch);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return fail("usage: transport_peer MODE TLS [key=value...]");
  std::string mode = argv[1];
  std::map<std::string, std::uint64_t> kv = {{"channel", 0}, {"count", 1}, {"size", 1024},
                                             {"max_payload", std::uint64_t{1} << 30},
                                             {"max_buffered", std::uint64_t{1} << 30}, {"close", 0}};
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    if (eq == std::string::npos) return fail("bad argument " + a);
    kv[a.substr(0, eq)] = std::stoull(a.substr(eq + 1));
  }
  ucx_config cfg;
  cfg.tls = argv[2];
  cfg.net_devices = "lo";  // tests stay on loopback
  auto ctx = ucx_context::create(cfg);
  if (!ctx.ok()) return fail(ctx.err().message);
  std::printf("%s\n", test::to_hex((*ctx)->address()).c_str());
  std::fflush(stdout);
  std::string line;
  if (!std::getline(std::cin, line)) return fail("no peer address on stdin");
  if (mode == "idle") {
    std::this_thread::sleep_for(std::chrono::hours(1));
    return 0;
  }
  channel_options opts;
  opts.channel_id = kv["channel"];
  opts.max_payload_bytes = kv["max_payload"];
  opts.max_buffered_bytes = kv["max_buffered"];
  opts.respect_peer_limit = mode != "bad";
  auto ch = (*ctx)->connect(test::from_hex(line), opts);
  if (!ch.ok()) return fail(ch.err().message);
  if (mode == "echo") return run_echo(**ch);
  if (mode == "source") return run_source(**ch, kv["count"], kv["size"], kv["close"] != 0, kv["small"]);
  if (mode == "hold") {
    std::this_thread::sleep_for(std::chrono::hours(1));
    return 0;
  }
  if (mode == "sink") return run_sink(**ch);
  if (mode == "bad") return run_bad(**ch);
  return fail("unknown mode " + mode);
}
