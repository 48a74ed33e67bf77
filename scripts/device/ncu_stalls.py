# ncu_stalls.py LOG... — attn_stalls.sh's table from Nsight Compute `--page raw --csv` logs (the wide form: a
# header row naming 'Kernel Name' and the metrics, a row of units, a row a launch; the profiled program's own
# output before it): for the first launch of each kernel, the metrics that say where its time goes (duration,
# the units' throughputs, the tensor and shared-memory pipes, issue activity, occupancy, registers) and its
# stall reasons in cycles an issued instruction, the largest first.
import csv, sys

PICK = ('gpu__time_duration.sum', 'sm__throughput.avg.pct', 'l1tex__throughput.avg.pct', 'lts__throughput.avg.pct',
        'dram__throughput.avg.pct', 'sm__inst_executed_pipe_', 'sm__pipe_', 'smsp__issue_active.avg.pct',
        'sm__warps_active.avg.pct', 'launch__registers_per_thread', 'launch__grid_size', 'launch__block_size',
        'launch__occupancy_limit', 'smsp__warps_eligible.avg.per_cycle', 'l1tex__data_pipe_lsu_wavefronts_mem_shared',
        'l1tex__data_bank_conflicts', 'smsp__average_warp_latency_per_inst_issued', 'lts__t_sectors_srcunit_tex')
for path in sys.argv[1:]:
    try:
        lines = list(csv.reader(open(path)))
    except OSError:
        print('== %s: unreadable' % path)
        continue
    head = next((i for i, r in enumerate(lines) if 'Kernel Name' in r), None)
    if head is None:
        print('== %s: no ncu rows' % path)
        continue
    h, units = lines[head], lines[head + 1]
    kn, seen = h.index('Kernel Name'), set()
    for r in lines[head + 2:]:
        if len(r) != len(h): continue
        k = r[kn].split('(')[0].replace('void ', '')[:60]
        if k in seen: continue
        seen.add(k)
        print('== %s: %s' % (path.split('/')[-1], k))
        stalls = []
        for m, u, v in zip(h, units, r):
            if 'issue_stalled' in m and m.endswith('per_warp_active.pct'): continue
            if 'issue_stalled' in m and 'not_issued' not in m:
                try: stalls.append((float(v.replace(',', '')), m))
                except ValueError: pass
            elif any(m.startswith(p) for p in PICK) and not any(x in m for x in ('.max', '.min', '.sum.pct', 'elapsed')) \
                    or m == 'lts__throughput.avg.pct_of_peak_sustained_elapsed':
                print('   %-78s %14s %s' % (m, v, u))
        stalls.sort(reverse=True)
        for v, m in stalls[:14]:
            print('   stall %-72s %10.3f' % (m, v))
