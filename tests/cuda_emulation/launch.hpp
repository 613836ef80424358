// Host emulation of the CUDA launch model, for testing the library's kernel sources on a machine
// without a GPU: the kernels are compiled as plain C++ and each launch runs every (block, thread)
// of its grid in turn. Only for kernels without shared memory, synchronisation or atomics, whose
// threads are independent (the order then cannot change a result).
#pragma once
#include <cmath>
#include <cstdint>

struct rw_dim3 {
  unsigned int x = 0, y = 0, z = 0;
};
static rw_dim3 blockIdx, threadIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
using std::exp;
using std::fmin;
using std::nan;

// Runs `kernel(args...)` on a grid of `grid` blocks of `block` threads.
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
