// Helpers shared by the CPU and CUDA halves of the pybind11 module hvd_lossy._C.
#pragma once

#include <stdint.h>

#include "codec.h"

namespace hl {
namespace py_util {

template <typename T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

inline CompressParams params(int dtype, int mode, int level, bool dedup, double eb) {
  CompressParams p;
  p.dtype = (uint8_t)dtype;
  p.mode = (uint8_t)mode;
  p.level = (uint8_t)level;
  p.dedup = dedup;
  p.error_bound = eb;
  return p;
}

}  // namespace py_util
}  // namespace hl
