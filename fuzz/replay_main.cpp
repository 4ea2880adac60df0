// Runs a fuzz target's entry function over files and directories, as its libFuzzer binary does when
// given inputs and no time to fuzz. Linked with the same entry in every build (tests/fuzz), any
// compiler, so the seed corpus and the crashing inputs kept in fuzz/regressions run everywhere.
// usage: fuzz_replay_TARGET PATH...   (a directory means every file in it, in name order)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

bool replay(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", file.c_str());
    return false;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Printed first: when the entry crashes, the last line names the input.
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", file.c_str(), bytes.size());
  // A fresh allocation of the exact size, as libFuzzer passes inputs, so reads past the end are caught.
  std::vector<std::uint8_t> exact(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(exact.data(), exact.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PATH... (files or directories of inputs)\n", argv[0]);
    return 2;
  }
  int inputs = 0;
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path path(argv[i]);
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());
      for (const auto& f : files) {
        ok = replay(f) && ok;
        ++inputs;
      }
    } else if (std::filesystem::is_regular_file(path, ec)) {
      ok = replay(path) && ok;
      ++inputs;
    } else if (!std::filesystem::exists(path, ec)) {
      // A target with no kept crashes has no regressions directory yet; that is not an error.
      std::fprintf(stderr, "replay: %s does not exist; skipped\n", path.c_str());
    }
  }
  std::printf("replayed %d inputs\n", inputs);
  if (inputs == 0) {
    std::fprintf(stderr, "replay: no inputs found: is the corpus path right?\n");
    return 1;
  }
  return ok ? 0 : 1;
}
