"""Paired per-prompt tau difference: paired.py A_logs... -- B_logs... (A minus B); logs are evaluate's stdout."""
import json, math, sys
from collections import defaultdict

def load(paths):
    out = {}
    for k, p in enumerate(paths):
        for line in open(p):
            if not line.startswith('{"tree"'):
                continue
            r = json.loads(line)
            out[(k, r["tree"], r["prompt"])] = (r["tokens"] / r["steps"], r["category"])
    return out

def stats(d):
    n = len(d); m = sum(d) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    return f"{m:+.3f} +- {sd / math.sqrt(n):.3f} (n={n}, {sum(x > 0 for x in d)} better, {sum(x < 0 for x in d)} worse)"

i = sys.argv.index("--")
a, b = load(sys.argv[1:i]), load(sys.argv[i + 1:])
by = defaultdict(list); cat = defaultdict(list)
for key, (ta, c) in sorted(a.items()):
    if key in b:
        by[key[1]].append(ta - b[key][0]); by[(key[0], key[1])].append(ta - b[key][0]); cat[(key[1], c)].append(ta - b[key][0])
for t, d in by.items():
    print(t, "all:", stats(d))
for (t, c), d in sorted(cat.items()):
    if len(cat) > 1 and len(d) > 1:
        print(" ", t, c, stats(d))
