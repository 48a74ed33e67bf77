// mpi_stall.c — a rank that joins the MPI job and then never reaches a collective (for
// tests/test_agree.sh: the other ranks' start-up agreement must end the job in bounded time).
// Must not hold: anything else.
#include <unistd.h>
#include "parallel/comm.h"

int main(int argc, char **argv) {
    comm_world_init(&argc, &argv);
    sleep(120);
    comm_world_finalize();
    return 0;
}
