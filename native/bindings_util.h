// Helpers shared by the CPU and CUDA halves of the pybind11 module hvd_lossy._C.
#pragma once

#include <stdint.h>

#include <string>

#include "codec.h"

namespace hl {
namespace py_util {

template <typename T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

// dither_seed < 0: no dither; else subtractive dither with that 24-bit seed (frame.h).
inline CompressParams params(int dtype, int mode, int level, bool dedup, double eb,
                             int64_t dither_seed = -1) {
  if (dither_seed < -1 || dither_seed >= (int64_t)HL_DITHER_SEEDS)
    throw ArgumentError("dither seed " + std::to_string(dither_seed) +
                        " is out of range, expected 0.." + std::to_string(HL_DITHER_SEEDS - 1) +
                        " (or -1: no dither)");
  CompressParams p;
  p.dither = dither_seed >= 0;
  p.dither_seed = dither_seed >= 0 ? (uint32_t)dither_seed : 0;
  p.dtype = (uint8_t)dtype;
  p.mode = (uint8_t)mode;
  p.level = (uint8_t)level;
  p.dedup = dedup;
  p.error_bound = eb;
  return p;
}

}  // namespace py_util
}  // namespace hl
