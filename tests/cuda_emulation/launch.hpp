// Host emulation of the CUDA launch model, for testing the library's kernel sources on a machine
// without a GPU: the kernels are compiled as plain C++ and each launch runs every (block, thread)
// of its grid in turn. Only for kernels without shared memory, synchronisation or atomics, whose
// threads are independent (the order then cannot change a result). Plus the input and output
// helpers of the harnesses (one per kernel source, driven by that source's unit tests).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

struct rw_dim3 {
  unsigned int x = 0, y = 0, z = 0;
};
static rw_dim3 blockIdx, threadIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline

// Runs `kernel()` for every thread of a grid of `grid` blocks of `block` threads.
template <typename F>
void rw_launch(rw_dim3 grid, rw_dim3 block, F kernel) {
  gridDim = grid;
  blockDim = block;
  for (unsigned int bz = 0; bz < grid.z; ++bz)
    for (unsigned int by = 0; by < grid.y; ++by)
      for (unsigned int bx = 0; bx < grid.x; ++bx)
        for (unsigned int tz = 0; tz < block.z; ++tz)
          for (unsigned int ty = 0; ty < block.y; ++ty)
            for (unsigned int tx = 0; tx < block.x; ++tx) {
              blockIdx = {bx, by, bz};
              threadIdx = {tx, ty, tz};
              kernel();
            }
}

// A binary input file read whole, taken apart in order.
struct rw_input {
  std::vector<unsigned char> buf;
  size_t at = 0;

  explicit rw_input(const char* path) {
    std::FILE* f = std::fopen(path, "rb");
    if (!f) {
      std::perror(path);
      std::exit(2);
    }
    unsigned char chunk[65536];
    size_t got;
    while ((got = std::fread(chunk, 1, sizeof chunk, f)) > 0)
      buf.insert(buf.end(), chunk, chunk + got);
    std::fclose(f);
  }

  template <typename T>
  std::vector<T> take(size_t count) {
    std::vector<T> out(count);
    if (at + count * sizeof(T) > buf.size()) {
      std::fprintf(stderr, "input too short\n");
      std::exit(2);
    }
    if (count) std::memcpy(out.data(), buf.data() + at, count * sizeof(T));
    at += count * sizeof(T);
    return out;
  }

  void finish() const {
    if (at != buf.size()) {
      std::fprintf(stderr, "input has %zu bytes too many\n", buf.size() - at);
      std::exit(2);
    }
  }
};

// Writes `v` to stdout as little-endian doubles.
template <typename T>
void rw_write_doubles(const std::vector<T>& v) {
  for (T x : v) {
    double d = (double)x;
    std::fwrite(&d, sizeof d, 1, stdout);
  }
}
