// Runs the kNN kernel of src/retrieval/device_rank.cu on the host, launched as
// `retrieval::device_rank` launches it, for the unit tests of that module.
//
// usage: knn INPUT   (stdout, as doubles: each row's fill count, then each row's cap slots as
// pairs (high 32 bits, low 32 bits of the rank key; unwritten slots stay 0))
// INPUT: u32 rows, nr, cap, start, same_index, seed (0: threads in order, else scrambled); the
// rows x nr scores (f32); the rows thresholds (f32).
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
  std::vector<unsigned int> head = in.take<unsigned int>(6);
  rw_knn p;
  p.rows = head[0];
  p.nr = head[1];
  p.cap = head[2];
  p.start = head[3];
  p.same_index = (int)head[4];
  const unsigned long long seed = head[5];
  std::vector<float> scores = in.take<float>((size_t)p.rows * p.nr);
  std::vector<float> thresholds = in.take<float>(p.rows);
  in.finish();
  std::vector<unsigned int> fill(p.rows, 0);
  std::vector<unsigned long long> keys((size_t)p.rows * p.cap, 0);
  rw_launch_shuffled(rw_dim3{p.rows, (p.nr + BLOCK - 1) / BLOCK, 1}, rw_dim3{BLOCK, 1, 1}, seed,
                     [&] {
                       rankwise_knn_gather(scores.data(), thresholds.data(), p, fill.data(),
                                           keys.data());
                     });
  rw_write_doubles(fill);
  std::vector<unsigned int> halves;
  for (unsigned long long k : keys) {
    halves.push_back((unsigned int)(k >> 32));
    halves.push_back((unsigned int)(k & 0xffffffffull));
  }
  rw_write_doubles(halves);
  return 0;
}
