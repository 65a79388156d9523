/*
 * mpi_ring.c — an MPI program for running Open MPI on ferroce: every rank sends to the next
 * and receives from the previous one (MPI_Sendrecv) messages of 1 B to 1 MiB, each byte
 * checked against what the sender wrote, then all ranks sum their numbers (MPI_Allreduce).
 * Over libfabric's verbs provider the large messages go as RDMA READs (ofi_rxm's rendezvous).
 *
 *   mpicc -O2 -o mpi_ring examples/c/mpi_ring.c
 *   mpirun -np 2 --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "verbs;ofi_rxm" \
 *       ferroce run -d IF -- ./mpi_ring      (each rank with its own FERROCE_ADDR)
 *
 * Prints one line per rank ("ring ok", the sum) and exits 0 when every message arrived intact.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int to = (rank + 1) % size, from = (rank + size - 1) % size, bad = 0;
	for (int len = 1; len <= (1 << 20); len *= 32) {
		char *s = malloc(len), *r = malloc(len);
		if (!s || !r)
			MPI_Abort(MPI_COMM_WORLD, 2);
		for (int i = 0; i < len; i++)
			s[i] = (char)(i * 7 + rank);
		MPI_Sendrecv(s, len, MPI_CHAR, to, 1, r, len, MPI_CHAR, from, 1, MPI_COMM_WORLD,
			     MPI_STATUS_IGNORE);
		for (int i = 0; i < len; i++) {
			if (r[i] != (char)(i * 7 + from)) {
				fprintf(stderr, "rank %d: %d-byte message from %d differs at %d\n",
					rank, len, from, i);
				bad++;
				break;
			}
		}
		free(s);
		free(r);
	}
	long v = rank + 1, sum = 0;
	MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	printf("rank %d of %d: ring %s, allreduce %ld\n", rank, size, bad ? "CORRUPT" : "ok", sum);
	MPI_Finalize();
	return bad != 0;
}
