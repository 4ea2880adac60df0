// Writes the seed inputs of the wire-format fuzz targets (frame_header, rpc_request) with the real
// encoders, so the seeds are what a stage and a client actually send. Seeds derived from files
// (safetensors_header, model_config, deployment) come from make_seeds.py.
// usage: fuzz_make_seeds fuzz/corpus   (built in the fuzz build: ninja -C build-fuzz fuzz_make_seeds)
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "conveyor/schemas/inference.capnp.h"
#include "conveyor/transport/frame_codec.hpp"

namespace {

namespace fs = std::filesystem;
using namespace conveyor;

void write(const fs::path& file, const void* data, std::size_t size) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary).write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  std::printf("%s (%zu bytes)\n", file.c_str(), size);
}

void write_frame(const fs::path& dir, const std::string& name, const transport::frame_header& h) {
  // Both wire forms: Cap'n Proto under the name, the compact form (small headers) beside it.
  auto bytes = transport::encode_header(h, 0, transport::header_form::capnp);
  auto small = transport::encode_header(h);
  if (!bytes || !small) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), (bytes ? small : bytes).err().message.c_str());
    std::exit(1);
  }
  write(dir / name, bytes->data(), bytes->size());
  if (small->size() != bytes->size() || !std::equal(small->begin(), small->end(), bytes->begin())) {
    write(dir / (name + "-compact"), small->data(), small->size());
  }
}

void frame_seeds(const fs::path& dir) {
  using namespace transport;
  sequence_plan prefill;
  prefill.seq_id = 1;
  prefill.tokens = {989, 229, 186};
  prefill.block_table = {0};
  prefill.logits = logits_mode::none;
  prefill.sample = false;
  sequence_plan decode;
  decode.seq_id = 2;
  decode.tokens = {371};
  decode.start_pos = 7;
  decode.block_table = {1};
  decode.logits = logits_mode::last;
  decode.sampling = sampling_params{0.8f, 50, 0.9f, 1, 3};

  frame_header act;
  act.kind = frame_kind::activations;
  act.microbatch_id = 1;
  act.step = 4;
  act.seqs = {prefill, decode};
  act.tensor = {kernels::dtype::f32, {4, 128}};
  write_frame(dir, "activations_two_seqs", act);

  frame_header tokens = act;
  tokens.kind = frame_kind::tokens;
  tokens.tensor = {kernels::dtype::i32, {2}};
  write_frame(dir, "tokens", tokens);

  frame_header logits;
  logits.kind = frame_kind::logits;
  logits.seqs = {decode};
  logits.seqs[0].logits = logits_mode::all;
  logits.tensor = {kernels::dtype::bf16, {1, 1024}};
  write_frame(dir, "logits_bf16", logits);

  frame_header control;
  control.kind = frame_kind::control;
  control.seqs = {prefill};
  write_frame(dir, "control", control);

  auto hello = encode_hello(channel_hello{frame_schema_version(), 1, 0x1234abcd, std::uint64_t{1} << 30});
  write(dir / "hello", hello->data(), hello->size());
}

void write_request(const fs::path& dir, const std::string& name, capnp::MallocMessageBuilder& message) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  write(dir / name, bytes.begin(), bytes.size());
}

void rpc_seeds(const fs::path& dir) {
  namespace wire = schema::rpc;
  {
    capnp::MallocMessageBuilder m;
    auto r = m.initRoot<wire::GenerateRequest>();
    const std::vector<std::int32_t> prompt = {989, 229, 186, 822, 100, 504, 324};
    auto ids = r.initPromptIds(static_cast<unsigned>(prompt.size()));
    for (unsigned i = 0; i < prompt.size(); ++i) ids.set(i, prompt[i]);
    r.setMaxNewTokens(24);
    r.setIgnoreEos(true);
    write_request(dir, "greedy", m);
  }
  {
    capnp::MallocMessageBuilder m;
    auto r = m.initRoot<wire::GenerateRequest>();
    auto ids = r.initPromptIds(3);
    for (unsigned i = 0; i < 3; ++i) ids.set(i, static_cast<std::int32_t>(100 + i));
    r.setMaxNewTokens(64);
    auto s = r.initSampling();
    s.setTemperature(0.8f);
    s.setTopK(50);
    s.setTopP(0.9f);
    s.setSeed(1);
    auto stop = r.initStopIds(2);
    stop.set(0, 2);
    stop.set(1, 13);
    r.setDeadlineS(30.0);
    write_request(dir, "sampled_with_stops", m);
  }
  {
    capnp::MallocMessageBuilder m;
    m.initRoot<wire::GenerateRequest>();
    write_request(dir, "empty", m);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const fs::path corpus(argv[1]);
  frame_seeds(corpus / "frame_header");
  rpc_seeds(corpus / "rpc_request");
  return 0;
}
