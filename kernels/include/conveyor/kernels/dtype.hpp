#pragma once
// Element types the kernels understand, and host conversions between them (host-only: no CUDA here).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace conveyor::kernels {

/// i8 and f8e4m3 are quantized weight matrices only (kernels/include/conveyor/kernels/quant.hpp):
/// one byte per element plus a float32 scale per row; activations never take them.
enum class dtype : std::uint8_t { f32, bf16, f16, i32, i8, f8e4m3 };

constexpr std::size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::bf16: return 2;
    case dtype::f16: return 2;
    case dtype::i32: return 4;
    case dtype::i8: return 1;
    case dtype::f8e4m3: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
    case dtype::i32: return "i32";
    case dtype::i8: return "i8";
    case dtype::f8e4m3: return "f8e4m3";
  }
  return "?";
}

inline float bf16_to_f32(std::uint16_t h) {
  std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// Round to nearest even, as torch does when casting to bfloat16; NaN stays NaN.
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

/// IEEE half to float, including subnormals, infinities and NaN.
inline float f16_to_f32(std::uint16_t h) {
  std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) { mant <<= 1; --exp; }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// Converts `count` elements of type `src_type` to float32.
void convert_to_f32(const void* src, dtype src_type, std::size_t count, float* dst);

}  // namespace conveyor::kernels
