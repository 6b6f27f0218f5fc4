#!/usr/bin/env bash
# The gateway bench (bench/gateway.py) for two git trees back to back, then each figure of the second tree
# against the first's. Each tree runs its own bench/gateway.py and its own `sluice serve`, so two trees that
# differ in layout, config spelling or test kit still compare; LiteLLM and the stubs run again for each.
#
#   bench/compare_trees.sh BEFORE_TREE AFTER_TREE [bench/gateway.py flags, e.g. --quick --no-litellm]
#
# e.g. `git worktree add /tmp/before <commit>; bench/compare_trees.sh /tmp/before . --quick`.
# ROUNDS=N (default 1) alternates the trees N times (B A B A ...: the second tree first, so neither always runs
# on a fresher box) and compares the medians; PYTHON picks the interpreter (default: this tree's .venv, which
# must have every package both trees import). Outputs stay in $OUT_DIR (default a fresh temporary folder).
set -euo pipefail

if [[ $# -lt 2 ]]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
here="$(cd "$(dirname "$0")/.." && pwd)"
before="$(cd "$1" && pwd)"
after="$(cd "$2" && pwd)"
shift 2
python="${PYTHON:-$here/.venv/bin/python}"
rounds="${ROUNDS:-1}"
out="${OUT_DIR:-$(mktemp -d -t bench-trees-XXXX)}"
mkdir -p "$out"
[[ -x "$python" ]] || { echo "compare_trees: no interpreter at $python (set PYTHON)" >&2; exit 2; }

# one LiteLLM venv for both trees (bench/harness/processes.py keeps it in <tree>/.bench)
mkdir -p "$here/.bench"
for tree in "$before" "$after"; do
    [[ -e "$tree/.bench" ]] || ln -s "$here/.bench" "$tree/.bench"
done

for round in $(seq 1 "$rounds"); do
    for side in after before; do
        tree="$before"; [[ $side == after ]] && tree="$after"
        echo "compare_trees: round $round, $side ($tree @ $(git -C "$tree" rev-parse --short HEAD))" >&2
        (cd "$tree" && PYTHONPATH="$tree" "$python" bench/gateway.py "$@") | tee "$out/$side.$round.txt" >&2
    done
done

"$python" - "$out" "$rounds" <<'EOF'
"""Reads the report tables of every run and prints, per row, the median of each side and after/before."""
import re
import statistics
import sys
from pathlib import Path

out, rounds = Path(sys.argv[1]), int(sys.argv[2])
COLUMNS = ("rps", "p50", "p99", "p999", "add_p50", "add_p99", "add_p999", "cpu", "gap", "err")
# RPS/stub: a target's RPS over the stub worker's in the same run and setting, which takes out much of what a
# busy box changes between the two trees' runs
SHOWN = (("rps", "RPS"), ("rps_stub", "RPS/stub"), ("add_p99", "+p99 ms"), ("cpu", "cpu ms/req"))


def tables(text: str) -> dict[tuple[str, str, str], dict[str, float]]:
    rows, section = {}, ""
    for line in text.splitlines():
        if line.startswith("## ") and "targets" not in line:
            section = line[3:]
            continue
        fields = line.split()
        if section and len(fields) >= 12 and fields[1] != "ratio" and fields[0] != "setting":
            try:
                rows[(section, fields[0], fields[1])] = dict(zip(COLUMNS, map(float, fields[2:12])))
            except ValueError:
                continue
    for (section, setting, _), row in rows.items():
        stub = rows.get((section, setting, "stub"))
        row["rps_stub"] = row["rps"] / stub["rps"] if stub and stub["rps"] else float("nan")
    return rows


runs = {side: [tables((out / f"{side}.{n}.txt").read_text()) for n in range(1, rounds + 1)]
        for side in ("before", "after")}
keys = [k for k in runs["before"][0] if all(k in run for side in runs.values() for run in side)]
print(f"\n# after / before, median of {rounds} run(s) each; outputs in {out}")
print(f"{'section':<58} {'setting':>7} {'target':<10}"
      + "".join(f" {title + ' before':>18} {'after':>9} {'ratio':>7}" for _, title in SHOWN))
for key in keys:
    line = f"{key[0][:58]:<58} {key[1]:>7} {key[2]:<10}"
    for column, _ in SHOWN:
        before, after = (statistics.median(run[key][column] for run in runs[side]) for side in ("before", "after"))
        ratio = after / before if before and before == before and after == after else float("nan")
        line += f" {before:18.2f} {after:9.2f} {ratio:6.2f}x"
    print(line)
EOF
