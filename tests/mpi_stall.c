// mpi_stall.c — a rank that joins the MPI job and then never reaches a collective (for
// tests/test_agree.sh: the other ranks' start-up agreement must end the job in bounded time).
// `mpi_stall barrier`: rank 0 enters a barrier that the others never reach (the MPI watchdog must
// end the job in bounded time, naming the barrier).
// Must not hold: anything else.
#include <string.h>
#include <unistd.h>
#include "parallel/comm.h"

int main(int argc, char **argv) {
    Comm *w = comm_world_init(&argc, &argv);
    if (argc > 1 && !strcmp(argv[1], "barrier") && comm_rank(w) == 0) comm_barrier(w);
    sleep(120);
    comm_world_finalize();
    return 0;
}
