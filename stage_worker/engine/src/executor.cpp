#include "conveyor/engine/executor.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace conveyor::engine {

namespace {
std::string seq_name(const sequence_step& s) { return "sequence " + std::to_string(s.seq_id); }
}  // namespace

result<std::unique_ptr<stage_executor>> stage_executor::create(kernels::backend& backend, checkpoint& ckpt,
                                                               const model_config& config, stage_range range,
                                                               const executor_options& options,
                                                               kernels::collective* collective) {
  if (range.first_layer < 0 || range.last_layer > config.num_layers || range.first_layer > range.last_layer) {
    return make_error(errc::invalid_argument, "layer range [" + std::to_string(range.first_layer) + ", " +
                                                  std::to_string(range.last_layer) + ") is outside the model's " +
                                                  std::to_string(config.num_layers) + " layers");
  }
  if (options.max_step_tokens < 1 || options.max_seqs < 1 || options.kv_blocks < 1 || options.kv_block_size < 1 ||
      options.max_recorded_steps < 1) {
    return make_error(errc::invalid_argument, "executor options must be positive");
  }
  std::unique_ptr<stage_executor> ex(new stage_executor(backend, config, range, options));
  CONVEYOR_TRY_ASSIGN(tp, make_tp_layout(config, collective ? collective->rank() : 0, collective ? collective->size() : 1));
  ex->collective_ = collective != nullptr && collective->size() > 1 ? collective : nullptr;
  ex->ffn_ = tp.ffn;
  CONVEYOR_TRY_ASSIGN(weights, stage_weights::load(backend, ckpt, config, range, tp, options.quant, options.on_layer_loaded));
  ex->weights_ = std::move(weights);
  CONVEYOR_TRY_ASSIGN(kv, kv_pools::create(backend, range.num_layers(), options.kv_blocks, options.kv_block_size,
                                           tp.kv_heads, config.head_dim));
  ex->kv_ = std::move(kv);

  const rope_tables rope = compute_rope_tables(config);
  ex->inv_freq_ = device_buffer(backend, rope.inv_freq.size() * sizeof(float));
  ex->attention_scaling_ = rope.attention_scaling;
  ex->shape_ = kernels::attn_shape{tp.heads, tp.kv_heads, config.head_dim,
                                   1.0f / std::sqrt(static_cast<float>(config.head_dim)), 0};

  const std::size_t act = kernels::dtype_size(backend.caps().act_dtype);
  const std::size_t t = options.max_step_tokens;
  const std::size_t h = config.hidden_size;
  const std::size_t qkv_w = static_cast<std::size_t>(tp.heads + 2 * tp.kv_heads) * config.head_dim;
  const std::size_t attn_w = static_cast<std::size_t>(tp.heads) * config.head_dim;
  const std::size_t f = tp.ffn;
  ex->residual_ = device_buffer(backend, t * h * act);
  ex->normed_ = device_buffer(backend, t * h * act);
  ex->delta_ = device_buffer(backend, t * h * act);
  if (range.num_layers() > 0) {
    ex->qkv_ = device_buffer(backend, t * qkv_w * act);
    ex->attn_ = device_buffer(backend, t * attn_w * act);
    ex->gate_up_ = device_buffer(backend, t * 2 * f * act);
    ex->act_ = device_buffer(backend, t * f * act);
  }
  const std::size_t max_rows = t;  // logits rows never exceed the step's tokens
  if (range.has_head) {
    ex->head_in_ = device_buffer(backend, max_rows * h * act);
    ex->logits_ = device_buffer(backend, max_rows * config.vocab_size * act);
  }
  const int max_ctx = std::max(1, std::min(options.kv_blocks * options.kv_block_size,
                                           std::max(config.max_position_embeddings, options.kv_block_size)));
  ex->max_blocks_per_seq_ = (max_ctx + options.kv_block_size - 1) / options.kv_block_size;
  std::size_t ints = 3 * t + 2 * options.max_seqs + 1 +
                     static_cast<std::size_t>(options.max_seqs) * ex->max_blocks_per_seq_ + max_rows;
  if (const std::size_t rw = std::min<std::size_t>(t, std::max(0, backend.caps().row_invariant_rows)); rw > 0) {
    ints += 2 * rw + 1 + rw * ex->max_blocks_per_seq_;  // row-wise q_start, ctx_len and block tables
  }
  ex->plan_ints_ = device_buffer(backend, ints * sizeof(std::int32_t));
  ex->host_ints_.reserve(ints);
  for (const device_buffer* b : {&ex->inv_freq_, &ex->residual_, &ex->normed_, &ex->delta_, &ex->plan_ints_}) {
    if (!b->valid()) return make_error(errc::out_of_memory, "out of " + backend.caps().name + " memory for the step workspace");
  }
  if ((range.num_layers() > 0 && (!ex->qkv_.valid() || !ex->attn_.valid() || !ex->gate_up_.valid() || !ex->act_.valid())) ||
      (range.has_head && (!ex->head_in_.valid() || !ex->logits_.valid()))) {
    return make_error(errc::out_of_memory, "out of " + backend.caps().name + " memory for the step workspace");
  }
  backend.upload(ex->inv_freq_.get(), rope.inv_freq.data(), rope.inv_freq.size() * sizeof(float));
  return ex;
}

status stage_executor::validate(const step_plan& plan, std::size_t hidden_values) const {
  auto bad = [](std::string what) { return make_error(errc::invalid_argument, std::move(what)); };
  if (plan.seqs.empty()) return bad("a step needs at least one sequence");
  if (static_cast<int>(plan.seqs.size()) > options_.max_seqs) {
    return bad("step has " + std::to_string(plan.seqs.size()) + " sequences, the limit is " + std::to_string(options_.max_seqs));
  }
  const int total = plan.num_tokens();
  if (total > options_.max_step_tokens) {
    return bad("step has " + std::to_string(total) + " tokens, the workspace holds " + std::to_string(options_.max_step_tokens));
  }
  const int bs = options_.kv_block_size;
  for (const auto& s : plan.seqs) {
    const int n = static_cast<int>(s.tokens.size());
    if (n == 0) return bad(seq_name(s) + " has no new tokens");
    if (s.start_pos < 0) return bad(seq_name(s) + " has a negative start position");
    const long long end = static_cast<long long>(s.start_pos) + n;
    if (end > static_cast<long long>(max_blocks_per_seq_) * bs) {
      return bad(seq_name(s) + " reaches position " + std::to_string(end) + ", beyond the context limit of " +
                 std::to_string(max_blocks_per_seq_ * bs));
    }
    const long long need = (end + bs - 1) / bs;
    if (static_cast<long long>(s.block_table.size()) < need) {
      return bad(seq_name(s) + " has " + std::to_string(s.block_table.size()) + " KV blocks, needs " + std::to_string(need));
    }
    for (long long i = 0; i < need; ++i) {
      if (s.block_table[i] < 0 || s.block_table[i] >= options_.kv_blocks) {
        return bad(seq_name(s) + " names KV block " + std::to_string(s.block_table[i]) + ", the cache has " +
                   std::to_string(options_.kv_blocks));
      }
    }
    if (range_.has_embedding) {
      for (auto id : s.tokens) {
        if (id < 0 || id >= config_.vocab_size) {
          return bad(seq_name(s) + ": token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                     std::to_string(config_.vocab_size) + ")");
        }
      }
    }
    if (s.sample && s.sampling.top_p <= 0.0f) return bad(seq_name(s) + ": top_p must be in (0, 1]");
    if (s.sample_rows < 1 || s.sample_rows > n) {
      return bad(seq_name(s) + " samples " + std::to_string(s.sample_rows) + " rows of " + std::to_string(n) +
                 " new tokens");
    }
    if (s.sample_rows > 1 && (!s.sample || s.logits == logits_mode::all)) {
      return bad(seq_name(s) + ": sample_rows > 1 needs sample and no logits_mode::all");
    }
    if (s.sample_rows > 1 && s.sampling.step < static_cast<std::uint64_t>(n - 1)) {
      return bad(seq_name(s) + ": sampling step " + std::to_string(s.sampling.step) + " is before its first row");
    }
  }
  if (range_.has_embedding && hidden_values != 0) return bad("the first stage takes token ids, not activations");
  if (!range_.has_embedding && hidden_values != static_cast<std::size_t>(total) * config_.hidden_size) {
    return bad("activations hold " + std::to_string(hidden_values) + " values, the plan needs " +
               std::to_string(static_cast<std::size_t>(total) * config_.hidden_size));
  }
  return ok_status();
}

void stage_executor::upload_plan(const step_plan& plan, bool fixed_shape) {
  const int bs = options_.kv_block_size;
  const int num_seqs = static_cast<int>(plan.seqs.size());
  const int total = plan.num_tokens();
  int max_blocks = 1, max_ctx = 0, max_q = 0;
  for (const auto& s : plan.seqs) {
    const int end = s.start_pos + static_cast<int>(s.tokens.size());
    max_blocks = std::max(max_blocks, (end + bs - 1) / bs);
    max_ctx = std::max(max_ctx, end);
    max_q = std::max(max_q, static_cast<int>(s.tokens.size()));
  }
  if (fixed_shape) {  // contexts up to a power of two (at least 256) share one recording
    int bucket = 256;
    while (bucket < max_ctx) bucket *= 2;
    max_blocks = std::min((bucket + bs - 1) / bs, max_blocks_per_seq_);
    max_ctx = max_blocks * bs;
  }
  auto& v = host_ints_;
  v.clear();
  for (const auto& s : plan.seqs) v.insert(v.end(), s.tokens.begin(), s.tokens.end());  // ids
  for (const auto& s : plan.seqs)                                                          // positions
    for (int i = 0; i < static_cast<int>(s.tokens.size()); ++i) v.push_back(s.start_pos + i);
  for (const auto& s : plan.seqs)                                                          // slots
    for (int i = 0; i < static_cast<int>(s.tokens.size()); ++i) {
      const int pos = s.start_pos + i;
      v.push_back(s.block_table[pos / bs] * bs + pos % bs);
    }
  const std::size_t q_start_at = v.size();
  int acc = 0;
  for (const auto& s : plan.seqs) {
    v.push_back(acc);
    acc += static_cast<int>(s.tokens.size());
  }
  v.push_back(acc);
  const std::size_t ctx_at = v.size();
  for (const auto& s : plan.seqs) v.push_back(s.start_pos + static_cast<int>(s.tokens.size()));
  const std::size_t table_at = v.size();
  for (const auto& s : plan.seqs) {
    const int used = std::min(static_cast<int>(s.block_table.size()), max_blocks);
    v.insert(v.end(), s.block_table.begin(), s.block_table.begin() + used);
    v.insert(v.end(), max_blocks - used, 0);
  }
  // Logit rows: first the last row of every sequence that needs one (these are sampled), then the
  // other rows of sequences that want logits everywhere.
  const std::size_t rows_at = v.size();
  int row0 = 0;
  for (const auto& s : plan.seqs) {
    const int n = static_cast<int>(s.tokens.size());
    if (s.sample || s.logits != logits_mode::none) v.push_back(row0 + n - 1);
    row0 += n;
  }
  // Then the earlier sampled rows of verification steps (sampled together with the first block),
  row0 = 0;
  for (const auto& s : plan.seqs) {
    const int n = static_cast<int>(s.tokens.size());
    if (s.sample)
      for (int i = n - s.sample_rows; i + 1 < n; ++i) v.push_back(row0 + i);
    row0 += n;
  }
  // then the rows only read back as logits.
  row0 = 0;
  for (const auto& s : plan.seqs) {
    const int n = static_cast<int>(s.tokens.size());
    if (s.logits == logits_mode::all)
      for (int i = 0; i + 1 < n; ++i) v.push_back(row0 + i);
    row0 += n;
  }
  const int logit_rows = static_cast<int>(v.size() - rows_at);
  // Row-wise attention: token i of sequence s becomes a sequence of its own, whose context ends at
  // its position, with s's block table; the backend then computes every row as a decode step.
  const bool rows = row_wise(total);
  const std::size_t row_q_at = v.size();
  if (rows) {
    for (int i = 0; i <= total; ++i) v.push_back(i);
    for (const auto& s : plan.seqs)
      for (int i = 0; i < static_cast<int>(s.tokens.size()); ++i) v.push_back(s.start_pos + i + 1);
    for (std::size_t si = 0; si < plan.seqs.size(); ++si) {
      const std::size_t from = table_at + si * max_blocks;
      for (std::size_t i = 0; i < plan.seqs[si].tokens.size(); ++i) {
        for (int j = 0; j < max_blocks; ++j) {
          const std::int32_t block = v[from + j];
          v.push_back(block);
        }
      }
    }
  }
  backend_.upload(plan_ints_.get(), v.data(), v.size() * sizeof(std::int32_t));
  const auto* base = plan_ints_.as<const std::int32_t>();
  pv_ = plan_view{base, base + total, base + 2 * total, base + q_start_at, base + ctx_at, base + table_at,
                  base + rows_at, total, num_seqs, logit_rows, max_ctx, max_q, rows,
                  base + row_q_at, base + row_q_at + total + 1, base + row_q_at + 2 * total + 1};
  (void)max_blocks;
  table_stride_ = max_blocks;
}

void stage_executor::observe(int index, const void* data, int rows) {
  observe_buf_.resize(static_cast<std::size_t>(rows) * config_.hidden_size);
  backend_.read_f32(data, observe_buf_.size(), observe_buf_.data());
  observer_(index, observe_buf_);
}

status stage_executor::reduce(void* data, int rows) {
  if (collective_ == nullptr) return ok_status();
  return collective_->all_reduce_sum(data, static_cast<std::size_t>(rows) * config_.hidden_size,
                                     backend_.caps().act_dtype);
}

status stage_executor::run_layer(int li, int n, bool first) {
  const layer_weights& w = weights_->layers[li];
  const int layer = range_.first_layer + li;
  const int h = config_.hidden_size;
  kernels::backend& b = backend_;
  if (normed_ahead_) {
    normed_ahead_ = false;  // the previous layer's down projection left this layer's input in normed_
  } else if (observer_) {
    if (!first) b.add(residual_.get(), delta_.get(), static_cast<std::size_t>(n) * h);
    observe(layer, residual_.get(), n);
    b.rmsnorm(residual_.get(), n, h, w.input_norm, config_.rms_norm_eps, normed_.get());
  } else if (first) {
    b.rmsnorm(residual_.get(), n, h, w.input_norm, config_.rms_norm_eps, normed_.get());
  } else {
    b.add_rmsnorm(residual_.get(), delta_.get(), n, h, w.input_norm, config_.rms_norm_eps, normed_.get());
  }
  b.linear_into_attention(normed_.get(), n, w.qkv, w.qkv_bias, qkv_.get());
  kernels::attn_shape shape = shape_;
  shape.sliding_window = config_.sliding_window[layer];
  b.rope(qkv_.get(), n, shape, pv_.positions, inv_freq_.as<const float>(), attention_scaling_);
  b.kv_write(qkv_.get(), n, shape, pv_.slots, kv_.layout(), kv_.k(li), kv_.v(li));
  const kernels::attention_batch batch =
      pv_.row_wise ? kernels::attention_batch{pv_.num_tokens, pv_.row_q_start, pv_.row_ctx_len, pv_.row_block_table,
                                              table_stride_, pv_.max_ctx, 1}
                   : kernels::attention_batch{pv_.num_seqs, pv_.q_start, pv_.ctx_len, pv_.block_table, table_stride_,
                                              pv_.max_ctx, pv_.max_q};
  b.attention(qkv_.get(), shape, batch, kv_.layout(), kv_.k(li), kv_.v(li), attn_.get());
  // Without a tensor-parallel sum between them, each linear and the residual add + norm after it go
  // to the backend as one call (it may leave the linear's K slices for the norm's kernel to sum).
  if (collective_ == nullptr) {
    b.linear_add_rmsnorm(attn_.get(), n, w.o, w.o_bias, delta_.get(), residual_.get(), h, w.post_norm,
                         config_.rms_norm_eps, normed_.get());
  } else {
    b.linear(attn_.get(), n, w.o, w.o_bias, delta_.get());
    CONVEYOR_TRY(reduce(delta_.get(), n));
    b.add_rmsnorm(residual_.get(), delta_.get(), n, h, w.post_norm, config_.rms_norm_eps, normed_.get());
  }
  b.linear_silu_mul(normed_.get(), n, w.gate_up, w.gate_up_bias, gate_up_.get(), ffn_, act_.get());
  const kernels::weight* next = collective_ == nullptr && !observer_ ? norm_after(li) : nullptr;
  if (next != nullptr) {
    b.linear_add_rmsnorm(act_.get(), n, w.down, w.down_bias, delta_.get(), residual_.get(), h, *next,
                         config_.rms_norm_eps, normed_.get());
    normed_ahead_ = true;
    return ok_status();
  }
  b.linear(act_.get(), n, w.down, w.down_bias, delta_.get());
  return reduce(delta_.get(), n);
}

const kernels::weight* stage_executor::norm_after(int li) const {
  if (li + 1 < range_.num_layers()) return &weights_->layers[li + 1].input_norm;
  return range_.has_head ? &weights_->final_norm : nullptr;
}

bool stage_executor::run_fused_layers(int n) {
  // One token of one sequence, with nothing to observe or reduce between the ops: the backend may
  // run every layer as one operation (bench/NOTES.md, session 7).
  if (n != 1 || pv_.num_seqs != 1 || observer_ || collective_ != nullptr || range_.num_layers() == 0) return false;
  if (layer_refs_.empty()) {
    for (int li = 0; li < range_.num_layers(); ++li) {
      const layer_weights& w = weights_->layers[li];
      kernels::layer_ref r{w.input_norm, w.qkv, w.qkv_bias, w.o, w.o_bias, w.post_norm, w.gate_up, w.gate_up_bias,
                           w.down, w.down_bias, kv_.k(li), kv_.v(li), config_.sliding_window[range_.first_layer + li]};
      layer_refs_.push_back(r);
    }
  }
  kernels::decode_layers_call c;
  c.layers = layer_refs_.data();
  c.num_layers = range_.num_layers();
  c.hidden = config_.hidden_size;
  c.ffn = ffn_;
  c.shape = shape_;
  c.layout = kv_.layout();
  c.eps = config_.rms_norm_eps;
  c.positions = pv_.positions;
  c.slots = pv_.slots;
  c.inv_freq = inv_freq_.as<const float>();
  c.attention_scaling = attention_scaling_;
  c.batch = kernels::attention_batch{pv_.num_seqs, pv_.q_start, pv_.ctx_len, pv_.block_table, table_stride_,
                                     pv_.max_ctx, pv_.max_q};
  c.residual = residual_.get();
  c.delta = delta_.get();
  c.qkv = qkv_.get();
  c.attn = attn_.get();
  c.o = normed_.get();
  c.act = act_.get();
  return backend_.decode_layers(c);
}

stage_executor::~stage_executor() {
  for (const auto& [shape, rec] : captures_) backend_.drop_capture(rec.id);
}

status stage_executor::run_ops(int n) {
  kernels::backend& b = backend_;
  const int h = config_.hidden_size;
  if (range_.has_embedding) b.embedding(pv_.ids, n, weights_->embedding, residual_.get());
  normed_ahead_ = false;  // also after a step that failed between a down projection and the next layer
  if (!run_fused_layers(n)) {
    for (int li = 0; li < range_.num_layers(); ++li) CONVEYOR_TRY(run_layer(li, n, li == 0));
  }
  const bool ran_layers = range_.num_layers() > 0;
  if (!range_.has_head) {
    if (ran_layers) b.add(residual_.get(), delta_.get(), static_cast<std::size_t>(n) * h);
    return ok_status();
  }
  if (normed_ahead_) {
    normed_ahead_ = false;  // the last layer's down projection ran with the final norm
  } else if (ran_layers) {
    b.add_rmsnorm(residual_.get(), delta_.get(), n, h, weights_->final_norm, config_.rms_norm_eps, normed_.get());
  } else {
    b.rmsnorm(residual_.get(), n, h, weights_->final_norm, config_.rms_norm_eps, normed_.get());
  }
  if (pv_.num_logit_rows == 0) return ok_status();
  // A decode step whose every sequence wants its row (one token each): the logit rows are the rows
  // themselves, in order (upload_plan), so the head reads the normed rows with no gather kernel.
  const bool all_rows = pv_.num_logit_rows == n && pv_.num_seqs == n;
  if (!all_rows) b.gather_rows(normed_.get(), pv_.logit_rows, pv_.num_logit_rows, h, head_in_.get());
  b.linear(all_rows ? normed_.get() : head_in_.get(), pv_.num_logit_rows, weights_->lm_head, kernels::weight{},
           logits_.get());
  return ok_status();
}

bool stage_executor::row_wise(int tokens) const { return tokens <= backend_.caps().row_invariant_rows; }

bool stage_executor::capturable(const step_plan& plan) const {
  if (!backend_.can_capture() || observer_ || collective_ != nullptr) return false;
  // A row-wise step (verification passes of speculative decoding) is recorded like a decode step:
  // its attention is the decode kernels', which read every length from the plan on the device.
  if (row_wise(plan.num_tokens())) return true;
  return std::all_of(plan.seqs.begin(), plan.seqs.end(), [](const sequence_step& s) { return s.tokens.size() == 1; });
}

// A decode step of one shape issues the same ops on the same buffers every time: record them once
// and replay, one launch instead of ~100 (the host no longer paces a small-batch step).
status stage_executor::run_captured(int n) {
  const std::array<int, 4> shape{n, pv_.num_seqs, pv_.num_logit_rows, table_stride_};
  auto it = captures_.find(shape);
  if (it == captures_.end()) {
    // Past the bound, the shape replayed least recently goes (a server's batch sizes and context
    // buckets drift; dropping them all made every live shape record again).
    if (static_cast<int>(captures_.size()) >= options_.max_recorded_steps) {
      auto lru = std::min_element(captures_.begin(), captures_.end(),
                                  [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
      backend_.drop_capture(lru->second.id);
      captures_.erase(lru);
    }
    backend_.begin_capture();
    const status st = run_ops(n);
    const kernels::capture_id id = backend_.end_capture();
    CONVEYOR_TRY(st);
    if (id == 0) return run_ops(n);  // could not be recorded: nothing ran, run it eagerly
    it = captures_.emplace(shape, recorded_step{id, 0}).first;
  }
  it->second.used = ++replays_;
  backend_.replay(it->second.id);
  return ok_status();
}

// Rows [0, last rows) are each sampled (or logits-wanting) sequence's last position, in plan order;
// then the earlier rows of verification steps, in upload_plan's order, each drawn with its own step.
stage_executor::draw_rows stage_executor::plan_draws(const step_plan& plan) {
  draw_rows d;
  for (const auto& s : plan.seqs) {
    const bool has_row = s.sample || s.logits != logits_mode::none;
    d.last_row_of.push_back(has_row ? static_cast<int>(d.params.size()) : -1);
    if (has_row) {
      kernels::sample_params p = s.sampling;
      if (!s.sample) p.temperature = 0.0f;
      d.params.push_back(p);
    }
    d.any_logits = d.any_logits || s.logits != logits_mode::none;
  }
  d.early_row_of.assign(plan.seqs.size(), -1);
  for (std::size_t i = 0; i < plan.seqs.size(); ++i) {
    const auto& s = plan.seqs[i];
    if (!s.sample || s.sample_rows == 1) continue;
    d.early_row_of[i] = static_cast<int>(d.params.size());
    for (int back = s.sample_rows - 1; back >= 1; --back) {
      kernels::sample_params p = s.sampling;
      p.step -= static_cast<std::uint64_t>(back);
      d.params.push_back(p);
    }
  }
  return d;
}

/// The sampled sequences' tokens from the drawn rows, as step_output promises them (`seqs`: the
/// plan's sequence_steps or a queued step's summary, anything with `sample` and `sample_rows`).
template <class Seqs>
void stage_executor::fill_tokens(const Seqs& seqs, const draw_rows& d, const std::vector<std::int32_t>& drawn,
                                 step_output& out) {
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const auto& s = seqs[i];
    if (!s.sample) continue;
    out.tokens[i] = drawn[d.last_row_of[i]];
    out.row_tokens_offset[i] = static_cast<int>(out.row_tokens.size());
    if (d.early_row_of[i] >= 0) {
      out.row_tokens.insert(out.row_tokens.end(), drawn.begin() + d.early_row_of[i],
                            drawn.begin() + d.early_row_of[i] + s.sample_rows - 1);
    }
    out.row_tokens.push_back(out.tokens[i]);
  }
}

status stage_executor::begin(const step_plan& plan, bool chain) {
  auto bad = [](std::string what) { return make_error(errc::invalid_argument, "queued step: " + std::move(what)); };
  // Tensor-parallel ranks queue steps too (tp_stage::begin runs every rank's begin together).
  if (!range_.has_embedding || !range_.has_head || observer_) {
    return bad("only a stage with the embedding and the head and no observer queues steps");
  }
  if (queued_.size() >= 2) return bad("two steps are queued already; end() one first");
  for (const auto& s : plan.seqs) {
    if (s.logits != logits_mode::none) return bad(seq_name(s) + " wants logits, which only run() reads back");
  }
  CONVEYOR_TRY(validate(plan, 0));
  if (chain) {
    if (queued_.empty()) return bad("chain: no queued step before this one to take the tokens from");
    const queued_step& prev = queued_.back();
    if (prev.seqs.size() != plan.seqs.size()) {
      return bad("chain: " + std::to_string(plan.seqs.size()) + " sequences after a step of " +
                 std::to_string(prev.seqs.size()));
    }
    for (std::size_t i = 0; i < plan.seqs.size(); ++i) {
      const auto& s = plan.seqs[i];
      const auto& p = prev.seqs[i];
      if (s.seq_id != p.id || s.tokens.size() != 1 || !p.sample || p.sample_rows != 1 || prev.draws.last_row_of[i] != static_cast<int>(i)) {
        return bad("chain: " + seq_name(s) + " (index " + std::to_string(i) +
                   ") is not the previous step's sequence there with one token, sampled once");
      }
    }
  }
  const bool record = capturable(plan);
  upload_plan(plan, record);
  kernels::backend& b = backend_;
  // The ids are the upload's first values (upload_plan): overwrite them with the previous draw,
  // queued after the upload and before the step's ops.
  if (chain) b.copy_draw(queued_.back().slot, pv_.num_tokens, plan_ints_.as<std::int32_t>());
  CONVEYOR_TRY(record ? run_captured(pv_.num_tokens) : run_ops(pv_.num_tokens));
  queued_step q;
  q.seqs.reserve(plan.seqs.size());
  for (const auto& s : plan.seqs) q.seqs.push_back({s.seq_id, s.sample, s.sample_rows});
  if (pv_.num_logit_rows > 0) q.draws = plan_draws(plan);
  q.slot = next_slot_;
  next_slot_ ^= 1;
  if (!q.draws.params.empty()) {
    b.draw(logits_.get(), static_cast<int>(q.draws.params.size()), config_.vocab_size, q.draws.params.data(), q.slot);
  }
  queued_.push_back(std::move(q));
  return ok_status();
}

result<step_output> stage_executor::end() {
  if (queued_.empty()) return make_error(errc::invalid_argument, "end(): no queued step");
  queued_step q = std::move(queued_.front());
  queued_.pop_front();
  step_output out;
  out.tokens.assign(q.seqs.size(), -1);
  out.logits_offset.assign(q.seqs.size(), -1);
  out.row_tokens_offset.assign(q.seqs.size(), -1);
  if (q.draws.params.empty()) return out;
  std::vector<std::int32_t> drawn(q.draws.params.size());
  backend_.take_draw(q.slot, drawn.data());
  fill_tokens(q.seqs, q.draws, drawn, out);
  return out;
}

result<step_output> stage_executor::run(const step_plan& plan, std::span<const float> hidden_in) {
  return run_impl(plan, hidden_in.size(), hidden_in.data(), nullptr, false, nullptr);
}

result<step_output> stage_executor::run_raw(const step_plan& plan, const void* hidden_in, void* hidden_out) {
  std::size_t values = hidden_in == nullptr ? 0 : static_cast<std::size_t>(plan.num_tokens()) * config_.hidden_size;
  return run_impl(plan, values, nullptr, hidden_in, true, hidden_out);
}

result<step_output> stage_executor::run_impl(const step_plan& plan, std::size_t hidden_values, const float* in_f32,
                                             const void* in_raw, bool raw_out, void* out_raw) {
  if (!queued_.empty()) {
    return make_error(errc::invalid_argument, "run(): " + std::to_string(queued_.size()) + " queued steps; end() them first");
  }
  CONVEYOR_TRY(validate(plan, hidden_values));
  const bool record = capturable(plan);
  upload_plan(plan, record);
  kernels::backend& b = backend_;
  const int n = pv_.num_tokens;
  const int h = config_.hidden_size;
  const std::size_t act_bytes = static_cast<std::size_t>(n) * h * kernels::dtype_size(b.caps().act_dtype);
  if (!range_.has_embedding) {
    if (in_raw != nullptr) {
      b.upload(residual_.get(), in_raw, act_bytes);
    } else {
      b.write_f32(residual_.get(), in_f32, hidden_values);
    }
  }
  CONVEYOR_TRY(record ? run_captured(n) : run_ops(n));

  step_output out;
  if (!range_.has_head) {
    if (raw_out) {
      if (out_raw != nullptr) b.download(out_raw, residual_.get(), act_bytes);
      return out;
    }
    out.hidden.resize(static_cast<std::size_t>(n) * h);
    b.read_f32(residual_.get(), out.hidden.size(), out.hidden.data());
    return out;
  }
  if (observer_) observe(config_.num_layers, normed_.get(), n);
  const int rows = pv_.num_logit_rows;
  const int vocab = config_.vocab_size;
  out.tokens.assign(plan.seqs.size(), -1);
  out.logits_offset.assign(plan.seqs.size(), -1);
  out.row_tokens_offset.assign(plan.seqs.size(), -1);
  if (rows == 0) return out;

  const draw_rows d = plan_draws(plan);
  std::vector<std::int32_t> drawn(d.params.size());
  b.sample(logits_.get(), static_cast<int>(d.params.size()), vocab, d.params.data(), drawn.data());
  fill_tokens(plan.seqs, d, drawn, out);
  if (!d.any_logits) return out;

  std::vector<float> all(static_cast<std::size_t>(rows) * vocab);
  b.read_f32(logits_.get(), all.size(), all.data());
  // Reorder to plan order with each sequence's rows by position.
  int extra = static_cast<int>(d.params.size());  // the logits_mode::all rows follow the sampled ones
  auto copy_row = [&](int row) {
    const std::size_t at = static_cast<std::size_t>(row) * vocab;
    out.logits.insert(out.logits.end(), all.begin() + at, all.begin() + at + vocab);
  };
  for (std::size_t i = 0; i < plan.seqs.size(); ++i) {
    const auto& s = plan.seqs[i];
    const int n_seq = static_cast<int>(s.tokens.size());
    if (s.logits == logits_mode::none) {
      continue;
    }
    out.logits_offset[i] = static_cast<int>(out.logits.size() / vocab);
    if (s.logits == logits_mode::all) {
      for (int r = 0; r + 1 < n_seq; ++r) copy_row(extra++);
    }
    if (s.logits == logits_mode::sampled && d.early_row_of[i] >= 0) {
      for (int r = 0; r + 1 < s.sample_rows; ++r) copy_row(d.early_row_of[i] + r);
    }
    copy_row(d.last_row_of[i]);
  }
  return out;
}

}  // namespace conveyor::engine
