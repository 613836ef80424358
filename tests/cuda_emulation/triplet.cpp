// Runs the kernels of src/losses/triplet/device.cu on the host, launched as
// `losses::triplet::device` launches them, for the unit tests of that module.
//
// usage: triplet INPUT   (stdout: the B x B counts, the B x B partial sums, the loss, the divisor,
//                         then the B x B gradient with respect to x, as doubles)
// INPUT: u32 B, mining (0 all, 1 semi-hard, 2 easy positive), f32 (0/1); f64 margin;
// the B x B distances (f32 or f64); u32 C; the B class ids, the C + 1 offsets of the class lists
// and the B items listed by class (u32); the incoming gradient (one f32 or f64).
#include "launch.hpp"

#include "../../src/losses/triplet/device.cu"

// Blocks of 5 threads, so that blocks end past the rows and the bounds checks are exercised; the
// reduction's kernels in scrambled orders, the row kernel on two blocks (several strides).
static const unsigned int BLOCK = 5;

template <typename T, typename Pairs, typename Easy, typename Total, typename Grad>
static void run(rw_input& in, unsigned int b, unsigned int mining, double margin, Pairs pairs,
                Easy easy, Total total, Grad grad) {
  const size_t bb = (size_t)b * b;
  std::vector<T> x = in.take<T>(bb);
  const unsigned int classes = in.take<unsigned int>(1)[0];
  std::vector<unsigned int> cls = in.take<unsigned int>(b);
  std::vector<unsigned int> class_start = in.take<unsigned int>((size_t)classes + 1);
  std::vector<unsigned int> class_items = in.take<unsigned int>(b);
  std::vector<T> g = in.take<T>(1);
  in.finish();
  std::vector<double> counts(bb, 0.0), partial(bb, 0.0);
  const rw_dim3 block{BLOCK, 1, 1};
  if (mining == 2)
    rw_launch(rw_dim3{(b + BLOCK - 1) / BLOCK, 1, 1}, block, [&] {
      easy(x.data(), cls.data(), b, margin, counts.data(), partial.data());
    });
  else
    rw_launch(rw_dim3{b, (b + BLOCK - 1) / BLOCK, 1}, block, [&] {
      pairs(x.data(), cls.data(), class_start.data(), class_items.data(), b, margin, (int)mining,
            counts.data(), partial.data());
    });
  // Filled with NaN: a value a kernel fails to write shows in the output.
  const double nan = std::nan("");
  std::vector<double> rows(2 * (size_t)b, nan), divisor(1, nan);
  std::vector<T> loss(1, (T)nan), dx(bb, (T)nan);
  rw_launch_shuffled(rw_dim3{2, 1, 1}, block, 7,
                     [&] { rankwise_triplet_rows(counts.data(), partial.data(), b, rows.data()); });
  rw_launch_shuffled(rw_dim3{1, 1, 1}, block, 8,
                     [&] { total(rows.data(), b, loss.data(), divisor.data()); });
  rw_launch_shuffled(rw_dim3{b, (b + BLOCK - 1) / BLOCK, 1}, block, 9,
                     [&] { grad(counts.data(), divisor.data(), g.data(), dx.data(), b); });
  rw_write_doubles(counts);
  rw_write_doubles(partial);
  rw_write_doubles(loss);
  rw_write_doubles(divisor);
  rw_write_doubles(dx);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s INPUT\n", argv[0]);
    return 2;
  }
  rw_input in(argv[1]);
  std::vector<unsigned int> head = in.take<unsigned int>(3);
  const double margin = in.take<double>(1)[0];
  if (head[2])
    run<float>(in, head[0], head[1], margin, rankwise_triplet_pairs_f32, rankwise_triplet_easy_f32,
               rankwise_triplet_total_f32, rankwise_triplet_grad_f32);
  else
    run<double>(in, head[0], head[1], margin, rankwise_triplet_pairs_f64,
                rankwise_triplet_easy_f64, rankwise_triplet_total_f64, rankwise_triplet_grad_f64);
  return 0;
}
