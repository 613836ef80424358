// Runs the kernels of src/retrieval/device_rank.cu on the host, launched as
// `retrieval::device_rank` launches them, for the unit tests of that module.
//
// usage: rank INPUT   (stdout, as doubles: each row's fill count, then the positions, then the
// levels of the positives, row after row)
// INPUT: u32 rows, nr, levels, min_level, start, same_index, seed (0: threads in order, else
// scrambled); the rows x nr scores (f32); the references' labels, coarsest column first
// (levels x nr, i64); the chunk's queries' labels, coarsest first (rows x levels, i64); the
// rows + 1 offsets (u32).
#include "launch.hpp"

#include "../../src/retrieval/device_rank.cu"

// Blocks of 3 threads, so that blocks end past the rows and the bounds checks are exercised.
static const unsigned int BLOCK = 3;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s INPUT\n", argv[0]);
    return 2;
  }
  rw_input in(argv[1]);
  std::vector<unsigned int> head = in.take<unsigned int>(7);
  rw_rank p;
  p.rows = head[0];
  p.nr = head[1];
  p.levels = head[2];
  p.min_level = head[3];
  p.start = head[4];
  p.same_index = (int)head[5];
  const unsigned long long seed = head[6];
  std::vector<float> scores = in.take<float>((size_t)p.rows * p.nr);
  std::vector<long long> ref = in.take<long long>((size_t)p.levels * p.nr);
  std::vector<long long> query = in.take<long long>((size_t)p.rows * p.levels);
  std::vector<unsigned int> offsets = in.take<unsigned int>(p.rows + 1);
  in.finish();
  const unsigned int total = offsets[p.rows];
  unsigned int widest = 0;
  for (unsigned int r = 0; r < p.rows; ++r)
    widest = std::max(widest, offsets[r + 1] - offsets[r]);
  std::vector<unsigned int> fill(p.rows, 0), gaps(total, 0), positions(total, 0);
  std::vector<unsigned long long> keys(total, 0), sorted(total, 0);
  std::vector<unsigned char> levels(total, 0), sorted_levels(total, 0);
  const rw_dim3 block{BLOCK, 1, 1};
  const rw_dim3 per_entry{p.rows, (p.nr + BLOCK - 1) / BLOCK, 1};
  rw_launch_shuffled(per_entry, block, seed, [&] {
    rankwise_rank_gather(scores.data(), ref.data(), query.data(), offsets.data(), p, fill.data(),
                         keys.data(), levels.data());
  });
  // The merge passes, from runs of 1 to one run as wide as the widest row, between the two
  // buffers in turn (as `device_rank::Plan::rank` launches them).
  unsigned long long* src_keys = keys.data();
  unsigned char* src_levels = levels.data();
  unsigned long long* dst_keys = sorted.data();
  unsigned char* dst_levels = sorted_levels.data();
  for (unsigned int width = 1; width < widest; width *= 2) {
    rw_launch(rw_dim3{p.rows, (widest + BLOCK - 1) / BLOCK, 1}, block, [&] {
      rankwise_rank_merge(offsets.data(), p, width, src_keys, src_levels, dst_keys, dst_levels);
    });
    std::swap(src_keys, dst_keys);
    std::swap(src_levels, dst_levels);
  }
  rw_launch_shuffled(per_entry, block, seed + 1, [&] {
    rankwise_rank_count(scores.data(), ref.data(), query.data(), offsets.data(), p, src_keys,
                        gaps.data());
  });
  rw_launch(rw_dim3{(p.rows + BLOCK - 1) / BLOCK, 1, 1}, block, [&] {
    rankwise_rank_positions(offsets.data(), p, gaps.data(), positions.data());
  });
  rw_write_doubles(fill);
  rw_write_doubles(positions);
  rw_write_doubles(std::vector<unsigned char>(src_levels, src_levels + total));
  return 0;
}
