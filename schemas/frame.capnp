# The header of one activation frame between pipeline stages, and the hello that opens a channel.
# An append-only contract (DESIGN.md): ordinals only grow, fields are never renamed in meaning or
# removed, and every field has a doc comment after it. Bump `frameSchemaVersion` only when an old
# peer could misread a new message (a new field that old peers may ignore needs no bump).
@0xb2eb2f8ab364f6c4;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("conveyor::schema");

const frameSchemaVersion :UInt32 = 2;
# Checked at connect time: both ends of a channel must speak the same version.
# 2: a frame header may also travel in the compact form (transport/src/compact_header.hpp): the
# same fields as FrameHeader, as varints behind the tag CF 56 48 01, used for small headers (decode
# steps) because it fits UCX's inline messages and costs tens of nanoseconds to encode and decode.
# Enum values are the ordinals below. Version-1 peers cannot read it, hence the bump.

enum FrameKind {
  activations @0;
  # Hidden states [tokens, hidden] that the next stage continues from.
  tokens @1;
  # Sampled token ids (i32), one per sequence of the plan, from the last stage.
  logits @2;
  # Logit rows from the last stage, for plans that asked for them.
  control @3;
  # No tensor: a plan-only message (e.g. free a sequence's blocks on every stage).
}

enum DType {
  f32 @0;
  # IEEE binary32.
  bf16 @1;
  # bfloat16 (the upper half of a binary32).
  f16 @2;
  # IEEE binary16.
  i32 @3;
  # Signed 32-bit integer (token ids).
}

enum LogitsMode {
  none @0;
  # Only the sampled token is needed.
  last @1;
  # Logits of the last new position.
  all @2;
  # Logits of every new position (tests, scoring).
}

struct SamplingParams {
  temperature @0 :Float32;
  # 0 selects greedy (argmax) sampling.
  topK @1 :Int32;
  # 0 = no limit.
  topP @2 :Float32 = 1.0;
  # 1 = no limit.
  seed @3 :UInt64;
  # With `step`, fixes the random number drawn, so a replay draws the same token.
  step @4 :UInt64;
  # Position of the token drawn.
}

struct SequenceStep {
  seqId @0 :Int64;
  # The scheduler's id of the sequence; stable for its whole life.
  tokens @1 :List(Int32);
  # New token ids of this step; their count is the step's length for this sequence.
  startPos @2 :Int32;
  # Position of tokens[0]; the KV cache already holds positions [0, startPos).
  blockTable @3 :List(Int32);
  # KV block ids covering positions [0, startPos + len(tokens)).
  logits @4 :LogitsMode;
  # Which logit rows the last stage must return.
  sample @5 :Bool = true;
  # Whether the last stage draws the next token.
  sampling @6 :SamplingParams;
  # How the last stage draws it.
  sampleRows @7 :Int32 = 1;
  # Speculative decoding: the last stage draws after each of the last sampleRows tokens (the last
  # accepted token and the drafts), `sampling.step` being that of the last row; 1 = a plain step.
}

struct TensorDesc {
  dtype @0 :DType;
  # Element type of the payload.
  shape @1 :List(Int64);
  # Dimensions, outermost first; the payload holds exactly product(shape) * size(dtype) bytes.
}

struct FrameHeader {
  kind @0 :FrameKind;
  # What the payload is.
  microbatchId @1 :UInt64;
  # Which of the scheduler's microbatch slots this frame belongs to.
  step @2 :UInt64;
  # The microbatch's step counter; with microbatchId it names the frame for logs and replays.
  seqs @3 :List(SequenceStep);
  # The batch plan, in the order of the tensor's rows.
  tensor @4 :TensorDesc;
  # Shape and type of the payload (an empty shape with no payload for `control`).
}

struct ChannelHello {
  schemaVersion @0 :UInt32;
  # The sender's `frameSchemaVersion`; a mismatch fails the connect on both ends.
  channelId @1 :UInt64;
  # The id both ends were given by the control plane; it routes frames on a shared worker.
  instance @2 :UInt64;
  # Random per process context, so frames of an earlier peer on the same id are told apart.
  maxPayloadBytes @3 :UInt64;
  # The largest payload the sender will accept, so a peer can refuse early.
}
