// The defaults that keep an out-of-the-box deployment closed and bounded (issue 10, security): every
// address on loopback, and a limit on every size a peer or client controls. A change that loosens one
// of them should be a decision, so it fails here first.
#include <gtest/gtest.h>

#include <cstdint>

#include "conveyor/config/deployment_loader.hpp"
#include "conveyor/config/endpoint.hpp"
#include "conveyor/frontend/rpc_server.hpp"
#include "conveyor/transport/config.hpp"
#include "conveyor/transport/frame_codec.hpp"

namespace {

using namespace conveyor;

TEST(SecureDefaults, DeploymentListensOnLoopback) {
  auto d = config::parse_deployment("", "<defaults>");
  ASSERT_TRUE(d.ok()) << d.err().message;
  EXPECT_TRUE(config::is_loopback(d->cluster.listen.host)) << d->cluster.listen.host;
  EXPECT_TRUE(config::is_loopback(d->frontend.rpc_listen.host)) << d->frontend.rpc_listen.host;
  EXPECT_FALSE(d->frontend.http_listen.has_value()) << "HTTP is off unless configured";
  ASSERT_FALSE(d->placement.hosts.empty());
  for (const auto& h : d->placement.hosts) EXPECT_TRUE(config::is_loopback(h.address)) << h.address;
  EXPECT_TRUE(d->cluster.token.empty()) << "no fixed token: a random one is made at start";
}

TEST(SecureDefaults, RpcServerBoundsWhatClientsSend) {
  const frontend::rpc_server_options o;
  auto listen = config::parse_endpoint(o.listen);
  ASSERT_TRUE(listen.ok());
  EXPECT_TRUE(config::is_loopback(listen->host));
  // Cap'n Proto's traversal limit is derived from max_message_bytes; nesting from max_nesting.
  EXPECT_GT(o.max_message_bytes, 0u);
  EXPECT_LE(o.max_message_bytes, std::size_t{64} << 20);
  EXPECT_GT(o.max_nesting, 0);
  EXPECT_LE(o.max_nesting, 64);
  EXPECT_GT(o.max_active_requests, 0);
  EXPECT_LE(o.max_stop_ids, 4096);
}

TEST(SecureDefaults, RpcServerRefusesTinyOrMalformedLimits) {
  // start_rpc_server checks its options before binding anything.
  class no_service : public service::inference_service {
   public:
    std::uint64_t submit(service::generate_request, std::shared_ptr<service::token_sink>) override { return 0; }
    void cancel(std::uint64_t) override {}
    void health(std::function<void(service::health_report)>) override {}
    void stats(std::function<void(service::stats_report)>) override {}
    service::model_info info() const override { return {}; }
  } svc;
  frontend::rpc_server_options o;
  o.max_message_bytes = 100;
  EXPECT_FALSE(frontend::start_rpc_server(svc, o).ok());
  o = {};
  o.listen = "127.0.0.1";
  EXPECT_FALSE(frontend::start_rpc_server(svc, o).ok());
}

TEST(SecureDefaults, FramesAreBounded) {
  const transport::channel_options o;
  EXPECT_LE(o.max_payload_bytes, std::uint64_t{1} << 30);
  EXPECT_LE(o.max_buffered_bytes, std::uint64_t{1} << 30);
  EXPECT_TRUE(o.respect_peer_limit);
  const transport::codec_limits& h = o.header_limits;
  EXPECT_LE(h.max_header_bytes, std::size_t{4} << 20);
  EXPECT_LE(h.max_traversal_words, std::uint64_t{1} << 20);
  EXPECT_LE(h.max_nesting, 64);
  EXPECT_LE(h.max_seqs, std::size_t{1} << 16);
  EXPECT_LE(h.max_dims, std::size_t{8});
}

TEST(SecureDefaults, OversizedFrameHeaderIsRefusedBeforeDecoding) {
  transport::codec_limits small;
  small.max_header_bytes = 64;
  std::vector<std::byte> big(128);
  auto h = transport::decode_header(big, small);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.err().message.find("over the limit"), std::string::npos) << h.err().message;
}

}  // namespace
