#include "conveyor/engine/stage_weights.hpp"

#include <cstring>
#include <string>

namespace conveyor::engine {

namespace {
std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
}  // namespace

/// Fetches, checks and uploads tensors for one stage_weights.
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

  /// Uploads the row-wise concatenation of `parts` (each [rows_i, cols]) as one matrix.
  result<kernels::weight> upload(const std::vector<tensor_ref>& parts, bool is_vector) {
    std::int64_t rows = 0;
    const std::int64_t cols = is_vector ? 1 : parts[0].info->shape[1];
    for (const auto& p : parts) rows += p.info->shape[0];
    const void* src = parts[0].file->data(*parts[0].info);
    kernels::dtype type = *parts[0].info->type;
    std::vector<std::uint8_t> staging;
    if (parts.size() > 1) {
      bool same = true;
      for (const auto& p : parts) same = same && *p.info->type == type;
      if (!same) type = kernels::dtype::f32;
      const std::size_t esize = kernels::dtype_size(type);
      staging.resize(static_cast<std::size_t>(rows) * cols * esize);
      std::size_t at = 0;
      for (const auto& p : parts) {
        const std::size_t n = static_cast<std::size_t>(p.info->numel());
        if (same) {
          std::memcpy(staging.data() + at, p.file->data(*p.info), n * esize);
        } else {
          kernels::convert_to_f32(p.file->data(*p.info), *p.info->type, n,
                                  reinterpret_cast<float*>(staging.data() + at));
        }
        at += n * esize;
      }
      src = staging.data();
    }
    kernels::weight w = b_.upload_weight(src, type, is_vector ? 1 : rows, is_vector ? rows : cols, is_vector);
    if (w.empty()) {
      return make_error(errc::out_of_memory, "out of " + b_.caps().name + " memory loading \"" +
                                                 parts[0].info->name + "\"");
    }
    const std::size_t bytes = static_cast<std::size_t>(w.rows) * w.cols * kernels::dtype_size(w.type);
    w_.bytes += bytes;
    w_.owned_.push_back(device_buffer::adopt(b_, const_cast<void*>(w.data), bytes));
    return w;
  }

  result<kernels::weight> matrix(const std::string& name, std::int64_t rows, std::int64_t cols) {
    CONVEYOR_TRY_ASSIGN(ref, fetch(name, rows, cols));
    return upload({ref}, false);
  }
  result<kernels::weight> vector(const std::string& name, std::int64_t n) {
    CONVEYOR_TRY_ASSIGN(ref, fetch(name, n, 0));
    return upload({ref}, true);
  }

 private:
  kernels::backend& b_;
  checkpoint& ckpt_;
  stage_weights& w_;
};

result<std::unique_ptr<stage_weights>> stage_weights::load(kernels::backend& backend, checkpoint& ckpt,
                                                           const model_config& c, stage_range range) {
  std::unique_ptr<stage_weights> w(new stage_weights(backend));
  weight_loader ld(backend, ckpt, *w);
  const std::int64_t h = c.hidden_size;
  const std::int64_t q_rows = static_cast<std::int64_t>(c.num_heads) * c.head_dim;
  const std::int64_t kv_rows = static_cast<std::int64_t>(c.num_kv_heads) * c.head_dim;
  const std::int64_t f = c.intermediate_size;
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
    CONVEYOR_TRY_ASSIGN(qkv, ld.upload({q, k, v}, false));
    lw.qkv = qkv;
    if (c.qkv_bias) {
      CONVEYOR_TRY_ASSIGN(qb, ld.fetch(p + "self_attn.q_proj.bias", q_rows, 0));
      CONVEYOR_TRY_ASSIGN(kb, ld.fetch(p + "self_attn.k_proj.bias", kv_rows, 0));
      CONVEYOR_TRY_ASSIGN(vb, ld.fetch(p + "self_attn.v_proj.bias", kv_rows, 0));
      CONVEYOR_TRY_ASSIGN(qkv_b, ld.upload({qb, kb, vb}, true));
      lw.qkv_bias = qkv_b;
    }
    CONVEYOR_TRY_ASSIGN(o, ld.matrix(p + "self_attn.o_proj.weight", h, q_rows));
    lw.o = o;
    if (c.o_bias) {
      CONVEYOR_TRY_ASSIGN(ob, ld.vector(p + "self_attn.o_proj.bias", h));
      lw.o_bias = ob;
    }
    CONVEYOR_TRY_ASSIGN(g, ld.fetch(p + "mlp.gate_proj.weight", f, h));
    CONVEYOR_TRY_ASSIGN(u, ld.fetch(p + "mlp.up_proj.weight", f, h));
    CONVEYOR_TRY_ASSIGN(gu, ld.upload({g, u}, false));
    lw.gate_up = gu;
    CONVEYOR_TRY_ASSIGN(d, ld.matrix(p + "mlp.down_proj.weight", h, f));
    lw.down = d;
    if (c.mlp_bias) {
      CONVEYOR_TRY_ASSIGN(gb, ld.fetch(p + "mlp.gate_proj.bias", f, 0));
      CONVEYOR_TRY_ASSIGN(ub, ld.fetch(p + "mlp.up_proj.bias", f, 0));
      CONVEYOR_TRY_ASSIGN(gub, ld.upload({gb, ub}, true));
      lw.gate_up_bias = gub;
      CONVEYOR_TRY_ASSIGN(db, ld.vector(p + "mlp.down_proj.bias", h));
      lw.down_bias = db;
    }
    w->layers.push_back(lw);
  }
  if (range.has_head) {
    CONVEYOR_TRY_ASSIGN(n, ld.vector("model.norm.weight", h));
    w->final_norm = n;
    if (c.tie_word_embeddings) {
      if (range.has_embedding) {
        w->lm_head = w->embedding;
      } else {
        CONVEYOR_TRY_ASSIGN(e, ld.matrix("model.embed_tokens.weight", c.vocab_size, h));
        w->lm_head = e;
      }
    } else {
      CONVEYOR_TRY_ASSIGN(head, ld.matrix("lm_head.weight", c.vocab_size, h));
      w->lm_head = head;
    }
  }
  return w;
}

}  // namespace conveyor::engine
