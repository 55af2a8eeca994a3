// Open MPI's MPI_Allreduce bandwidth, measured as ring_bench measures (compiled by run.sh
// with mpicxx when Open MPI is installed).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int reps = argc > 1 ? atoi(argv[1]) : 10;
  for (long long bytes : {1LL << 20, 16LL << 20, 64LL << 20}) {
    std::vector<float> v(bytes / 4, 1.0f);
    for (int w = 0; w < 2; ++w)
      MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      t.push_back(MPI_Wtime() - t0);
    }
    std::sort(t.begin(), t.end());
    double med = t[t.size() / 2], worst;
    MPI_Reduce(&med, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("%d %lld %.4f\n", world, bytes, double(bytes) / worst / 1e9);
  }
  MPI_Finalize();
  return 0;
}
