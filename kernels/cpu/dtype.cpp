#include "conveyor/kernels/dtype.hpp"

#include "conveyor/kernels/quant.hpp"

namespace conveyor::kernels {

void convert_to_f32(const void* src, dtype src_type, std::size_t count, float* dst) {
  switch (src_type) {
    case dtype::f32:
      std::memcpy(dst, src, count * 4);
      return;
    case dtype::bf16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case dtype::f16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case dtype::i32: {
      const auto* s = static_cast<const std::int32_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    // Quantized codes without their scales (the codes' own values).
    case dtype::i8: {
      const auto* s = static_cast<const std::int8_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case dtype::f8e4m3: {
      const auto* s = static_cast<const std::uint8_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = e4m3_to_f32(s[i]);
      return;
    }
  }
}

}  // namespace conveyor::kernels
