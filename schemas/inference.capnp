# The client-facing RPC contract: generate tokens, stream them back, ask for health, stats and model info.
# An append-only contract (DESIGN.md): ordinals only grow, a field never changes meaning and is never
# removed, and every field has a doc comment after it. A new field that old peers may ignore needs no
# version bump; bump `inferenceProtocolVersion` only when an old peer could misread a new message.
#
# Errors, by design:
# - Everything the server decides about one request (a bad prompt, an out-of-range parameter, a full
#   queue, a failed stage) comes back as a value: `GenerateSummary.finishReason = error` with `error`
#   set. The tokens already streamed stay valid.
# - A Cap'n Proto exception means the call itself failed: protocol version mismatch (from `handshake`),
#   a message over the server's size limit, a lost connection. Its description says why.
# Cancel a request by dropping (cancelling) the `generate` call, or by closing the connection: the
# server cancels it in the serving side, which frees its KV blocks on every stage.
@0xaab71abc4ac670b2;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("conveyor::schema::rpc");

const inferenceProtocolVersion :UInt32 = 1;
# The version this schema describes. A server accepts clients whose version lies between its
# `minProtocolVersion` and its own `protocolVersion` (see `Inference.handshake`).

interface Inference {
  handshake @0 (clientProtocolVersion :UInt32, clientName :Text) -> (info :ServerVersion);
  # Call first on a new connection. Throws an exception naming both versions when the server can't
  # speak the client's version; otherwise returns the server's. Other methods work without it, but a
  # client that skips it may misread replies from a newer server.

  generate @1 (request :GenerateRequest, sink :TokenSink) -> (summary :GenerateSummary);
  # Runs one request. New token ids stream to `sink` as they are sampled (in batches when the client
  # reads slower than the server produces); `sink.flush` is called before this returns, so every
  # token has been delivered when the summary arrives. Dropping this call cancels the request.

  health @2 () -> (health :Health);
  # Whether the server can serve, and the state of every stage.

  stats @3 () -> (stats :Stats);
  # Counters since the server started, and the KV cache's occupancy.

  info @4 () -> (info :ModelInfo);
  # The model that is served and how it is split.
}

interface TokenSink {
  # Implemented by the client; the server calls it.

  tokens @0 (ids :List(Int32)) -> stream;
  # New token ids of the request, in order; never empty. A streaming call: the server sends the next
  # batch when flow control allows, and collects tokens meanwhile, so a slow client gets bigger batches
  # and never stalls the model.

  flush @1 () -> ();
  # Called once after the last `tokens`. It returns after every earlier `tokens` call was delivered
  # (calls on one capability are delivered in order).
}

struct ServerVersion {
  protocolVersion @0 :UInt32;
  # The newest protocol version the server speaks (its `inferenceProtocolVersion`).
  minProtocolVersion @1 :UInt32;
  # The oldest client version it still accepts.
  server @2 :Text;
  # Name and build of the server, for humans, e.g. "conveyor 0.1.0".
}

struct SamplingParams {
  temperature @0 :Float32 = 0.0;
  # 0 = greedy (argmax); otherwise logits are divided by it before softmax. Must be in [0, 100].
  topK @1 :Int32 = 0;
  # Keep only the k most likely tokens; 0 = no limit. Must be >= 0.
  topP @2 :Float32 = 1.0;
  # Nucleus sampling: keep the smallest set of tokens whose probability reaches p. Must be in (0, 1].
  seed @3 :UInt64 = 0;
  # With temperature > 0, fixes the random numbers: the same seed gives the same tokens.
}

struct GenerateRequest {
  promptIds @0 :List(Int32);
  # The prompt as token ids; must not be empty, each id in [0, vocabSize).
  maxNewTokens @1 :Int32 = 16;
  # How many tokens to generate at most; at least 1. Prompt + new tokens must fit in `ModelInfo.maxContext`.
  sampling @2 :SamplingParams;
  # How each token is drawn; unset means greedy.
  stopIds @3 :List(Int32);
  # Extra ids that end the sequence (besides the model's EOS); the stop id is streamed.
  ignoreEos @4 :Bool = false;
  # Keep generating past the model's EOS token (benchmarks, golden tests).
  deadlineS @5 :Float64 = 0.0;
  # Seconds from submission after which the server gives up with an error; 0 = the server's default.
}

enum FinishReason {
  length @0;
  # `maxNewTokens` were generated (or the context is full).
  stop @1;
  # The model's EOS or one of `stopIds` was generated.
  cancelled @2;
  # The request was cancelled (by the server or an operator; a client that cancels never sees this).
  error @3;
  # The request failed; `GenerateSummary.error` says why.
}

enum ErrorCode {
  none @0;
  # No error.
  invalidArgument @1;
  # The request is malformed or a parameter is out of range; fix the request before retrying.
  notFound @2;
  # Something the request refers to does not exist.
  badFormat @3;
  # Malformed bytes.
  unsupported @4;
  # Well formed but not something the server implements.
  outOfMemory @5;
  # No room (KV blocks, queue slots); retrying later may succeed.
  io @6;
  # The operating system refused an operation.
  internal @7;
  # The server failed (a stage died, a device error); not the client's fault.
  overloaded @8;
  # The server has no room for the request now (job queue caps, or a job ticket it cannot grant at
  # once); the message says why. Nothing was started: retrying after a short backoff may succeed.
  deadlineExceeded @9;
  # The request passed its deadline (`deadlineS`, at most the server's response timeout) and was
  # cancelled everywhere; tokens already streamed stand.
}

struct Error {
  code @0 :ErrorCode;
  # The class of the failure, so a client can decide whether to retry without parsing `message`.
  message @1 :Text;
  # What went wrong, in words a user can act on.
}

struct GenerateSummary {
  promptTokens @0 :Int32;
  # Tokens in the prompt.
  completionTokens @1 :Int32;
  # Tokens generated (and streamed) for this request.
  finishReason @2 :FinishReason;
  # Why the request ended.
  error @3 :Error;
  # Set when `finishReason` is `error`; `code` is `none` otherwise.
  queueS @4 :Float64;
  # Seconds from submission to the first scheduled step.
  firstTokenS @5 :Float64;
  # Seconds from submission to the first token.
  totalS @6 :Float64;
  # Seconds from submission to the end of the request.
}

struct StageHealth {
  stage @0 :Int32;
  # Pipeline stage index, from 0 (the embedding) to stages - 1 (the LM head).
  tpRank @1 :Int32;
  # Rank inside the stage's tensor-parallel group.
  state @2 :Text;
  # "starting" | "loading" | "ready" | "failed" | "stopped".
  detail @3 :Text;
  # Load progress, or what failed.
}

struct Health {
  ready @0 :Bool;
  # True once a canary token has passed every stage: requests will be served.
  stages @1 :List(StageHealth);
  # One entry per stage and TP rank.
}

struct Stats {
  requestsRunning @0 :Int64;
  # Requests being generated now.
  requestsWaiting @1 :Int64;
  # Requests queued, not yet scheduled.
  requestsFinished @2 :Int64;
  # Requests that ended normally (length, stop, or cancelled) since start.
  requestsFailed @3 :Int64;
  # Requests that ended with an error since start.
  tokensGenerated @4 :Int64;
  # Tokens generated for all requests since start.
  kvBlocksTotal @5 :Int32;
  # KV cache blocks the server has.
  kvBlocksFree @6 :Int32;
  # KV cache blocks not held by any request.
  stageBusyS @7 :List(Float64);
  # Per stage: seconds spent computing.
  stageIdleS @8 :List(Float64);
  # Per stage: seconds spent waiting for work (the pipeline bubble).
  rpcConnections @9 :Int32;
  # Clients connected to this RPC frontend now.
  rpcGenerateCalls @10 :Int32;
  # `generate` calls in progress on this RPC frontend now.
  requestsRejected @11 :Int64;
  # Requests admission control turned away as `overloaded` (queue caps, job tickets) since start;
  # none of them started.
  requestsExpired @12 :Int64;
  # Requests cancelled at their deadline since start (`deadlineExceeded`; also in `requestsFailed`).
  preemptions @13 :Int64;
  # Times a running sequence gave its KV blocks back under memory pressure since start; it is
  # re-prefilled later and its tokens do not change.
  kvBlocksCached @14 :Int32;
  # KV blocks naming a prompt prefix that later prompts can share (the prefix cache).
  prefixCacheQueriedTokens @15 :Int64;
  # Prompt tokens looked up in the prefix cache since start (whole blocks only).
  prefixCacheHitTokens @16 :Int64;
  # Of those, tokens found cached: their prefill was skipped. 0 when prefix caching is off.
  errorsByKind @17 :List(ErrorCount);
  # Every error the serving side answered a request with since start, by kind; kinds never seen are
  # left out.
  microbatches @18 :Int32;
  # Microbatch slots the scheduler keeps (`ModelInfo.chunks`).
  microbatchesInFlight @19 :Int32;
  # Of those, microbatches whose step is on the stages now.
  specSteps @20 :Int64;
  # Speculative decoding (`model.spec_k` > 0): sequence steps that carried draft tokens since start.
  specDraftTokens @21 :Int64;
  # Draft tokens the model verified.
  specAcceptedTokens @22 :Int64;
  # Of those, kept (acceptance rate = specAcceptedTokens / specDraftTokens).
  specEmittedTokens @23 :Int64;
  # Tokens those steps produced (per step: the speed-up over plain decoding, at most spec_k + 1).
  stepsQueuedAhead @24 :Int64;
  # Steps planned before the tokens of the step in flight came back and chained on the stage
  # (`serving.queued_steps`, a cluster of one stage on one rank); 0 elsewhere.
}

struct ErrorCount {
  kind @0 :Text;
  # The error's kind: "invalid_argument", "overloaded", "deadline_exceeded", "internal", ... (the
  # snake_case spelling of `ErrorCode`).
  count @1 :Int64;
  # How many requests got it.
}

struct ModelInfo {
  modelDir @0 :Text;
  # Where the server loaded the model from.
  modelType @1 :Text;
  # The HF `model_type`, e.g. "llama", "qwen2", "mistral".
  vocabSize @2 :Int32;
  # Token ids must be below this.
  numLayers @3 :Int32;
  # Transformer layers in the model.
  hiddenSize @4 :Int32;
  # Width of the hidden state.
  stages @5 :Int32;
  # Pipeline stages the model is split into.
  tp @6 :Int32;
  # Tensor-parallel degree of each stage.
  chunks @7 :Int32;
  # Microbatches kept in flight through the pipeline.
  maxContext @8 :Int32;
  # Most tokens (prompt + generated) one request may hold; 0 = not limited by the server.
}
