# Shared by bench/llamacpp.sh and bench/qwen3.sh (sourced): llama-bench vs `lathe bench` on a list of GGUF files,
# interleaved per file, `rounds` rounds, the best repetition kept, and the report (markdown tables on stdout).
# Needs: $bin (llama.cpp's bin dir), $lathe, $tmp, $rounds, and the arrays names[] / files[].
measure_inference() {
  # Results: one "side<TAB>name<TAB>threads<TAB>pp<TAB>tg" line per measurement.
  res="$tmp/inference.tsv"
  : > "$res"
  for ((round = 1; round <= rounds; round++)); do
    for i in "${!files[@]}"; do
      f="${files[$i]}"
      n="${names[$i]}"
      if "$bin/llama-bench" -m "$f" -p 512 -n 128 -t 1,2 -r 3 -o json > "$tmp/lb.json" 2> "$tmp/lb.err"; then
        # The best repetition, as `lathe bench` reports (llama-bench's own table shows the mean).
        python3 - "$tmp/lb.json" "$n" >> "$res" <<'PY'
import json, sys
rows = {}
for r in json.load(open(sys.argv[1])):
    key = r["n_threads"]
    best = max(r["samples_ts"])
    rows.setdefault(key, {})["pp" if r["n_prompt"] > 0 else "tg"] = best
for t, v in sorted(rows.items()):
    print(f"llama.cpp\t{sys.argv[2]}\t{t}\t{v.get('pp', 0):.1f}\t{v.get('tg', 0):.1f}")
PY
      else
        echo "llama-bench could not run $f ($n):" >&2
        tail -5 "$tmp/lb.err" >&2
        printf 'llama.cpp\t%s\t1\tFAIL\tFAIL\nllama.cpp\t%s\t2\tFAIL\tFAIL\n' "$n" "$n" >> "$res"
      fi
      "$lathe" bench -m "$f" --prompt-tokens 512 --gen-tokens 128 --threads-list 1,2 -r 3 > "$tmp/lathe.out"
      sed -nE 's/.* threads ([0-9]+): prefill +([0-9.]+) tok\/s \| decode +([0-9.]+) tok\/s.*/\1\t\2\t\3/p' \
        "$tmp/lathe.out" | awk -v n="$n" -F'\t' '{ printf "lathe\t%s\t%s\t%s\t%s\n", n, $1, $2, $3 }' >> "$res"
      echo "round $round: $n done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    done
  done
  echo
  echo "### Inference: llama-bench -p 512 -n 128 -t 1,2 -r 3 vs lathe bench --prompt-tokens 512 --gen-tokens 128 --threads-list 1,2 -r 3 (tok/s, best repetition of $rounds round(s))"
  python3 - "$res" <<'PY'
import sys
best = {}
order = []
for line in open(sys.argv[1]):
    side, name, t, pp, tg = line.rstrip("\n").split("\t")
    if name not in order: order.append(name)
    k = (side, name, int(t))
    if pp == "FAIL":
        best.setdefault(k, None)
        continue
    old = best.get(k) or (0.0, 0.0)
    best[k] = (max(old[0], float(pp)), max(old[1], float(tg)))
def f(v): return "FAIL" if v is None else f"{v:.1f}"
print()
print("| model | threads | llama.cpp pp512 | lathe pp512 | lathe / llama.cpp | llama.cpp tg128 | lathe tg128 | lathe / llama.cpp |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for name in order:
    for t in (1, 2):
        l, m = best.get(("llama.cpp", name, t)), best.get(("lathe", name, t))
        if m is None: continue
        rp = f"{m[0] / l[0]:.2f}x" if l else "-"
        rt = f"{m[1] / l[1]:.2f}x" if l else "-"
        print(f"| {name} | {t} | {f(l and l[0])} | {m[0]:.1f} | {rp} | {f(l and l[1])} | {m[1]:.1f} | {rt} |")
print()
print("Goals (issue 2): lathe >= 1.5x llama.cpp's best thread count, prefill and decode; lathe's 2 threads never slower than its 1.")
print()
print("| model | prefill: lathe best / llama.cpp best | decode: lathe best / llama.cpp best | lathe 2t / 1t prefill, decode |")
print("|---|---:|---:|---:|")
for name in order:
    ls = [best.get(("llama.cpp", name, t)) for t in (1, 2)]
    ms = [best.get(("lathe", name, t)) for t in (1, 2)]
    if None in ms: continue
    if any(ls):
        lp = max(x[0] for x in ls if x); lt = max(x[1] for x in ls if x)
        mp = max(x[0] for x in ms); mt = max(x[1] for x in ms)
        gp = f"{mp / lp:.2f}x ({'meets' if mp >= 1.5 * lp else 'BELOW'} 1.5x)"
        gt = f"{mt / lt:.2f}x ({'meets' if mt >= 1.5 * lt else 'BELOW'} 1.5x)"
    else:
        gp = gt = "llama.cpp failed"
    sp, st = ms[1][0] / ms[0][0], ms[1][1] / ms[0][1]
    mono = "ok" if sp >= 1 and st >= 1 else "2t SLOWER"
    print(f"| {name} | {gp} | {gt} | {sp:.2f}x, {st:.2f}x ({mono}) |")
PY
}
