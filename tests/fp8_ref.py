#!/usr/bin/env python3
"""fp8_ref.py: our float32 -> e4m3 encoder (ops/numerics.h e4m3_rn_bits, through `test_fp8 --encode`)
against ml_dtypes.float8_e4m3fn's cast, an implementation we did not write, on ~150k random and edge
floats. ml_dtypes' cast does not saturate (beyond 464 it gives NaN, as torch's .to(float8_e4m3fn) does),
so the expected code of a finite or infinite x is ml_dtypes' cast of clip(x, -448, 448) (torch's
saturating recipe; what PTX cvt.rn.satfinite does); of any NaN, 0x7f (the canonical NaN, as cuda_fp8.h's
__nv_cvt_float_to_fp8 gives). Usage: fp8_ref.py TEST_FP8_BINARY. Exit 77 (skipped) without ml_dtypes."""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import ml_dtypes
except ImportError:
    print("SKIP: numpy/ml_dtypes not installed (pip install ml_dtypes)")
    sys.exit(77)


def inputs():
    rng = np.random.default_rng(38)
    parts = [
        rng.integers(0, 2**32, 100000, dtype=np.uint64).astype(np.uint32).view(np.float32),  # any bits
        (rng.standard_normal(50000) * np.exp2(rng.uniform(-14, 11, 50000))).astype(np.float32),
    ]
    # every e4m3 value, the midpoints between neighbours and the floats either side of them
    vals = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    pos = np.sort(vals[np.isfinite(vals) & (vals >= 0)])
    mids = ((pos[1:] + pos[:-1]) / 2).astype(np.float32)
    edges = np.concatenate([pos.astype(np.float32), mids, np.nextafter(mids, np.float32(0)),
                            np.nextafter(mids, np.float32(np.inf)),
                            np.float32([448, 449, 463.99, 464, 464.01, 480, 1e30, 3.4e38, np.inf, 2**-10,
                                        2**-11, 1e-40, 1.4e-45, 0.0])])
    parts += [edges, -edges, np.float32([np.nan, -np.nan])]
    return np.concatenate(parts).astype(np.float32)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: fp8_ref.py TEST_FP8_BINARY")
    x = inputs()
    with tempfile.TemporaryDirectory() as d:
        fin, fout = os.path.join(d, "in.f32"), os.path.join(d, "out.u8")
        x.astype("<f4").tofile(fin)
        subprocess.run([sys.argv[1], "--encode", fin, fout], check=True)
        ours = np.fromfile(fout, dtype=np.uint8)
    if ours.size != x.size:
        sys.exit(f"FAIL: {ours.size} codes for {x.size} inputs")
    with np.errstate(invalid="ignore"):
        want = np.clip(x, np.float32(-448), np.float32(448)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    nan = np.isnan(x)
    want = np.where(nan, np.uint8(0x7F), want)
    bad = np.nonzero(ours != want)[0]
    for i in bad[:10]:
        print(f"FAIL: {x[i]!r} ({x[i:i+1].view(np.uint32)[0]:#010x}): ours {ours[i]:#04x}, expected {want[i]:#04x}")
    print(f"fp8_ref: {x.size} floats, {bad.size} differ from ml_dtypes.float8_e4m3fn (saturated)")
    sys.exit(1 if bad.size else 0)


if __name__ == "__main__":
    main()
