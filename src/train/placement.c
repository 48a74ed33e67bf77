// placement.c — the backend, the mesh's device transport and the GPU memory check (see placement.h).
#include "train/placement.h"
#include <omp.h>
#include <string.h>
#include <unistd.h>
#include "core/common.h"
#include "model/attention.h"
#include "moe/moe.h"
#include "train/cost.h"

// The environment's switches of the backend (checked before anything is touched).
static void env_switches(Placement *p) {
    // MOE_PROFILE=1: time every op (serialised) and print where a step's time goes at the end
    p->profile = getenv("MOE_PROFILE") && atoi(getenv("MOE_PROFILE")) > 0;
    if (p->profile) p->be = backend_profiled(p->be);
    // MOE_BF16_SHADOW=0: no bf16 copy of the weights for the GEMMs (set up before the first step)
    const char *shv = getenv("MOE_BF16_SHADOW");
    if (shv && *shv && strcmp(shv, "0") && strcmp(shv, "1"))
        DIE("MOE_BF16_SHADOW must be 0 (convert the weights per GEMM) or 1 (the default), not '%s'", shv);
    p->bf16_shadow = !(shv && !strcmp(shv, "0"));
    // MOE_GROUPED_GEMM=cublas: the expert GEMMs through cuBLAS instead of our Hopper kernel (cuda)
    const char *ggv = getenv("MOE_GROUPED_GEMM");
    if (ggv && *ggv && strcmp(ggv, "auto") && strcmp(ggv, "cublas"))
        DIE("MOE_GROUPED_GEMM must be auto (the default) or cublas, not '%s'", ggv);
    (void)attention_ds_cap_mb(); // MOE_ATTN_DS_MB: a bad value dies here, before anything is written
    (void)moe_act_mem_old(); // MOE_ACT_MEM_OLD=1: the MoE backward's own scratch (moe.h); likewise
}

// The device transport of a mesh on GPUs (--gpu-comm), the same on every rank: whether any node has more
// ranks than GPUs is agreed over the world first.
static void choose_gpu_comm(Placement *p, const TrainOptions *o, const Comm *world) {
    size_t fr, tot;
    int ngpu = backend_cuda_gpus(&fr, &tot), local = comm_local_size();
    int shared = local > ngpu, nccl = comm_have_nccl();
    int32_t v[3] = {shared, !nccl, local != comm_size(world)};
    comm_allreduce(world, v, 3, CT_I32); // (every rank: the same choice)
    shared = v[0] > 0;
    nccl = v[1] == 0;
    int one_node = v[2] == 0;
    char share[128];
    if (local > ngpu)
        snprintf(share, sizeof share, "%d processes on this node share %d GPU%s", local, ngpu,
                 ngpu == 1 ? "" : "s");
    else snprintf(share, sizeof share, "ranks share GPUs on another node");
    p->attach = 1;
    switch (o->gpu_comm) {
        case GPUCOMM_NCCL:
            if (!nccl)
                DIE("--gpu-comm nccl: this moe was built without the NCCL backend (CMake found no NCCL, or "
                    "-DMOE_NCCL=OFF); use --gpu-comm staged");
            if (shared)
                DIE("--gpu-comm nccl: %s, and NCCL takes one GPU per process; use --gpu-comm staged (or "
                    "auto)",
                    share);
            p->dev = MESH_DEV_NCCL;
            snprintf(p->why, sizeof p->why, "gpu-comm: nccl (--gpu-comm nccl; pipeline messages staged)");
            return;
        case GPUCOMM_MPI: {
            int aware = comm_mpi_cuda_aware();
            if (aware == 0)
                DIE("--gpu-comm mpi: this MPI library says it cannot read device memory "
                    "(MPIX_Query_cuda_support() is 0); use --gpu-comm staged");
            p->dev = MESH_DEV_DIRECT;
            snprintf(p->why, sizeof p->why, "gpu-comm: mpi (--gpu-comm mpi; the MPI library %s)",
                     aware > 0 ? "reports CUDA awareness" : "cannot say whether it is CUDA-aware");
            return;
        }
        case GPUCOMM_STAGED:
            p->dev = MESH_DEV_STAGED;
            snprintf(p->why, sizeof p->why, "gpu-comm: staged (--gpu-comm staged)");
            return;
        case GPUCOMM_IPC:
            if (!one_node)
                DIE("--gpu-comm ipc: the ranks span several nodes (%d of %d on this one), and CUDA IPC joins "
                    "the "
                    "processes of one; use --gpu-comm staged or nccl",
                    local, comm_size(world));
            p->dev = MESH_DEV_IPC;
            snprintf(p->why, sizeof p->why,
                     "gpu-comm: ipc (--gpu-comm ipc; pipeline messages and reductions staged)");
            return;
        default:
            if (nccl && !shared) {
                p->dev = MESH_DEV_NCCL;
                snprintf(p->why, sizeof p->why,
                         "gpu-comm: nccl (auto: every rank has its own GPU; pipeline messages staged)");
            } else if (shared && one_node) { // (measured: ep2 on one H200, 1.29x staged's tokens/s)
                p->dev = MESH_DEV_IPC;
                snprintf(p->why, sizeof p->why,
                         "gpu-comm: ipc (auto: %s, on one node: the all-to-all device to device, the rest "
                         "staged)",
                         share);
            } else {
                p->dev = MESH_DEV_STAGED;
                snprintf(p->why, sizeof p->why, "gpu-comm: staged (auto: %s)",
                         !nccl ? "this moe was built without NCCL"
                               : strcat(share, ": NCCL takes one GPU each"));
            }
    }
}

// The cpu backend's threads as the header prints them when moe chose how they wait (cli/main.c sets
// OMP_WAIT_POLICY=passive and MOE_OMP_DEFAULT=1 where neither it nor GOMP_SPINCOUNT was set; a wait policy
// the user set is theirs, and the header stays as it was).
static void describe_threads(Placement *p, int shared) {
    if (!getenv("MOE_OMP_DEFAULT")) return;
    int n = omp_get_max_threads();
    snprintf(
        p->threads, sizeof p->threads,
        "threads: %d OpenMP thread%s (%s), waiting passive (moe's default where OMP_WAIT_POLICY is unset)", n,
        n == 1 ? "" : "s",
        getenv("OMP_NUM_THREADS") ? "OMP_NUM_THREADS"
            : shared              ? "this node's cores shared by its ranks"
                                  : "every core");
}

void placement_choose(Placement *p, const TrainOptions *o, const Comm *world) {
    memset(p, 0, sizeof *p);
    // several ranks on one machine share its cores: unless told otherwise, each takes its share
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int shared = comm_size(world) > 1 && !getenv("OMP_NUM_THREADS") && local && atoi(local) > 0;
    if (shared) {
        int t = omp_get_num_procs() / atoi(local);
        omp_set_num_threads(t > 0 ? t : 1);
    }
    // MOE_FORCE_NCCL=1 takes the mesh's path with one process too (tests on one GPU)
    int force_nccl = comm_nccl_forced();
    p->be = backend_by_name(o->device);
    p->on_gpu = p->be != backend_cpu();
    if (prec_fp8(o->precision)) p->be = backend_fp8(p->be);
    if (p->be->fp8_keep_weights) p->be->fp8_keep_weights(o->fp8_weight_cache); // (--fp8-weight-cache)
    if (o->fp8_dense) p->be = backend_fp8_dense(p->be);
    if (!p->on_gpu) describe_threads(p, shared);
    if (force_nccl && !p->on_gpu)
        DIE("MOE_FORCE_NCCL=1 runs the NCCL path on the GPU: it needs --device cuda");
    if (force_nccl && o->gpu_comm != GPUCOMM_AUTO && o->gpu_comm != GPUCOMM_NCCL)
        DIE("MOE_FORCE_NCCL=1 runs the NCCL path: it takes --gpu-comm auto or nccl");
    p->meshed = comm_size(world) > 1 || force_nccl;
    if (!p->on_gpu && o->gpu_comm == GPUCOMM_NCCL)
        DIE("--gpu-comm nccl moves GPU buffers: it needs --device cuda or cuda-fp32");
    if (p->meshed && p->on_gpu) choose_gpu_comm(p, o, world);
    else if (p->meshed && o->gpu_comm != GPUCOMM_AUTO) {
        // the cpu backend: the same code over host memory (how CI tests the transports)
        static const char *name[] = {"auto", "nccl", "staged", "mpi", "ipc"};
        static const MeshDev dev[] = {MESH_DEV_STAGED, MESH_DEV_NCCL, MESH_DEV_STAGED, MESH_DEV_DIRECT,
                                      MESH_DEV_IPC};
        if (o->gpu_comm == GPUCOMM_IPC && comm_local_size() != comm_size(world))
            DIE("--gpu-comm ipc: the ranks span several nodes; it joins the processes of one");
        p->attach = 1;
        p->dev = dev[o->gpu_comm];
        snprintf(p->why, sizeof p->why,
                 "gpu-comm: %s over the cpu backend's host memory (a test of the path)", name[o->gpu_comm]);
    }
    env_switches(p);
}

// A CUDA context and cuBLAS's workspace per process (measured on the H200: about 0.5 GiB).
#define CONTEXT_BYTES (600.0 * 1048576.0)

void placement_check_memory(const Placement *p, const ModelConfig *c, const TrainOptions *o,
                            const MeshShape *ms, const Comm *world) {
    if (!p->on_gpu || comm_size(world) == 1) return;
    CostMesh cm;
    const char *bad = cost_mesh(&cm, c, o, ms);
    if (bad) DIE("%s", bad);
    int stage = mesh_coord(ms, comm_rank(world)).pp;
    double need = cm.stage[stage].mem.total + CONTEXT_BYTES;
    cost_mesh_free(&cm);
    size_t fr, tot;
    int ngpu = backend_cuda_gpus(&fr, &tot);
    int dev = comm_local_rank() % (ngpu > 0 ? ngpu : 1);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    // (host, GPU, bytes needed, GPU bytes) of every rank; each GPU's ranks summed
    int n = comm_size(world);
    double mine[4] = {(double)(hash_bytes(host, strlen(host), 1) >> 12), dev, need, (double)tot};
    double *all = xmalloc(sizeof(double) * 4 * (size_t)n);
    comm_allgather(world, mine, all, 4, CT_F64);
    for (int i = 0; i < n; i++) {
        double sum = 0;
        int ranks = 0;
        for (int j = 0; j < n; j++)
            if (all[4 * j] == all[4 * i] && all[4 * j + 1] == all[4 * i + 1]) {
                sum += all[4 * j + 2];
                ranks++;
            }
        if (sum > all[4 * i + 3]) {
            char a[32], b[32], e[32];
            fmt_bytes(a, sizeof a, sum);
            fmt_bytes(b, sizeof b, all[4 * i + 3]);
            fmt_bytes(e, sizeof e, all[4 * i + 2]);
            DIE("%d ranks share GPU %d of rank %d's node and need %s in all (rank %d: %s, of which %.0f MiB "
                "its CUDA context; `moe info` counts the rest), more than its %s: use fewer ranks per GPU, a "
                "smaller --batch or model, or --recompute",
                ranks, (int)all[4 * i + 1], i, a, i, e, CONTEXT_BYTES / 1048576.0, b);
        }
    }
    free(all);
}
