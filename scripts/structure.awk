# structure.awk — the structure rules of docs/ARCHITECTURE.md, over C/CUDA sources given as arguments
# (run by tests/test_structure.sh). Prints one line per breach, "FILE:LINE: what", and nothing else:
#   - a file longer than MAXFILE lines;
#   - a host function longer than MAXFN lines (from the line of its name to its closing brace); device
#     code (__global__ / __device__ functions) is exempt: a kernel may be one long algorithm;
#   - an #include "folder/..." of a folder on a higher layer than the including file's (LAYERS below).
# Braces are counted outside comments, strings and character literals; a top-level `{` opens a function
# when the text since the previous top-level `;`, `}` or preprocessor line has a `(` and no `=` and does
# not begin with struct/union/enum/typedef.
BEGIN {
    if (!MAXFILE) MAXFILE = 700
    if (!MAXFN) MAXFN = 120
    # the layers, from the ground up; one number = one layer (a folder may include its own layer's headers)
    n = split("core:0 ops:1 data:2 text:2 parallel:2 moe:3 model:4 io:5 train:6 cli:7", kv, " ")
    for (i = 1; i <= n; i++) { split(kv[i], p, ":"); LAYER[p[1]] = p[2] }
}
function folder(path,    a, k) {   # src/<folder>/... -> folder
    k = split(path, a, "/")
    for (i2 = 1; i2 < k; i2++) if (a[i2] == "src") return a[i2 + 1]
    return ""
}
FNR == 1 {
    depth = 0; incomment = 0; head = ""; fnstart = 0; fnname = ""; fndev = 0
    me = folder(FILENAME)
}
{
    line = $0
    if (!incomment && line ~ /^[ \t]*#[ \t]*include[ \t]*"/) {
        inc = line; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
        if (inc ~ /\//) {
            f = inc; sub(/\/.*/, "", f)
            if ((me in LAYER) && (f in LAYER) && LAYER[f] > LAYER[me])
                printf "%s:%d: includes %s, a header of a higher layer (%s above %s)\n", FILENAME, FNR, inc, f, me
        }
    }
    if (!incomment && depth == 0 && line ~ /^[ \t]*#/) { head = ""; next }
    # strip comments, strings and char literals, keeping braces and the rest
    s = ""; i = 1; L = length(line)
    while (i <= L) {
        c = substr(line, i, 1); c2 = substr(line, i, 2)
        if (incomment) { if (c2 == "*/") { incomment = 0; i += 2 } else i++; continue }
        if (c2 == "/*") { incomment = 1; i += 2; continue }
        if (c2 == "//") break
        if (c == "\"" || c == "'") {
            q = c; i++
            while (i <= L) { c = substr(line, i, 1); if (c == "\\") { i += 2; continue } if (c == q) break; i++ }
            i++; s = s q q; continue
        }
        s = s c; i++
    }
    for (j = 1; j <= length(s); j++) {
        c = substr(s, j, 1)
        if (c == "{") {
            if (depth == 0 && head ~ /\(/ && head !~ /=/ && head !~ /^[ \t\n]*(struct|union|enum|typedef)[ \t\n]/ &&
                head !~ /^[ \t\n]*(static[ \t\n]+)?(const[ \t\n]+)?(struct|union|enum)[ \t\n]/) {
                fnstart = FNR - headlines; fnname = head; fndev = (head ~ /__global__|__device__/)
                gsub(/\(.*/, "", fnname); gsub(/.*[ \t\n*]/, "", fnname)
            }
            depth++
        } else if (c == "}") {
            depth--
            if (depth == 0) {
                if (fnstart && !fndev && FNR - fnstart + 1 > MAXFN)
                    printf "%s:%d: function %s is %d lines (host functions: at most %d)\n", FILENAME, fnstart, fnname, FNR - fnstart + 1, MAXFN
                fnstart = 0; head = ""; headlines = 0
            }
        } else if (depth == 0) {
            if (c == ";") { head = ""; headlines = 0 } else head = head c
        }
    }
    if (depth == 0 && head ~ /[^ \t]/) { head = head "\n"; headlines++ } else if (depth == 0) headlines = 0
}
{ cnt[FILENAME] = FNR }
END {
    for (f in cnt) if (cnt[f] > MAXFILE) printf "%s:1: %d lines (at most %d)\n", f, cnt[f], MAXFILE
}
