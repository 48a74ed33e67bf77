# ncu_rows.py — imported by the device recipes that read Nsight Compute's `--csv` output (attn_keyrange.sh,
# attn_bwd_ab.sh, ncu_layer.sh), and run by bits_ab.sh and norm_ab.sh for a kernel-time table: its metric rows, found after ncu's header line (the first row naming
# 'Kernel Name': the profiled program's own output comes first in the same file, and a JSON line of
# moe_bench_attention or moe_bench_layer splits into as many fields as a CSV row).
import csv

_TIME_US = {'ns': 1e-3, 'nsecond': 1e-3, 'us': 1.0, 'usecond': 1.0, 'ms': 1e3, 'msecond': 1e3, 's': 1e6,
            'second': 1e6}


def rows(path):
    """Each metric row of the file as (kernel, metric, value, unit): kernel is the name before its '(',
    without a leading 'void '; rows whose value is not a number are left out; [] without a header."""
    try:
        lines = list(csv.reader(open(path)))
    except OSError:
        return []
    head = next((i for i, r in enumerate(lines) if 'Kernel Name' in r), None)
    if head is None:
        return []
    h = lines[head]
    kn, mn, mv, mu = (h.index(k) for k in ('Kernel Name', 'Metric Name', 'Metric Value', 'Metric Unit'))
    out = []
    for r in lines[head + 1:]:
        if len(r) <= max(kn, mn, mv, mu):
            continue
        try:
            v = float(r[mv].replace(',', ''))
        except ValueError:
            continue
        k = r[kn].split('(')[0]
        out.append((k[5:] if k.startswith('void ') else k, r[mn], v, r[mu]))
    return out


def time_us(value, unit):
    """A gpu__time_duration value in microseconds."""
    return value * _TIME_US[unit]


def kernel_times(path):
    """Each kernel's gpu__time_duration values in microseconds, by name, in launch order."""
    t = {}
    for k, m, v, u in rows(path):
        if m == 'gpu__time_duration.sum':
            t.setdefault(k, []).append(time_us(v, u))
    return t


if __name__ == '__main__':
    # `python3 ncu_rows.py LOG [CAP]`: the kernels of LOG by name, us a launch (launches) and ms in all, then the
    # sum of the means; where CAP launches were profiled (ncu's -c), a warning that the totals cover different
    # spans of the run (bits_ab.sh, norm_ab.sh)
    import sys
    t = kernel_times(sys.argv[1])
    for name, v in sorted(t.items()):
        print('      %-40s %8.1f us (%d), %8.3f ms in all' % (name[:40], sum(v) / len(v), len(v), sum(v) / 1e3))
    print('      %-40s %8.1f us' % ('sum of the means', sum(sum(v) / len(v) for v in t.values())) if t else
          '      no kernel rows')
    if len(sys.argv) > 2 and sum(len(v) for v in t.values()) >= int(sys.argv[2]):
        print('      (ncu stopped at %s launches: the totals cover different spans of the run; compare the means)'
              % sys.argv[2])
