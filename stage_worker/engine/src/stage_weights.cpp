#include "conveyor/engine/stage_weights.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace conveyor::engine {

namespace {

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// A host-side matrix to upload: rows of a checkpoint tensor (pointing into the mapping) or a
/// column slice copied out of it.
struct host_part {
  std::string name;
  const void* data = nullptr;
  kernels::dtype type = kernels::dtype::f32;
  std::int64_t rows = 0;
  std::int64_t cols = 1;
  std::vector<std::uint8_t> owned;  ///< column slices are strided, so they are copied
  /// Column slices: the whole rows they were cut from, so quantization takes the whole rows' scales.
  const std::uint8_t* full_rows = nullptr;
  std::int64_t full_cols = 0;
};

}  // namespace

/// Fetches, checks, slices and uploads tensors for one stage_weights.
class weight_loader {
 public:
  weight_loader(kernels::backend& b, checkpoint& c, stage_weights& w) : b_(b), ckpt_(c), w_(w) {}

  /// A tensor of exactly `rows` × `cols` (cols 0 = a vector of `rows`).
  result<tensor_ref> fetch(const std::string& name, std::int64_t rows, std::int64_t cols) {
    CONVEYOR_TRY_ASSIGN(ref, ckpt_.find(name));
    const std::vector<std::int64_t> want = cols == 0 ? std::vector<std::int64_t>{rows}
                                                     : std::vector<std::int64_t>{rows, cols};
    if (ref.info->shape != want) {
      return make_error(errc::bad_format, ref.file->path() + ": tensor \"" + name + "\" has shape " +
                                              shape_str(ref.info->shape) + ", config.json implies " + shape_str(want));
    }
    if (!ref.info->type || *ref.info->type == kernels::dtype::i32) {
      return make_error(errc::unsupported, ref.file->path() + ": tensor \"" + name + "\" has dtype " +
                                               ref.info->dtype_name + " (supported: F32, BF16, F16)");
    }
    return ref;
  }

  /// Rows [begin, begin + count) of a fetched tensor (a vector counts as a column).
  static host_part rows_of(const tensor_ref& t, std::int64_t begin, std::int64_t count) {
    host_part p;
    p.name = t.info->name;
    p.type = *t.info->type;
    p.cols = t.info->shape.size() > 1 ? t.info->shape[1] : 1;
    p.rows = count;
    p.data = t.file->data(*t.info) + static_cast<std::size_t>(begin) * p.cols * kernels::dtype_size(p.type);
    return p;
  }
  static host_part whole(const tensor_ref& t) { return rows_of(t, 0, t.info->shape[0]); }

  /// Columns [begin, begin + count) of a fetched matrix.
  static host_part cols_of(const tensor_ref& t, std::int64_t begin, std::int64_t count) {
    host_part p;
    p.name = t.info->name;
    p.type = *t.info->type;
    p.rows = t.info->shape[0];
    p.cols = count;
    const std::size_t esize = kernels::dtype_size(p.type);
    const std::size_t full = static_cast<std::size_t>(t.info->shape[1]) * esize;
    const std::uint8_t* src = t.file->data(*t.info) + static_cast<std::size_t>(begin) * esize;
    p.owned.resize(static_cast<std::size_t>(p.rows) * count * esize);
    for (std::int64_t r = 0; r < p.rows; ++r) {
      std::memcpy(p.owned.data() + static_cast<std::size_t>(r) * count * esize, src + r * full, count * esize);
    }
    p.data = p.owned.data();
    p.full_rows = t.file->data(*t.info);
    p.full_cols = t.info->shape[1];
    return p;
  }

  /// Uploads the row-wise concatenation of `parts` quantized as `kind`: per-row scales from each
  /// part's rows (the whole rows for a column slice), codes and scales in two backend buffers.
  result<kernels::weight> upload_quantized(const std::vector<host_part>& parts, kernels::weight_quant kind) {
    const auto& caps = b_.caps();
    if ((kind == kernels::weight_quant::int8 && !caps.int8_weights) ||
        (kind == kernels::weight_quant::fp8 && !caps.fp8_weights)) {
      return make_error(errc::unsupported, "quantization \"" + std::string(kernels::weight_quant_name(kind)) +
                                               "\" is not supported by the " + caps.name + " backend" +
                                               (kind == kernels::weight_quant::fp8 ? " (FP8 E4M3 weights need a GPU of compute capability 8.9 or newer)" : ""));
    }
    std::int64_t rows = 0;
    const std::int64_t cols = parts[0].cols;
    for (const auto& p : parts) rows += p.rows;
    std::vector<float> values(static_cast<std::size_t>(rows) * cols);
    std::vector<float> absmax;
    bool any_slice = false;
    for (const auto& p : parts) any_slice = any_slice || p.full_rows != nullptr;
    std::size_t at = 0;
    std::vector<float> row_buf;
    for (const auto& p : parts) {
      const std::size_t n = static_cast<std::size_t>(p.rows) * p.cols;
      kernels::convert_to_f32(p.data, p.type, n, values.data() + at);
      if (any_slice) {
        for (std::int64_t r = 0; r < p.rows; ++r) {
          const float* row = values.data() + at + static_cast<std::size_t>(r) * p.cols;
          std::int64_t len = p.cols;
          if (p.full_rows != nullptr) {
            row_buf.resize(p.full_cols);
            kernels::convert_to_f32(p.full_rows + static_cast<std::size_t>(r) * p.full_cols * kernels::dtype_size(p.type),
                                    p.type, p.full_cols, row_buf.data());
            row = row_buf.data();
            len = p.full_cols;
          }
          float m = 0.0f;
          for (std::int64_t c = 0; c < len; ++c) m = std::max(m, std::fabs(row[c]));
          absmax.push_back(m);
        }
      }
      at += n;
    }
    std::vector<std::uint8_t> codes(values.size());
    std::vector<float> scales(rows);
    kernels::quantize_rows(values.data(), rows, cols, kind, any_slice ? absmax.data() : nullptr, codes.data(),
                           scales.data());
    void* q = b_.alloc(codes.size());
    void* sc = b_.alloc(scales.size() * sizeof(float));
    if (q == nullptr || sc == nullptr) {
      if (q != nullptr) b_.release(q);
      if (sc != nullptr) b_.release(sc);
      return make_error(errc::out_of_memory, "out of " + caps.name + " memory loading \"" + parts[0].name + "\"");
    }
    b_.upload(q, codes.data(), codes.size());
    b_.upload(sc, scales.data(), scales.size() * sizeof(float));
    w_.owned_.push_back(device_buffer::adopt(b_, q, codes.size()));
    w_.owned_.push_back(device_buffer::adopt(b_, sc, scales.size() * sizeof(float)));
    w_.bytes += kernels::quantized_matrix_bytes(rows, cols);
    kernels::weight w{q, kernels::weight_quant_dtype(kind), rows, cols};
    w.scales = static_cast<const float*>(sc);
    return w;
  }

  /// A matrix of the linear layers: quantized when the stage's options say so.
  result<kernels::weight> linear(const std::vector<host_part>& parts, kernels::weight_quant kind) {
    if (kind == kernels::weight_quant::none) return upload(parts, false);
    return upload_quantized(parts, kind);
  }

  /// Uploads the row-wise concatenation of `parts` (all with the same column count).
  result<kernels::weight> upload(const std::vector<host_part>& parts, bool is_vector) {
    std::int64_t rows = 0;
    const std::int64_t cols = parts[0].cols;
    for (const auto& p : parts) rows += p.rows;
    const void* src = parts[0].data;
    kernels::dtype type = parts[0].type;
    std::vector<std::uint8_t> staging;
    if (parts.size() > 1) {
      bool same = true;
      for (const auto& p : parts) same = same && p.type == type;
      if (!same) type = kernels::dtype::f32;
      const std::size_t esize = kernels::dtype_size(type);
      staging.resize(static_cast<std::size_t>(rows) * cols * esize);
      std::size_t at = 0;
      for (const auto& p : parts) {
        const std::size_t n = static_cast<std::size_t>(p.rows) * p.cols;
        if (same) {
          std::memcpy(staging.data() + at, p.data, n * esize);
        } else {
          kernels::convert_to_f32(p.data, p.type, n, reinterpret_cast<float*>(staging.data() + at));
        }
        at += n * esize;
      }
      src = staging.data();
    }
    kernels::weight w = b_.upload_weight(src, type, is_vector ? 1 : rows, is_vector ? rows : cols, is_vector);
    if (w.empty()) {
      return make_error(errc::out_of_memory, "out of " + b_.caps().name + " memory loading \"" + parts[0].name + "\"");
    }
    const std::size_t bytes = static_cast<std::size_t>(w.rows) * w.cols * kernels::dtype_size(w.type);
    w_.bytes += bytes;
    w_.owned_.push_back(device_buffer::adopt(b_, const_cast<void*>(w.data), bytes));
    return w;
  }

  result<kernels::weight> matrix(const std::string& name, std::int64_t rows, std::int64_t cols) {
    CONVEYOR_TRY_ASSIGN(ref, fetch(name, rows, cols));
    return upload({whole(ref)}, false);
  }
  result<kernels::weight> vector(const std::string& name, std::int64_t n) {
    CONVEYOR_TRY_ASSIGN(ref, fetch(name, n, 0));
    return upload({whole(ref)}, true);
  }

 private:
  kernels::backend& b_;
  checkpoint& ckpt_;
  stage_weights& w_;
};

result<kernels::weight_quant> parse_weight_quant(const std::string& text) {
  for (auto k : {kernels::weight_quant::none, kernels::weight_quant::int8, kernels::weight_quant::fp8}) {
    if (text == kernels::weight_quant_name(k)) return k;
  }
  return make_error(errc::invalid_argument,
                    "unknown quantization \"" + text + "\" (allowed: \"none\", \"int8\", \"fp8\")");
}

result<std::unique_ptr<stage_weights>> stage_weights::load(kernels::backend& backend, checkpoint& ckpt,
                                                           const model_config& c, stage_range range,
                                                           const tp_layout& tp, const weight_quant_options& quant,
                                                           const std::function<void()>& on_layer_loaded) {
  const kernels::weight_quant qk = quant.kind;
  std::unique_ptr<stage_weights> w(new stage_weights(backend));
  weight_loader ld(backend, ckpt, *w);
  const std::int64_t h = c.hidden_size;
  const std::int64_t hd = c.head_dim;
  const std::int64_t q_rows = static_cast<std::int64_t>(c.num_heads) * hd;
  const std::int64_t kv_rows = static_cast<std::int64_t>(c.num_kv_heads) * hd;
  const std::int64_t f = c.intermediate_size;
  // This rank's slices (the whole tensors when tp.size == 1).
  const std::int64_t q0 = tp.head_begin * hd, qn = tp.heads * hd;
  const std::int64_t kv0 = tp.kv_head_begin * hd, kvn = tp.kv_heads * hd;
  const std::int64_t f0 = tp.ffn_begin, fn = tp.ffn;
  const bool rank0 = tp.rank == 0;  // row-parallel biases are added once, before the all-reduce
  using wl = weight_loader;
  if (range.has_embedding) {
    CONVEYOR_TRY_ASSIGN(e, ld.matrix("model.embed_tokens.weight", c.vocab_size, h));
    w->embedding = e;
  }
  for (int l = range.first_layer; l < range.last_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    layer_weights lw;
    CONVEYOR_TRY_ASSIGN(in_norm, ld.vector(p + "input_layernorm.weight", h));
    CONVEYOR_TRY_ASSIGN(post_norm, ld.vector(p + "post_attention_layernorm.weight", h));
    lw.input_norm = in_norm;
    lw.post_norm = post_norm;
    CONVEYOR_TRY_ASSIGN(q, ld.fetch(p + "self_attn.q_proj.weight", q_rows, h));
    CONVEYOR_TRY_ASSIGN(k, ld.fetch(p + "self_attn.k_proj.weight", kv_rows, h));
    CONVEYOR_TRY_ASSIGN(v, ld.fetch(p + "self_attn.v_proj.weight", kv_rows, h));
    CONVEYOR_TRY_ASSIGN(qkv, ld.linear({wl::rows_of(q, q0, qn), wl::rows_of(k, kv0, kvn), wl::rows_of(v, kv0, kvn)}, qk));
    lw.qkv = qkv;
    if (c.qkv_bias) {
      CONVEYOR_TRY_ASSIGN(qb, ld.fetch(p + "self_attn.q_proj.bias", q_rows, 0));
      CONVEYOR_TRY_ASSIGN(kb, ld.fetch(p + "self_attn.k_proj.bias", kv_rows, 0));
      CONVEYOR_TRY_ASSIGN(vb, ld.fetch(p + "self_attn.v_proj.bias", kv_rows, 0));
      CONVEYOR_TRY_ASSIGN(qkv_b, ld.upload({wl::rows_of(qb, q0, qn), wl::rows_of(kb, kv0, kvn), wl::rows_of(vb, kv0, kvn)}, true));
      lw.qkv_bias = qkv_b;
    }
    CONVEYOR_TRY_ASSIGN(o, ld.fetch(p + "self_attn.o_proj.weight", h, q_rows));
    CONVEYOR_TRY_ASSIGN(o_w, ld.linear({tp.size == 1 ? wl::whole(o) : wl::cols_of(o, q0, qn)}, qk));
    lw.o = o_w;
    if (c.o_bias) {
      CONVEYOR_TRY_ASSIGN(ob, ld.fetch(p + "self_attn.o_proj.bias", h, 0));
      if (rank0) {
        CONVEYOR_TRY_ASSIGN(ob_w, ld.upload({wl::whole(ob)}, true));
        lw.o_bias = ob_w;
      }
    }
    CONVEYOR_TRY_ASSIGN(g, ld.fetch(p + "mlp.gate_proj.weight", f, h));
    CONVEYOR_TRY_ASSIGN(u, ld.fetch(p + "mlp.up_proj.weight", f, h));
    CONVEYOR_TRY_ASSIGN(gu, ld.linear({wl::rows_of(g, f0, fn), wl::rows_of(u, f0, fn)}, qk));
    lw.gate_up = gu;
    CONVEYOR_TRY_ASSIGN(d, ld.fetch(p + "mlp.down_proj.weight", h, f));
    CONVEYOR_TRY_ASSIGN(d_w, ld.linear({tp.size == 1 ? wl::whole(d) : wl::cols_of(d, f0, fn)}, qk));
    lw.down = d_w;
    if (c.mlp_bias) {
      CONVEYOR_TRY_ASSIGN(gb, ld.fetch(p + "mlp.gate_proj.bias", f, 0));
      CONVEYOR_TRY_ASSIGN(ub, ld.fetch(p + "mlp.up_proj.bias", f, 0));
      CONVEYOR_TRY_ASSIGN(gub, ld.upload({wl::rows_of(gb, f0, fn), wl::rows_of(ub, f0, fn)}, true));
      lw.gate_up_bias = gub;
      CONVEYOR_TRY_ASSIGN(db, ld.fetch(p + "mlp.down_proj.bias", h, 0));
      if (rank0) {
        CONVEYOR_TRY_ASSIGN(db_w, ld.upload({wl::whole(db)}, true));
        lw.down_bias = db_w;
      }
    }
    w->layers.push_back(lw);
    if (on_layer_loaded) on_layer_loaded();
  }
  if (range.has_head) {
    // The LM head is replicated on every rank. TODO(perf): split it by vocabulary + all-gather.
    CONVEYOR_TRY_ASSIGN(n, ld.vector("model.norm.weight", h));
    w->final_norm = n;
    const kernels::weight_quant head_q = quant.lm_head ? qk : kernels::weight_quant::none;
    const std::string head_name = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    if (c.tie_word_embeddings && range.has_embedding && head_q == kernels::weight_quant::none) {
      w->lm_head = w->embedding;
    } else {
      CONVEYOR_TRY_ASSIGN(head, ld.fetch(head_name, c.vocab_size, h));
      CONVEYOR_TRY_ASSIGN(head_w, ld.linear({wl::whole(head)}, head_q));
      w->lm_head = head_w;
    }
  }
  return w;
}

}  // namespace conveyor::engine
