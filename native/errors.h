// The codec's exceptions, which bindings.cc maps to Python's.
#pragma once

#include <stdexcept>
#include <string>

namespace hl {

// A frame that is truncated, corrupted or not ours. Surfaces in Python as ValueError.
struct FrameError : std::invalid_argument {
  explicit FrameError(const std::string& m) : std::invalid_argument(m) {}
};
// A bad argument (unsupported dtype, negative bound, buffer too small). ValueError in Python.
struct ArgumentError : std::invalid_argument {
  explicit ArgumentError(const std::string& m) : std::invalid_argument(m) {}
};
// A failure inside the codec itself (CUDA error, allocation). RuntimeError in Python.
struct CodecError : std::runtime_error {
  explicit CodecError(const std::string& m) : std::runtime_error(m) {}
};

}  // namespace hl
