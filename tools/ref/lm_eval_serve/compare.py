"""Compares two lm-eval --log_samples outputs of the same task: per-choice loglikelihoods and acc.

compare.py SERVED_DIR HF_DIR TOL   exits 1 if a loglikelihood differs by more than TOL or the
                                   greedy flags / chosen answers differ.
"""
import glob
import json
import sys


def samples(d):
    files = glob.glob(d + "/**/samples_*.jsonl", recursive=True)
    assert len(files) == 1, "expected one samples file under %s, found %s" % (d, files)
    out = {}
    for line in open(files[0]):
        s = json.loads(line)
        # resps: one [[loglikelihood, is_greedy]] per choice
        out[s["doc_id"]] = [(float(r[0][0]), bool(r[0][1])) for r in s["resps"]]
    return out


a, b, tol = samples(sys.argv[1]), samples(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys() and a, "different documents"
worst, flips, answers, n = 0.0, 0, 0, 0
for k in sorted(a):
    la, lb = a[k], b[k]
    assert len(la) == len(lb)
    for (x, gx), (y, gy) in zip(la, lb):
        worst = max(worst, abs(x - y))
        flips += gx != gy
        n += 1
    answers += max(range(len(la)), key=lambda i: la[i][0]) != max(range(len(lb)), key=lambda i: lb[i][0])
print("documents %d, choices %d: max |loglikelihood difference| %.2e (tolerance %.0e), is_greedy flips %d, "
      "different answers %d" % (len(a), n, worst, tol, flips, answers))
sys.exit(0 if worst <= tol and flips == 0 and answers == 0 else 1)
