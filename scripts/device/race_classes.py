# race_classes.py LOG BINARY — the instructions behind each racecheck report of LOG (compute-sanitizer
# --tool racecheck on BINARY): every "Race reported between A access at KERNEL+0xOFF / and B access at
# KERNEL+0xOFF2" pair mapped to its two SASS instructions (cuobjdump -sass of BINARY, or BINARY itself where it
# is that listing already, as tests/test_race_classes.sh gives it; names demangled by c++filt), one line a
# distinct pair. The class decided false (docs/PERFORMANCE.md "FP8": racecheck does not
# follow a cp.async's completion on the stage's mbarrier) is a write by LDGSTS (cp.async into a stage's scale
# slots) against an LDS read: exit 0 when every pair is of it, 1 when any is not or an offset is not found,
# 2 when the log or the binary cannot be read.
import collections, re, subprocess, sys

if len(sys.argv) != 3:
    sys.exit('usage: race_classes.py RACECHECK_LOG BINARY')
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
    print('race_classes: %s' % e)
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
bad = 0
def ins(a):
    return code.get(a[1], {}).get(a[2])
for (a, b), n in sorted(pairs.items(), key=lambda x: -x[1]):
    ia, ib = ins(a), ins(b)
    w, r = (ia, ib) if a[0] == 'Write' else (ib, ia)
    known = bool(w and r and re.sub(r'^@!?P\S+\s+', '', w).startswith('LDGSTS') and
                 re.sub(r'^@!?P\S+\s+', '', r).startswith('LDS'))
    bad += not known
    print('%-6s %s+0x%x: %s | %s +0x%x: %s (%d) %s' % (a[0], a[1][:40], a[2], ia or '?', b[0], b[2], ib or '?', n,
                                                       'known false (cp.async into a scale slot)' if known else 'NOT KNOWN'))
print('race_classes: %d distinct pairs, %d not of the known false class' % (len(pairs), bad))
sys.exit(1 if bad or not pairs and any('Race reported' in l for l in log) else 0)
