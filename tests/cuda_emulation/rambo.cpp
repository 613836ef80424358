// Runs the kernels of src/losses/rambo/device.cu on the host, launched as
// `losses::rambo::device` launches them, for the unit tests of that module.
//
// usage: rambo INPUT   (stdout: the loss, then the B x B gradient dL/ds, as doubles)
// INPUT: u32 B, f32 (0/1); f64 incoming gradient; f64 the stored sequences' share of the value;
// the B x B similarities (f32 or f64); the B class ids (u32); the B normalisers (f64); the B
// relevant counts (u32); the B x B half-normal magnitudes (f64, read only with half_normal);
// struct rw_rambo.
#include "launch.hpp"

#include "../../src/losses/rambo/device.cu"

// Blocks of 6 threads, so that blocks end past the rows and the bounds checks are exercised.
static const unsigned int BLOCK = 6;

// A sorted row per query (keys and columns), poisoned: a NaN key and a column past every row,
// which a read of an entry no kernel wrote would show (a wrong count, or a fault).
struct rows {
  std::vector<double> key;
  std::vector<unsigned int> col;
  explicit rows(size_t n) : key(n, std::nan("")), col(n, 0xFFFFFFFFu) {}
};

static rw_dim3 grid_for(unsigned int b, unsigned int cols) {
  return rw_dim3{b, (cols + BLOCK - 1) / BLOCK, 1};
}

// The merge passes of `merge_runs`: from runs of p.tile entries until a run holds `longest`.
static rows merge_runs(rows sorted, const std::vector<unsigned int>& cls,
                       const std::vector<unsigned int>& rel, unsigned int b, unsigned int stride,
                       unsigned int len, int per_row, unsigned int longest, const rw_rambo& p) {
  rows spare(sorted.key.size());
  for (unsigned int width = p.tile; width < longest; width *= 2) {
    const rw_merge m{stride, width, len, per_row, p.include_self};
    rw_launch(grid_for(b, longest), rw_dim3{BLOCK, 1, 1}, [&] {
      rankwise_rambo_merge(sorted.key.data(), sorted.col.data(), cls.data(), rel.data(), m,
                           spare.key.data(), spare.col.data());
    });
    std::swap(sorted, spare);
    spare = rows(sorted.key.size());
  }
  return sorted;
}

template <typename T, typename Shift, typename Total, typename Perturb, typename Blackbox>
static void run(rw_input& in, unsigned int b, double up_value, double memory_value, Shift shift,
                Total total, Perturb perturb, Blackbox blackbox) {
  const size_t bb = (size_t)b * b;
  std::vector<T> s = in.take<T>(bb);
  std::vector<unsigned int> cls = in.take<unsigned int>(b);
  std::vector<double> norm = in.take<double>(b);
  std::vector<unsigned int> rel = in.take<unsigned int>(b);
  std::vector<double> mags = in.take<double>(bb);
  rw_rambo p;
  p.b = in.take<unsigned int>(1)[0];
  p.include_self = in.take<int>(1)[0];
  p.margin = in.take<double>(1)[0];
  p.objective = in.take<int>(1)[0];
  p.normalised = in.take<int>(1)[0];
  p.lambda = in.take<double>(1)[0];
  p.count_scale = in.take<double>(1)[0];
  p.half_normal = in.take<int>(1)[0];
  p.tile = in.take<unsigned int>(1)[0];
  in.finish();
  if (p.b != b || p.tile == 0) {
    std::fprintf(stderr, "B %u in the header, %u in the parameters, tile %u\n", b, p.b, p.tile);
    std::exit(2);
  }
  const T up = (T)up_value;
  std::vector<double> rank(bb, 0.0), rank_rel(bb, 0.0), terms(bb, 0.0), y(bb, 0.0);
  std::vector<T> jac(bb, (T)0);
  const rw_dim3 block{BLOCK, 1, 1};
  // The shifted sequences and their runs, the merges, then the ranks and terms (the value).
  rows runs(bb);
  rw_launch(grid_for(b, b), block, [&] {
    shift(s.data(), cls.data(), mags.data(), p, y.data(), runs.key.data(), runs.col.data());
  });
  const rows sorted = merge_runs(runs, cls, rel, b, b, b, 0, b, p);
  // The similarities are read by the shift kernel only: poisoned, a later read would show.
  std::fill(s.begin(), s.end(), (T)1e30);
  rw_launch(grid_for(b, b), block, [&] {
    rankwise_rambo_ranks(y.data(), sorted.key.data(), sorted.col.data(), cls.data(), rel.data(),
                         norm.data(), p, rank.data(), rank_rel.data(), terms.data());
  });
  // Each query's sum (its rows poisoned first: the kernel writes every one), then the loss.
  std::vector<double> row_sum(b, 1e30);
  const rw_dim3 rows_grid{(b + BLOCK - 1) / BLOCK, 1, 1};
  rw_launch(rows_grid, block, [&] { rankwise_rambo_row_sums(terms.data(), b, row_sum.data()); });
  T loss = (T)1e30;
  rw_launch(rw_dim3{1, 1, 1}, block,
            [&] { total(row_sum.data(), b, memory_value, p.objective, &loss); });
  // The perturbed sequences, poisoned first: the later kernels read only what the perturbation
  // kernel writes.
  std::vector<double> z(bb, std::nan(""));
  rw_launch(grid_for(b, b), block, [&] {
    perturb(cls.data(), norm.data(), p, &up, rank.data(), rank_rel.data(), y.data(), z.data());
  });
  const unsigned int longest = *std::max_element(rel.begin(), rel.end());
  const unsigned int stride = longest > 0 ? longest : 1;
  rows zruns((size_t)b * stride);
  if (longest > 0)
    rw_launch(grid_for(b, longest), block, [&] {
      rankwise_rambo_perturbed_tiles(z.data(), sorted.col.data(), rel.data(), p, stride,
                                     zruns.key.data(), zruns.col.data());
    });
  const rows zsorted = merge_runs(zruns, cls, rel, b, stride, 0, 1, longest, p);
  rw_launch(grid_for(b, b), block, [&] {
    blackbox(p, rank.data(), z.data(), sorted.key.data(), sorted.col.data(), zsorted.key.data(),
             zsorted.col.data(), rel.data(), stride, jac.data());
  });
  rw_write_doubles(std::vector<double>{(double)loss});
  rw_write_doubles(jac);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s INPUT\n", argv[0]);
    return 2;
  }
  rw_input in(argv[1]);
  std::vector<unsigned int> head = in.take<unsigned int>(2);
  const double up = in.take<double>(1)[0];
  const double memory_value = in.take<double>(1)[0];
  if (head[1])
    run<float>(in, head[0], up, memory_value, rankwise_rambo_shift_f32, rankwise_rambo_total_f32,
               rankwise_rambo_perturb_f32, rankwise_rambo_blackbox_f32);
  else
    run<double>(in, head[0], up, memory_value, rankwise_rambo_shift_f64,
                rankwise_rambo_total_f64, rankwise_rambo_perturb_f64, rankwise_rambo_blackbox_f64);
  return 0;
}
