// Host emulation of the CUDA launch model, for testing the library's kernel sources on a machine
// without a GPU: the kernels are compiled as plain C++ and each launch runs every (block, thread)
// of its grid in turn. Only for kernels without shared memory or synchronisation, whose threads
// are independent: the order then cannot change a result, except through integer atomics that
// hand out slots (`atomicAdd`), which `rw_launch_shuffled` runs in a scrambled order so that a
// test sees the result does not depend on it. Plus the input and output helpers of the harnesses
// (one per kernel source, driven by that source's unit tests).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

struct rw_dim3 {
  unsigned int x = 0, y = 0, z = 0;
};
static rw_dim3 blockIdx, threadIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline

// The CUDA intrinsics the kernels use, on the host. Threads run one at a time, so an atomic
// addition is a plain one.
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
  const unsigned int old = *address;
  *address = old + value;
  return old;
}

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

// Runs `kernel()` for every thread of the grid, like `rw_launch`, in an order scrambled by `seed`
// (0: in order): for kernels whose threads take slots from an atomic counter.
template <typename F>
void rw_launch_shuffled(rw_dim3 grid, rw_dim3 block, unsigned long long seed, F kernel) {
  if (seed == 0) {
    rw_launch(grid, block, kernel);
    return;
  }
  gridDim = grid;
  blockDim = block;
  std::vector<std::pair<rw_dim3, rw_dim3>> threads;
  for (unsigned int bz = 0; bz < grid.z; ++bz)
    for (unsigned int by = 0; by < grid.y; ++by)
      for (unsigned int bx = 0; bx < grid.x; ++bx)
        for (unsigned int tz = 0; tz < block.z; ++tz)
          for (unsigned int ty = 0; ty < block.y; ++ty)
            for (unsigned int tx = 0; tx < block.x; ++tx)
              threads.push_back({rw_dim3{bx, by, bz}, rw_dim3{tx, ty, tz}});
  unsigned long long state = seed;
  for (size_t i = threads.size(); i > 1; --i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(threads[i - 1], threads[(state >> 33) % i]);
  }
  for (const auto& t : threads) {
    blockIdx = t.first;
    threadIdx = t.second;
    kernel();
  }
}
