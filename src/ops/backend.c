// backend.c — choosing a Backend by name (--device) and its FP8 variant (--precision fp8), and the size of
// the cuda attention backward's dS scratch (ops.h attention_ds_bytes and its passes over kv heads or key
// ranges; latent attention's: attention_mla_ds_bytes: the rules the kernels and moe info share, CUDA or not).
// Must not hold: ops or compositions of ops (the plain forms of the fused ops are ops/plain.h, which the
// backends include without this file).
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"

const Backend *backend_by_name(const char *name) {
    if (!name || !name[0] || !strcmp(name, "auto"))
        return backend_cuda_available() ? backend_cuda() : backend_cpu();
    if (!strcmp(name, "cpu")) return backend_cpu();
    if (!strcmp(name, "cuda") || !strcmp(name, "cuda-fp32")) {
        if (!backend_cuda_available())
            DIE("--device %s: no usable CUDA GPU here (or this moe was built without CUDA); use --device cpu",
                name);
        return name[4] ? backend_cuda_fp32() : backend_cuda();
    }
    DIE("--device %s: unknown device (cpu, cuda = bf16 tensor-core GEMMs, cuda-fp32, auto)", name);
}

const Backend *backend_fp8(const Backend *be) {
    if (be->fp8) return be;
    if (be == backend_cpu()) return backend_cpu_fp8();
    if (be == backend_cuda()) return backend_cuda_fp8(0, 0);
    if (be == backend_cuda_fp32()) return backend_cuda_fp8(1, 0);
    DIE("--precision fp8: the backend %s has no FP8 table (cpu, cuda and cuda-fp32 have)", be->name);
}

const Backend *backend_fp8_dense(const Backend *be) {
    if (be->fp8_dense) return be;
    if (be == backend_cpu() || be == backend_cpu_fp8()) return backend_cpu_fp8_dense();
    if (backend_cuda_available()) { // (asked first: backend_cuda() dies where there is none)
        if (be == backend_cuda() || be == backend_cuda_fp8(0, 0)) return backend_cuda_fp8(0, 1);
        if (be == backend_cuda_fp32() || be == backend_cuda_fp8(1, 0)) return backend_cuda_fp8(1, 1);
    }
    DIE("--fp8-dense: the backend %s has no FP8 table with the attention projections (cpu, cuda and "
        "cuda-fp32 have)",
        be->name);
}

long long attention_ds_cap_mb(void) {
    static long long cap_mb = -1;
    if (cap_mb < 0) {
        const char *e = getenv("MOE_ATTN_DS_MB");
        char *end = NULL;
        cap_mb = e && *e ? strtoll(e, &end, 10) : 1024;
        if (cap_mb < 0 || cap_mb > (1ll << 40) || (end && *end))
            DIE("MOE_ATTN_DS_MB must be a whole number of MiB (default 1024; 0: the attention backward "
                "computes dS "
                "twice instead of keeping it), not '%s'",
                e);
    }
    return cap_mb;
}

// ops.h. The kv heads a pass of one sequence: as many pairs as fit (at most KV), the passes as even as they
// can be (ceil(KV / ceil(KV / fit))).
int attention_ds_pass_heads(size_t pair, size_t budget, int KV) {
    if (!pair || KV <= 0 || budget < pair) return 0;
    size_t fit = budget / pair, per = fit < (size_t)KV ? fit : (size_t)KV, np = (KV + per - 1) / per;
    return (int)((KV + np - 1) / np);
}

// ops.h. Query tiles m of 64 rows from t0 (nq of them, a = ceil(t0 / 64)), tile m seeing the key tiles
// 0 .. a + m; of the key tiles [j0, j1) the tiles m >= m0 = max(0, j0 - a) see some, row m - m0 holding
// min(w, c + m - m0 + 1) of them (w = j1 - j0, c = a + m0 - j0): r = min(rows, max(0, w - c)) rows growing by
// one from c + 1, the rest w each (cuda_attention_wg.cuh ds_tile lays them out in this order).
size_t attention_ds_range_tiles(int t0, int t1, int j0, int j1) {
    if (t1 <= t0 || j1 <= j0 || t0 < 0 || j0 < 0) return 0;
    long long nq = (t1 - t0 + 63) / 64, a = (t0 + 63) / 64, m0 = j0 - a > 0 ? j0 - a : 0;
    if (m0 >= nq) return 0;
    long long rows = nq - m0, c = a + m0 - j0, w = (long long)j1 - j0, r = w - c > 0 ? w - c : 0;
    if (r > rows) r = rows;
    return (size_t)(r * (c + 1) + r * (r - 1) / 2 + (rows - r) * w);
}

// ops.h. The bytes of `pairs` pairs' tiles over [j0, j1) grow with j1 while key tiles remain (each one more
// is seen by the last query tile): the largest j1 that fits, by bisection.
int attention_ds_range_end(int t0, int t1, int rep, int pairs, size_t budget, int j0) {
    int lo = j0, hi = (t1 + 63) / 64;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if ((size_t)pairs * rep * attention_ds_range_tiles(t0, t1, j0, mid) * 8192 <= budget) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// ops.h. A (sequence, kv head) pair holds its H / KV query heads' tiles of the whole triangle
// (attention_ds_range_tiles from key tile 0 of any width over a + nq). Whether the scratch goes in passes
// over kv heads or over key ranges, or is not kept at all, is decided at the most tiles a pair can take over
// any row range of T (nT (nT + 3) / 2 a head, nT = ceil(T / 64)) and at the first key tile (all nT query
// tiles see it), so that every chunk [t0, t1) of one call shape takes the same way (dq's bits do not depend
// on the split, nor on the passes). Passes over kv heads take two pairs at least (a pass of one kv head,
// ceil(T / 128) dk/dv blocks of work falling from the first to the last, keeps half the GPU idle at long
// T); where not two fit, passes of two pairs (one where KV is 1) over as many key tiles as fit, unless the
// first range (of the whole T) is not all of them and holds fewer than ATT_DS_MIN_BLOCKS dk/dv blocks (a kv
// head's 64 keys each) where the call holds twice that: then dS again. Measured on an H200 (16 / 8 heads, B
// 1, 2026-12-04, scripts/device/attn_keyrange.sh): T 16384 at the 1024 MiB cap, a first range of 480 blocks,
// backward 8.05 ms against dS again's 9.31; T 32768, 136 blocks, 40.8 against 36.8 (at a cap of 2048 MiB,
// ~280 blocks: 34.8; 4096: 31.0).
#define ATT_DS_MIN_BLOCKS 256 // two blocks an SM of an H200's 132, about
size_t attention_ds_bytes(int B, int T, int H, int KV, int hd, int t0, int t1) {
    long long cap_mb = attention_ds_cap_mb();
    if (hd != 128 || B <= 0 || H <= 0 || KV <= 0 || H % KV || t1 <= t0 || t1 > T) return 0;
    size_t cap = (size_t)cap_mb << 20, rep = (size_t)(H / KV), kp = KV < 2 ? 1 : 2;
    size_t pair = rep * attention_ds_range_tiles(t0, t1, 0, INT_MAX) * 8192;
    size_t nT = ((size_t)T + 63) / 64, most = rep * (nT * (nT + 3) / 2) * 8192;
    if ((size_t)B * KV * most <= cap || attention_ds_pass_heads(most, cap, KV) >= 2) { // over kv heads
        if ((size_t)B * KV * pair <= cap) return (size_t)B * KV * pair; // one pass
        return (size_t)attention_ds_pass_heads(pair, cap, KV) * pair;
    }
    if (kp * rep * nT * 8192 > cap) return 0; // not one key tile: dS again
    // too narrow a first range leaves SMs idle in every pass (where the call's blocks could fill them)
    size_t w = (size_t)attention_ds_range_end(0, T, (int)rep, (int)kp, cap, 0);
    if (w < nT && kp * w < ATT_DS_MIN_BLOCKS && (size_t)B * KV * nT >= 2 * ATT_DS_MIN_BLOCKS) return 0;
    int j1 = attention_ds_range_end(t0, t1, (int)rep, (int)kp, cap, 0);
    return kp * rep * attention_ds_range_tiles(t0, t1, 0, j1) * 8192;
}

// ops.h. A pair holds H / KV heads' 64 x 64 bf16 tiles of the queries [t0, t1) (as attention_ds_bytes);
// what fits is counted at the most tiles any row range of T can take, in the smaller of MOE_ATTN_DS_MB and 8
// bytes a q element (B T H hd of them), at most 65535 pairs.
size_t attention_mla_ds_bytes(int B, int T, int H, int KV, int hd, int t0, int t1, int heads, int *whole,
                              int *hp) {
    if (whole) *whole = 0;
    if (hp) *hp = KV;
    if (B <= 0 || H <= 0 || KV <= 0 || H % KV || hd <= 0 || t1 <= t0 || t1 > T || heads < 0) return 0;
    size_t rep = (size_t)(H / KV), nq = (size_t)(t1 - t0 + 63) / 64, a = (size_t)(t0 + 63) / 64;
    size_t pair = rep * (nq * (a + 1) + nq * (nq - 1) / 2) * 64 * 64 * 2;
    if (!heads) {
        size_t nT = ((size_t)T + 63) / 64, most = rep * (nT * (nT + 3) / 2) * 64 * 64 * 2;
        size_t cap = (size_t)attention_ds_cap_mb() << 20, room = 8 * (size_t)B * T * H * hd;
        size_t fit = (cap < room ? cap : room) / most;
        heads = fit < 65535 ? (int)fit : 65535;
        if (!heads) return 0; // dS again
    }
    int all = (size_t)heads >= (size_t)B * KV,
        per = all ? KV : attention_ds_pass_heads(pair, heads * pair, KV);
    if (whole) *whole = all;
    if (hp) *hp = per;
    return (all ? (size_t)B * KV : (size_t)per) * pair;
}
