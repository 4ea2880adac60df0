// Command-line overrides, the checks against a model's shape, and the log summary.
#include "config_test_util.hpp"

namespace conveyor::config {
namespace {

using testing::contains;
using testing::parse_ok;

TEST(config_overrides, flags_replace_keys_and_are_recorded_as_their_origin) {
  deployment d = parse_ok("[parallel]\nstages = 2\n");
  overrides o;
  o.model = "/models/x";
  o.stages = 3;
  o.tp = 2;
  o.listen = "127.0.0.1:7700";
  ASSERT_TRUE(apply_overrides(d, o).ok());
  EXPECT_EQ(d.model.dir, "/models/x");
  EXPECT_EQ(d.parallel.stages, 3);
  EXPECT_EQ(d.parallel.tp, 2);
  EXPECT_EQ(d.frontend.rpc_listen, (endpoint{"127.0.0.1", 7700}));
  EXPECT_EQ(d.origins.at("parallel.stages").source, "--stages");
  EXPECT_EQ(d.origins.at("frontend.rpc_listen").source, "--listen");
  EXPECT_EQ(d.parallel.type, parallel_type::pptp) << "an unset type follows the new stages and tp";
  EXPECT_EQ(d.parallel.chunks, 3) << "unset chunks follow the new stages";
}

TEST(config_overrides, serve_without_a_config_file) {
  // `conveyor serve --model DIR --stages 3 --listen 127.0.0.1:7600` is a complete command.
  deployment d = parse_ok("");
  overrides o;
  o.model = "tests/fixtures/tiny-llama";
  o.stages = 3;
  o.chunks = 6;
  o.listen = "127.0.0.1:7600";
  ASSERT_TRUE(apply_overrides(d, o).ok());
  EXPECT_EQ(d.parallel.stages, 3);
  EXPECT_EQ(d.parallel.chunks, 6);
  EXPECT_EQ(d.model.dir, "tests/fixtures/tiny-llama") << "a flag's path is relative to the working directory";
}

TEST(config_overrides, chunks_set_in_the_file_stay) {
  deployment d = parse_ok("[parallel]\nchunks = 1\n");
  overrides o;
  o.stages = 4;
  ASSERT_TRUE(apply_overrides(d, o).ok());
  EXPECT_EQ(d.parallel.chunks, 1);
}

TEST(config_overrides, bad_flag_values_name_the_flag_key_and_rule) {
  deployment d = parse_ok("");
  overrides o;
  o.stages = 0;
  o.tp = 65;
  o.listen = "7600";
  o.model = "";
  auto s = apply_overrides(d, o);
  ASSERT_FALSE(s.ok());
  const std::string& m = s.err().message;
  EXPECT_TRUE(contains(m, "--stages: parallel.stages = 0: must be an integer from 1 to 1024")) << m;
  EXPECT_TRUE(contains(m, "--tp: parallel.tp = 65: must be an integer from 1 to 64")) << m;
  EXPECT_TRUE(contains(m, "--listen: frontend.rpc_listen = \"7600\": must be \"HOST:PORT\"")) << m;
  EXPECT_TRUE(contains(m, "--model: model.dir = \"\": must not be empty")) << m;
  EXPECT_EQ(d.parallel.stages, 1) << "nothing applied";
}

TEST(config_overrides, a_flag_contradicting_the_file_names_both_and_changes_nothing) {
  deployment d = parse_ok("[parallel]\ntype = \"pp\"\nstages = 2\n");
  const deployment before = d;
  overrides o;
  o.tp = 2;
  o.stages = 3;
  auto s = apply_overrides(d, o);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(
      contains(s.err().message,
               "--tp: parallel.type = \"pp\" (deploy.toml:2:8) contradicts parallel.tp = 2: \"pp\" has no "
               "tensor parallelism"))
      << s.err().message;
  EXPECT_EQ(d.parallel.stages, before.parallel.stages);
  EXPECT_EQ(d.parallel.tp, before.parallel.tp);
  EXPECT_EQ(d.origins.size(), before.origins.size());
}

TEST(config_overrides, stages_flag_against_an_explicit_split) {
  deployment d = parse_ok("[parallel]\nstages = 2\nlayers = [3, 1]\n");
  overrides o;
  o.stages = 4;
  auto s = apply_overrides(d, o);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(
      contains(s.err().message,
               "--stages: parallel.layers = [3, 1] (deploy.toml:3:10) has 2 entries but parallel.stages = 4"))
      << s.err().message;
}

TEST(config_validate, a_fitting_model_passes) {
  const deployment d =
      parse_ok("[parallel]\nstages = 2\ntp = 2\nlayers = [3, 1]\n[serving]\nmax_context = 512\n");
  EXPECT_TRUE(validate_against_model(d, 4, 4, 2, 512).ok());
  EXPECT_TRUE(validate_against_model(d, 4, 4, 2).ok()) << "0 = unknown max positions";
}

TEST(config_validate, more_stages_than_layers) {
  const deployment d = parse_ok("[parallel]\nstages = 8\n");
  auto s = validate_against_model(d, 4, 4, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().message,
            "deploy.toml:2:10: parallel.stages = 8: the model has 4 layers, so at most 4 stages");
}

TEST(config_validate, explicit_split_must_cover_every_layer) {
  const deployment d = parse_ok("[parallel]\nstages = 2\nlayers = [2, 1]\n");
  auto s = validate_against_model(d, 4, 4, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.err().message,
                       "deploy.toml:3:10: parallel.layers = [2, 1] adds up to 3 layers, but the model has 4"))
      << s.err().message;
}

TEST(config_validate, tp_must_divide_the_heads_and_lists_what_does) {
  deployment d = parse_ok("");
  overrides o;
  o.tp = 3;
  ASSERT_TRUE(apply_overrides(d, o).ok());
  auto s = validate_against_model(d, 16, 32, 8);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().message,
            "--tp: parallel.tp = 3: must divide the model's 32 attention heads and 8 KV heads (allowed: 1, "
            "2, 4, 8)");
  // KV heads bound it too: 4 divides 32 heads but not 2 KV heads.
  o.tp = 4;
  ASSERT_TRUE(apply_overrides(d, o).ok());
  EXPECT_FALSE(validate_against_model(d, 4, 32, 2).ok());
  EXPECT_TRUE(validate_against_model(d, 4, 32, 8).ok());
}

TEST(config_validate, max_context_within_the_model) {
  const deployment d = parse_ok("[serving]\nmax_context = 8192\n");
  auto s = validate_against_model(d, 4, 4, 2, 4096);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(
      contains(s.err().message, "deploy.toml:2:15: serving.max_context = 8192: the model has 4096 positions"))
      << s.err().message;
}

TEST(config_validate, an_unusable_shape_is_an_error_not_a_crash) {
  const deployment d = parse_ok("");
  EXPECT_FALSE(validate_against_model(d, 0, 4, 2).ok());
  EXPECT_FALSE(validate_against_model(d, 4, 4, 0).ok());
  EXPECT_FALSE(validate_against_model(d, 4, 4, 3).ok());
}

TEST(config_describe, one_line_per_key_with_origins_and_no_secrets) {
  deployment d = parse_ok("[parallel]\nstages = 2\n[cluster]\ntoken = \"hunter2-secret\"\n");
  overrides o;
  o.tp = 2;
  ASSERT_TRUE(apply_overrides(d, o).ok());
  const std::string text = describe(d);
  EXPECT_TRUE(contains(text, "parallel.stages = 2  (deploy.toml:2:10)\n")) << text;
  EXPECT_TRUE(contains(text, "parallel.tp = 2  (--tp)\n")) << text;
  EXPECT_TRUE(contains(text, "parallel.type = \"pptp\"  (default)\n")) << text;
  EXPECT_TRUE(contains(text, "frontend.rpc_listen = \"127.0.0.1:7600\"  (default)\n")) << text;
  EXPECT_TRUE(contains(text, "cluster.recover_stages = true  (default)\n")) << text;
  EXPECT_TRUE(contains(text, "cluster.token = (hidden, 14 chars)")) << text;
  EXPECT_FALSE(contains(text, "hunter2")) << "the token must never reach a log";
  EXPECT_TRUE(contains(text, "serving.prefix_caching = true  (default)\n")) << text;
  EXPECT_TRUE(contains(text, "model.batch_invariant = false (spec_k = 0)  (default)\n")) << text;
  EXPECT_TRUE(contains(text, "serving.queued_steps = true  (default)\n")) << text;
  EXPECT_TRUE(contains(text, "serving.warm_up = true  (default)\n")) << text;
  EXPECT_TRUE(contains(text, "serving.warm_up_batches = [] (none)  (default)\n")) << text;  // a cpu deployment
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 58) << text;  // one per key
}

}  // namespace
}  // namespace conveyor::config
