// Frame header codec: round trips, and every kind of bad input comes back as an error value.
#include <gtest/gtest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstring>
#include <limits>
#include <random>

#include "conveyor/schemas/frame.capnp.h"
#include "conveyor/transport/frame_codec.hpp"
#include "frame_pattern.hpp"

namespace conveyor::transport {
namespace {

frame_header activations_header() {
  frame_header h;
  h.kind = frame_kind::activations;
  h.microbatch_id = 3;
  h.step = 17;
  for (int s = 0; s < 3; ++s) {
    sequence_plan p;
    p.seq_id = 1000 + s;
    p.tokens = s == 0 ? std::vector<std::int32_t>{11, 12, 13, 14} : std::vector<std::int32_t>{42};
    p.start_pos = s == 0 ? 0 : 30 + s;
    p.block_table = {s, 10 + s, 20 + s};
    p.logits = s == 2 ? logits_mode::all : logits_mode::last;
    p.sample = s != 1;
    p.sampling = {0.8f, 50, 0.95f, 1234u + s, 9u};
    if (s == 1) p.sample_rows = 3;
    h.seqs.push_back(p);
  }
  h.tensor.type = kernels::dtype::bf16;
  h.tensor.shape = {6, 2048};  // 4 + 1 + 1 new tokens
  return h;
}

std::vector<std::byte> flat(capnp::MessageBuilder& m) {
  auto words = capnp::messageToFlatArray(m);
  auto bytes = words.asBytes();
  std::vector<std::byte> v(bytes.size());
  std::memcpy(v.data(), bytes.begin(), bytes.size());
  return v;
}

constexpr header_form both_forms[] = {header_form::automatic, header_form::capnp};

TEST(FrameCodec, RoundTripsEveryField) {
  for (auto form : both_forms) {
    auto h = activations_header();
    auto bytes = encode_header(h, 0, form);
    ASSERT_TRUE(bytes.ok());
    auto back = decode_header(*bytes);
    ASSERT_TRUE(back.ok()) << back.err().message;
    EXPECT_EQ(*back, h);
    EXPECT_TRUE(check_payload_size(h, 6 * 2048 * 2).ok());
  }
}

TEST(FrameCodec, DecodesIntoAReusedHeaderAndEncodesIntoAUsedVector) {
  // receive_into decodes each frame into the previous frame's header, and a send state encodes into
  // its previous header's vector: nothing of the earlier header may survive, in either form.
  frame_header small;
  small.kind = frame_kind::logits;
  small.microbatch_id = 9;
  sequence_plan p;
  p.seq_id = 1;
  p.tokens = {7};
  p.start_pos = 3;
  p.block_table = {0};
  small.seqs.push_back(p);
  small.tensor.type = kernels::dtype::i32;
  small.tensor.shape = {2};
  frame_header control;
  control.kind = frame_kind::control;
  control.step = 4;
  for (auto form : both_forms) {
    frame_header reused;
    std::vector<std::byte> out(500, std::byte{0xAB});
    for (const auto& h : {activations_header(), small, activations_header(), control, small}) {
      ASSERT_TRUE(encode_header_into(h, out, 48, form, 8).ok());
      auto fresh = encode_header(h, 48, form);
      ASSERT_TRUE(fresh.ok());
      ASSERT_EQ(out.size(), fresh->size());
      EXPECT_TRUE(std::equal(out.begin() + 48, out.end(), fresh->begin() + 48));
      auto st = decode_header_into(std::span(out).subspan(48), reused);
      ASSERT_TRUE(st.ok()) << st.err().message;
      EXPECT_EQ(reused, h);
    }
  }
}

TEST(FrameCodec, SmallHeadersTakeTheCompactFormAndLargeOnesCapnProto) {
  auto small = *encode_header(activations_header());
  EXPECT_LT(small.size(), 128u);
  EXPECT_EQ(small[0], std::byte{0xCF});  // the compact tag
  auto capnp = *encode_header(activations_header(), 0, header_form::capnp);
  EXPECT_GT(capnp.size(), 2 * small.size());
  auto h = activations_header();
  h.seqs[0].block_table.assign(1000, 7);
  auto big = *encode_header(h);
  EXPECT_NE(big[0], std::byte{0xCF});
  EXPECT_EQ(*decode_header(big), h);
  // Extremes of every integer field survive the varints.
  h = activations_header();
  h.kind = frame_kind::logits;
  h.microbatch_id = ~std::uint64_t{0};
  h.step = std::uint64_t{1} << 63;
  h.seqs[0].seq_id = std::numeric_limits<std::int64_t>::min();
  h.seqs[1].seq_id = std::numeric_limits<std::int64_t>::max();
  h.seqs[0].start_pos = std::numeric_limits<std::int32_t>::max();
  h.seqs[0].tokens = {std::numeric_limits<std::int32_t>::min(), -1, 0, std::numeric_limits<std::int32_t>::max()};
  h.seqs[0].sampling.seed = ~std::uint64_t{0};
  h.seqs[2].sampling = {};  // defaults are elided on the wire
  h.seqs[2].sample_rows = -4;
  h.tensor = {kernels::dtype::f16, {0, 3, 1}};
  auto extremes = *encode_header(h);
  ASSERT_EQ(extremes[0], std::byte{0xCF});
  auto back = decode_header(extremes);
  ASSERT_TRUE(back.ok()) << back.err().message;
  EXPECT_EQ(*back, h);
}

TEST(FrameCodec, BadCompactHeadersAreErrors) {
  auto bytes = *encode_header(activations_header());
  ASSERT_EQ(bytes[0], std::byte{0xCF});
  // Every truncation and every extension fails cleanly.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(decode_header(std::span<const std::byte>(bytes.data(), n)).ok()) << "truncated to " << n;
  }
  auto longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_NE(decode_header(longer).err().message.find("trailing"), std::string::npos);
  auto newer = bytes;
  newer[3] = std::byte{2};
  EXPECT_NE(decode_header(newer).err().message.find("version 2"), std::string::npos);
  auto kind = bytes;
  kind[4] = std::byte{0x17};  // dtype 1, kind 7
  EXPECT_NE(decode_header(kind).err().message.find("frame kind"), std::string::npos);
  kind[4] = std::byte{0x70};
  EXPECT_NE(decode_header(kind).err().message.find("dtype"), std::string::npos);
  // A forged huge count is refused before anything is allocated for it; so is an overlong varint.
  std::vector<std::byte> huge = {std::byte{0xCF}, std::byte{0x56}, std::byte{0x48}, std::byte{0x01}, std::byte{0x02},
                                 std::byte{0}, std::byte{0}, std::byte{0}};
  for (int i = 0; i < 9; ++i) huge.push_back(std::byte{0xff});
  huge.push_back(std::byte{0x01});
  EXPECT_FALSE(decode_header(huge).ok());
  huge.back() = std::byte{0x7f};  // an 11th byte's worth: over 64 bits
  EXPECT_FALSE(decode_header(huge).ok());
  // The shared plan checks apply to this form too (InconsistentPlansAreRejected runs both forms).
  codec_limits tight;
  tight.max_header_bytes = 16;
  EXPECT_NE(decode_header(bytes, tight).err().message.find("over the limit"), std::string::npos);
  // Flipped bytes and random tails behind the tag: never a crash.
  std::mt19937_64 rng(11);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      auto copy = bytes;
      copy[i] ^= static_cast<std::byte>(1 << bit);
      if (auto r = decode_header(copy); r.ok()) EXPECT_TRUE(encode_header(*r).ok());
    }
  }
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::byte> junk(bytes.begin(), bytes.begin() + 4);
    junk.resize(4 + rng() % 64);
    for (std::size_t k = 4; k < junk.size(); ++k) junk[k] = static_cast<std::byte>(rng());
    (void)decode_header(junk);
  }
}

TEST(FrameCodec, DecodesFromAnUnalignedBuffer) {
  auto bytes = encode_header(activations_header(), 0, header_form::capnp);
  std::vector<std::byte> shifted(bytes->size() + 1);
  std::memcpy(shifted.data() + 1, bytes->data(), bytes->size());
  auto back = decode_header(std::span<const std::byte>(shifted).subspan(1));
  ASSERT_TRUE(back.ok()) << back.err().message;
  EXPECT_EQ(*back, activations_header());
}

TEST(FrameCodec, PayloadSizeMismatchNamesBothSizes) {
  auto h = activations_header();
  auto st = check_payload_size(h, 100);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("truncated"), std::string::npos) << st.err().message;
  EXPECT_NE(st.err().message.find("24576"), std::string::npos) << st.err().message;
  EXPECT_NE(check_payload_size(h, 6 * 2048 * 2 + 1).err().message.find("trailing"), std::string::npos);
}

TEST(FrameCodec, DecodeFrameHeaderIsDecodeThenThePayloadCheck) {
  // A channel's receive (decode_frame_header) takes a compact header's tensor size from its decode:
  // the same answers as decode_header_into followed by check_payload_size, in both forms, for a
  // tensor, an empty shape (no payload) and a malformed header.
  auto tensorless = activations_header();
  tensorless.kind = frame_kind::logits;
  tensorless.tensor.shape.clear();
  for (auto form : both_forms) {
    for (const auto& h : {activations_header(), tensorless}) {
      auto bytes = *encode_header(h, 0, form);
      const std::uint64_t want = *payload_bytes(h.tensor);
      frame_header out;
      ASSERT_TRUE(decode_frame_header(bytes, want, out).ok());
      EXPECT_EQ(out, h);
      for (std::uint64_t wrong : {want + 1, want + 8, want / 2 + (want == 0 ? 3 : 0)}) {
        auto st = decode_frame_header(bytes, wrong, out);
        auto expected = check_payload_size(h, wrong);
        ASSERT_FALSE(st.ok());
        EXPECT_EQ(st.err().message, expected.err().message);
      }
    }
  }
  auto bytes = *encode_header(activations_header());
  bytes.pop_back();
  frame_header out;
  auto st = decode_frame_header(bytes, 6 * 2048 * 2, out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.err().message, decode_header_into(bytes, out).err().message);
}

TEST(FrameCodec, GarbageTruncationAndRandomBytesAreErrors) {
  auto bytes = *encode_header(activations_header(), 0, header_form::capnp);
  EXPECT_FALSE(decode_header({}).ok());
  std::vector<std::byte> odd(bytes.begin(), bytes.begin() + 13);
  EXPECT_NE(decode_header(odd).err().message.find("8-byte words"), std::string::npos);
  // Every word-aligned truncation fails cleanly (no crash, no exception).
  for (std::size_t n = 8; n < bytes.size(); n += 8) {
    auto r = decode_header(std::span<const std::byte>(bytes.data(), n));
    EXPECT_FALSE(r.ok()) << "truncated to " << n << " bytes decoded";
  }
  std::mt19937_64 rng(7);
  int rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::byte> junk(8 * (1 + rng() % 64));
    for (auto& b : junk) b = static_cast<std::byte>(rng());
    if (!decode_header(junk).ok()) ++rejected;
  }
  EXPECT_GT(rejected, 1900);
  // Flipped bytes inside a real header: must never crash; most are caught.
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    auto copy = bytes;
    copy[i] ^= std::byte{0xff};
    (void)decode_header(copy);
  }
}

TEST(FrameCodec, LimitsBoundSizeAndTraversal) {
  auto h = activations_header();
  h.seqs[0].block_table.assign(100000, 1);
  auto bytes = *encode_header(h);
  codec_limits small;
  small.max_header_bytes = 1024;
  EXPECT_NE(decode_header(bytes, small).err().message.find("over the limit"), std::string::npos);
  codec_limits shallow;
  shallow.max_traversal_words = 1000;
  auto r = decode_header(bytes, shallow);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::bad_format);
  codec_limits few;
  few.max_seqs = 2;
  for (auto form : both_forms) {
    EXPECT_NE(decode_header(*encode_header(activations_header(), 0, form), few).err().message.find("sequences"),
              std::string::npos);
  }
}

TEST(FrameCodec, InconsistentPlansAreRejected) {
  auto check = [](frame_header h, const char* needle) {
    for (auto form : both_forms) {
      auto r = decode_header(*encode_header(h, 0, form));
      ASSERT_FALSE(r.ok()) << "expected: " << needle;
      EXPECT_NE(r.err().message.find(needle), std::string::npos) << r.err().message;
    }
  };
  auto h = activations_header();
  h.seqs[1].start_pos = -1;
  check(h, "start_pos");
  h = activations_header();
  h.seqs[2].block_table[1] = -5;
  check(h, "block id");
  h = activations_header();
  h.tensor.shape = {5, 2048};
  check(h, "6 rows");
  h = activations_header();
  h.tensor.shape = {6, -2048};
  check(h, "negative");
  h = activations_header();
  h.tensor.shape = {1ll << 40, 1ll << 40};
  h.kind = frame_kind::logits;
  check(h, "overflows");
  h = activations_header();
  h.seqs[0].sampling.top_p = 0.0f;
  check(h, "top_p");
  h = activations_header();
  h.kind = frame_kind::control;
  check(h, "control");
}

TEST(FrameCodec, WeightOnlyDtypesCannotTravel) {
  // i8 / f8e4m3 exist for quantized weights; a frame carrying one must fail to encode (the wire has
  // no value for them), in either form, not go out labelled f32.
  for (auto t : {kernels::dtype::i8, kernels::dtype::f8e4m3}) {
    for (auto form : both_forms) {
      auto h = activations_header();
      h.tensor.type = t;
      auto r = encode_header(h, 0, form);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.err().code, errc::invalid_argument);
      EXPECT_NE(r.err().message.find(std::string(kernels::dtype_name(t))), std::string::npos) << r.err().message;
    }
  }
}

TEST(FrameCodec, UnknownEnumValuesFromANewerPeerAreErrors) {
  capnp::MallocMessageBuilder m;
  auto b = m.initRoot<schema::FrameHeader>();
  b.setKind(static_cast<schema::FrameKind>(42));
  auto r = decode_header(flat(m));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("frame kind"), std::string::npos) << r.err().message;
  capnp::MallocMessageBuilder m2;
  auto b2 = m2.initRoot<schema::FrameHeader>();
  b2.setKind(schema::FrameKind::LOGITS);
  b2.initTensor().setDtype(static_cast<schema::DType>(9));
  EXPECT_NE(decode_header(flat(m2)).err().message.find("dtype"), std::string::npos);
}

TEST(FrameCodec, HelloRoundTripsAndCarriesTheSchemaVersion) {
  channel_hello h{frame_schema_version(), 77, 0xfeedface, 1u << 20};
  auto back = decode_hello(*encode_hello(h));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->schema_version, 2u);
  EXPECT_EQ(back->channel_id, 77u);
  EXPECT_EQ(back->instance, 0xfeedfaceu);
  EXPECT_EQ(back->max_payload_bytes, 1u << 20);
  std::vector<std::byte> junk(24, std::byte{0x99});
  EXPECT_FALSE(decode_hello(junk).ok());
}

}  // namespace
}  // namespace conveyor::transport
