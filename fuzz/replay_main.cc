// A main() for building a libFuzzer harness without libFuzzer (g++, no clang needed): it feeds
// every file named on the command line, or found in a directory named there, to
// LLVMFuzzerTestOneInput once. Built with -fsanitize=address,undefined by `fuzz/run.sh ci`, the
// CI regression replays each harness over its saved inputs in seconds.
#include <stdint.h>
#include <stdio.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int run_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    fprintf(stderr, "cannot read %s\n", path.c_str());
    return 1;
  }
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(data.data(), data.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  size_t inputs = 0;
  int failures = 0;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path arg(argv[i]);
    if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(arg)) {
        if (!entry.is_regular_file()) continue;
        failures += run_file(entry.path());
        ++inputs;
      }
    } else {
      failures += run_file(arg);
      ++inputs;
    }
  }
  printf("replayed %zu inputs\n", inputs);
  return failures ? 1 : 0;
}
