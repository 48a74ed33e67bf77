# race_pairs.py LOG BINARY — the instructions behind each racecheck report of LOG (compute-sanitizer
# --tool racecheck on BINARY): every "Race reported between A access at KERNEL+0xOFF / and B access at
# KERNEL+0xOFF2" pair mapped to its two SASS instructions (cuobjdump -sass of BINARY, or BINARY itself where it
# is that listing already, as tests/test_race_pairs.sh gives it; names demangled by c++filt), one line a
# distinct pair with how often the log reports it, for reading a report (fp8_gemm_ab.sh prints it under a failed
# racecheck). It judges nothing: exit 0 when every offset was found, 1 when one was not, 2 when the log or
# the binary cannot be read. (It found the FP8 GEMM's reports to be shared-memory scale slots written by the
# producer against the consumers' reads before their warp's one arrival: docs/PERFORMANCE.md "FP8".)
import collections, re, subprocess, sys

if len(sys.argv) != 3:
    sys.exit('usage: race_pairs.py RACECHECK_LOG BINARY')
try:
    log = open(sys.argv[1]).read().splitlines()
    with open(sys.argv[2], 'rb') as f:
        head = f.read(1 << 16)
    if b'Function : ' in head and b'\0' not in head: # a listing already
        sass = open(sys.argv[2]).read()
    else:
        sass = subprocess.run(['cuobjdump', '-sass', sys.argv[2]], capture_output=True, text=True,
                              check=True).stdout
except (OSError, subprocess.CalledProcessError) as e:
    print('race_pairs: %s' % e)
    sys.exit(2)
norm = lambda s: re.sub(r'\s+|\(int\)', '', s.replace('void ', ''))
mangled = re.findall(r'Function : (\S+)', sass)
names = dict(zip(mangled, subprocess.run(['c++filt'], input='\n'.join(mangled), capture_output=True,
                                         text=True).stdout.splitlines()))
code, cur = {}, None # (demangled, normalised) -> {offset: instruction}
for line in sass.splitlines():
    m = re.match(r'\s+Function : (\S+)', line)
    if m:
        cur = code.setdefault(norm(names.get(m.group(1), m.group(1))), {})
        continue
    m = re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', line)
    if m and cur is not None:
        cur[int(m.group(1), 16)] = m.group(2)
at = re.compile(r'(Read|Write) access at (.+)\+0x([0-9a-f]+)')
pairs, first = collections.Counter(), None
for line in log:
    m = at.search(line)
    if not m:
        continue
    acc = (m.group(1), norm(m.group(2)), int(m.group(3), 16))
    if 'Race reported between' in line:
        first = acc
    elif first:
        pairs[(first, acc)] += 1
lost = 0
def ins(a):
    return code.get(a[1], {}).get(a[2])
for (a, b), n in sorted(pairs.items(), key=lambda x: -x[1]):
    ia, ib = ins(a), ins(b)
    lost += not (ia and ib)
    print('%-6s %s+0x%x: %s | %s +0x%x: %s (%d)' % (a[0], a[1][:40], a[2], ia or '?', b[0], b[2], ib or '?', n))
print('race_pairs: %d distinct pairs, %d with an instruction not found' % (len(pairs), lost))
sys.exit(1 if lost or not pairs and any('Race reported' in l for l in log) else 0)
