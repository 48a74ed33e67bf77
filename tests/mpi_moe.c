// mpi_moe.c — run under mpirun by test_mesh.sh (not a ctest test of its own): the MoE layer on a
// mesh against the same layer in one process, in the edge cases peers crash on: every token routed
// to the same experts (so whole EP ranks receive zero tokens and experts get zero rows), k = 1 with
// all tokens on expert 0, and ordinary random routing; dropless and capacity. Each rank compares its
// rows of y and dx, and its slices of the weight gradients (summed over their replica groups),
// with one process's values; then the same with the experts' hidden rows and the rows sent to them in bf16
// (hid_bf16.h: the GPU backend's format, so src/moe's addressing of it and the exchange's CT_BF16 rows run
// here), also through the pipelined exchange (r 2); and, where ETP is 1, with --fp8-dispatch on the cpu's FP8
// table (moe.h m->fp8_dispatch: the rows rounded to FP8 in both, packed across EP ranks in the mesh's).
// usage: mpi_moe TP EP ETP
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "moe/moe.h"
#include "parallel/mesh.h"
#include "test_util.h"
#include "hid_bf16.h"
#include "ops/cpu/cpu_ops.h"

static void fill(float *p, size_t n, Rng *r, float s) {
    for (size_t i = 0; i < n; i++) p[i] = s * rng_normal(r);
}

static double relerr(const float *a, const float *b, size_t n) {
    double mx = 0, md = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(a[i]) > mx) mx = fabs(a[i]);
        double d = fabs((double)a[i] - b[i]);
        if (d > md || isnan(b[i])) md = isnan(b[i]) ? INFINITY : d;
    }
    return md / (mx > 0 ? mx : 1);
}

static void run_case(const Mesh *mesh, const char *label, int k, int rig, DispatchMode mode,
                     const Backend *be, int ov, int f8d) {
    ModelConfig c;
    config_preset(&c, "tiny");
    c.d_model = 8;
    c.d_ff = 12;
    c.n_experts = 4;
    c.top_k = k;
    c.dispatch = mode;
    c.capacity_factor = 0.7f;
    const int Nl = 10; // tokens per DP rank
    int DP = mesh->s.dp, d = c.d_model, f = c.d_ff, E = c.n_experts, N = Nl * DP;
    int EP = mesh->s.ep, ETP = mesh->s.etp, El = E / EP, fl = f / ETP, e0 = mesh->me.ep * El,
        f0 = mesh->me.etp * fl;
    Rng r;
    rng_seed(&r, 99);
    float *x = xmalloc(sizeof(float) * N * d), *dy = xmalloc(sizeof(float) * N * d);
    float *wr = xmalloc(sizeof(float) * E * d), *w1 = xmalloc(sizeof(float) * E * f * d),
          *w3 = xmalloc(sizeof(float) * E * f * d), *w2 = xmalloc(sizeof(float) * E * d * f);
    fill(x, (size_t)N * d, &r, 1);
    fill(dy, (size_t)N * d, &r, 1);
    fill(wr, (size_t)E * d, &r, rig ? 0.0f : 1.0f); // rig: all-zero router -> ties -> experts 0..k-1
    fill(w1, (size_t)E * f * d, &r, 0.3f);
    fill(w3, (size_t)E * f * d, &r, 0.3f);
    fill(w2, (size_t)E * d * f, &r, 0.3f);
    // one process, all N tokens
    MoeLayer ref;
    MoeScratch rs;
    moe_layer_init(&ref, be, &c, N, NULL);
    moe_scratch_init(&rs, be, &c, N);
    ref.fp8_dispatch = f8d;
    float *yr = xcalloc((size_t)N * d, 4), *dxr = xcalloc((size_t)N * d, 4);
    float *gr = xcalloc((size_t)E * d, 4), *g1 = xcalloc((size_t)E * f * d, 4),
          *g3 = xcalloc((size_t)E * f * d, 4), *g2 = xcalloc((size_t)E * d * f, 4);
    MoeWeights W = {.router = wr, .w1 = w1, .w3 = w3, .w2 = w2};
    MoeGrads GR = {.router = gr, .w1 = g1, .w3 = g3, .w2 = g2};
    moe_forward(&ref, yr, NULL, x, N, &W, &c, 0, 0);
    moe_backward(&ref, &rs, dxr, dy, x, &W, &GR, &c, 0.3f, 0.05f);
    // the mesh: my DP share of the tokens, my experts, my f slice
    float *l1 = xmalloc(sizeof(float) * El * fl * d), *l3 = xmalloc(sizeof(float) * El * fl * d),
          *l2 = xmalloc(sizeof(float) * El * d * fl);
    for (int e = 0; e < El; e++)
        for (int i = 0; i < fl; i++) {
            memcpy(l1 + ((size_t)e * fl + i) * d, w1 + ((size_t)(e0 + e) * f + f0 + i) * d,
                   sizeof(float) * d);
            memcpy(l3 + ((size_t)e * fl + i) * d, w3 + ((size_t)(e0 + e) * f + f0 + i) * d,
                   sizeof(float) * d);
        }
    for (int e = 0; e < El; e++)
        for (int j = 0; j < d; j++)
            memcpy(l2 + ((size_t)e * d + j) * fl, w2 + ((size_t)(e0 + e) * d + j) * f + f0,
                   sizeof(float) * fl);
    MoeComms cm = {mesh->tp, mesh->ep, mesh->etp, mesh->stage, NULL, NULL};
    MoeLayer ml;
    MoeScratch ms;
    moe_layer_init(&ml, be, &c, Nl, &cm);
    moe_scratch_init(&ms, be, &c, Nl);
    ml.overlap = ov; // the pipelined exchange's chunks (where the exchange is not local)
    ml.fp8_dispatch = f8d;
    float *y = xcalloc((size_t)Nl * d, 4), *dx = xcalloc((size_t)Nl * d, 4);
    float *hr = xcalloc((size_t)E * d, 4), *h1 = xcalloc((size_t)El * fl * d, 4),
          *h3 = xcalloc((size_t)El * fl * d, 4), *h2 = xcalloc((size_t)El * d * fl, 4);
    MoeWeights LW = {.router = wr, .w1 = l1, .w3 = l3, .w2 = l2};
    MoeGrads LG = {.router = hr, .w1 = h1, .w3 = h3, .w2 = h2};
    size_t row0 = (size_t)mesh->me.dp * Nl;
    moe_forward(&ml, y, NULL, x + row0 * d, Nl, &LW, &c, 0, (int64_t)row0);
    moe_backward(&ml, &ms, dx, dy + row0 * d, x + row0 * d, &LW, &LG, &c, 0.3f, 0.05f);
    comm_allreduce(mesh->stage, hr, (size_t)E * d, CT_F32);
    comm_allreduce(mesh->edp, h1, (size_t)El * fl * d, CT_F32);
    comm_allreduce(mesh->edp, h3, (size_t)El * fl * d, CT_F32);
    comm_allreduce(mesh->edp, h2, (size_t)El * d * fl, CT_F32);
    // my slices of the reference gradients
    float *s1 = xmalloc(sizeof(float) * El * fl * d), *s3 = xmalloc(sizeof(float) * El * fl * d),
          *s2 = xmalloc(sizeof(float) * El * d * fl);
    for (int e = 0; e < El; e++)
        for (int i = 0; i < fl; i++) {
            memcpy(s1 + ((size_t)e * fl + i) * d, g1 + ((size_t)(e0 + e) * f + f0 + i) * d,
                   sizeof(float) * d);
            memcpy(s3 + ((size_t)e * fl + i) * d, g3 + ((size_t)(e0 + e) * f + f0 + i) * d,
                   sizeof(float) * d);
        }
    for (int e = 0; e < El; e++)
        for (int j = 0; j < d; j++)
            memcpy(s2 + ((size_t)e * d + j) * fl, g2 + ((size_t)(e0 + e) * d + j) * f + f0,
                   sizeof(float) * fl);
    // 1e-5: the same float32 math with rows summed in other orders (see test_mesh.sh)
    const double tol = 1e-5;
    double ey = relerr(yr + row0 * d, y, (size_t)Nl * d), edx = relerr(dxr + row0 * d, dx, (size_t)Nl * d);
    double er = relerr(gr, hr, (size_t)E * d), e1 = relerr(s1, h1, (size_t)El * fl * d),
           e3 = relerr(s3, h3, (size_t)El * fl * d), e2 = relerr(s2, h2, (size_t)El * d * fl);
    EXPECT(ey <= tol && edx <= tol && er <= tol && e1 <= tol && e3 <= tol && e2 <= tol,
           "[%s] rank %d: y %.2e dx %.2e router %.2e w1 %.2e w3 %.2e w2 %.2e", label, mesh->rank, ey, edx, er,
           e1, e3, e2);
    EXPECT(fabs(ml.aux - ref.aux) <= 1e-6 * fabs(ref.aux) + 1e-9 &&
               fabs(ml.z - ref.z) <= 1e-6 * fabs(ref.z) + 1e-9,
           "[%s] aux %.9g vs %.9g, z %.9g vs %.9g", label, ml.aux, ref.aux, ml.z, ref.z);
    // --fp8-dispatch: where rows cross EP ranks they went packed (the exchange's FP8 rows exist)
    EXPECT(!f8d || mesh->s.ep == 1 || (ov > 1 ? ml.xc[0].pk : ml.x.pk),
           "[%s] rank %d: no packed FP8 rows sent", label, mesh->rank);
    EXPECT(ml.dropped == ref.plan.dropped, "[%s] dropped %lld vs %d", label, (long long)ml.dropped,
           ref.plan.dropped);
    int64_t rows = ml.x.Rg, zero_ranks = rows == 0;
    comm_allreduce(mesh->world, &zero_ranks, 1, CT_I64);
    if (mesh->rank == 0)
        printf("%-34s ok=%d  ranks receiving no rows: %lld of %d, dropped %lld\n", label, t_failures == 0,
               (long long)zero_ranks, mesh->s.world, (long long)ml.dropped);
    moe_layer_free(&ref);
    moe_layer_free(&ml);
    moe_scratch_free(&rs);
    moe_scratch_free(&ms);
    free(x);
    free(dy);
    free(wr);
    free(w1);
    free(w3);
    free(w2);
    free(yr);
    free(dxr);
    free(gr);
    free(g1);
    free(g3);
    free(g2);
    free(l1);
    free(l3);
    free(l2);
    free(y);
    free(dx);
    free(hr);
    free(h1);
    free(h3);
    free(h2);
    free(s1);
    free(s3);
    free(s2);
}

int main(int argc, char **argv) {
    Comm *world = comm_world_init(&argc, &argv);
    if (argc < 4) DIE("usage: mpi_moe TP EP ETP");
    MeshShape s = {comm_size(world), atoi(argv[1]), 0, 1, atoi(argv[2]), atoi(argv[3]), 0, 0, 0};
    ModelConfig c;
    config_preset(&c, "tiny");
    c.n_experts = 4;
    const char *bad = mesh_shape_resolve(&s, NULL);
    if (bad) DIE("%s", bad);
    Mesh mesh;
    mesh_init(&mesh, &s, world);
    const Backend *cpu = backend_cpu(), *hid = backend_cpu_hid_bf16();
    run_case(&mesh, "random routing, dropless, k=2", 2, 0, DISPATCH_DROPLESS, cpu, 1, 0);
    run_case(&mesh, "random routing, capacity, k=2", 2, 0, DISPATCH_CAPACITY, cpu, 1, 0);
    run_case(&mesh, "all tokens on experts 0,1, k=2", 2, 1, DISPATCH_DROPLESS, cpu, 1, 0);
    run_case(&mesh, "all tokens on expert 0, k=1", 1, 1, DISPATCH_DROPLESS, cpu, 1, 0);
    run_case(&mesh, "all on expert 0, capacity, k=1", 1, 1, DISPATCH_CAPACITY, cpu, 1, 0);
    run_case(&mesh, "bf16 hidden rows, random, k=2", 2, 0, DISPATCH_DROPLESS, hid, 1, 0);
    run_case(&mesh, "bf16 hidden rows, random, k=2, r 2", 2, 0, DISPATCH_DROPLESS, hid, 2, 0);
    run_case(&mesh, "bf16 hidden rows, capacity, r 2", 2, 0, DISPATCH_CAPACITY, hid, 2, 0);
    if (s.etp == 1) { // (fp8 takes --etp 1: ETP slices would cut the weights' 128x128 blocks)
        const Backend *f8 = backend_cpu_fp8();
        run_case(&mesh, "fp8 dispatch, random, k=2", 2, 0, DISPATCH_DROPLESS, f8, 1, 1);
        run_case(&mesh, "fp8 dispatch, random, k=2, r 2", 2, 0, DISPATCH_DROPLESS, f8, 2, 1);
        run_case(&mesh, "fp8 dispatch, all on expert 0, k=1", 1, 1, DISPATCH_CAPACITY, f8, 1, 1);
    }
    int64_t f = t_failures;
    comm_allreduce(world, &f, 1, CT_I64);
    mesh_free(&mesh);
    comm_world_finalize();
    if (comm_rank(world) == 0) printf("mpi_moe: %lld failures over all ranks\n", (long long)f);
    return f ? 1 : 0;
}
