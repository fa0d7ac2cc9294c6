"""Issue 34: the most N quarter-core nodes can give when the head's quarter core drafts every
token, from a run's own counts. `python bound.py RUNS_CSV LLAMA_BENCH_TXT`.

Each guess the head ships is one decode of its draft model (a guess needs the one before it,
so they cannot be batched), and the draft shares the head's quarter core with nothing faster
than llama-bench's one-token decode under the same quota. So a run of G tokens that shipped
D guesses takes at least D x t_d, t_d = 1 / (llama-bench tg16 of the draft under the quota):
speed <= G / (D x t_d). Even with every guess right (D = G - 1: the first token comes from the
prompt's pass) speed < 1 / t_d. Printed against pipeinfer's median at 2 nodes."""
import csv
import re
import statistics
import sys


def rates(path: str, name: str) -> list[float]:
    return [float(m.group(1)) for line in open(path) if line.startswith(name + " ")
            for m in [re.search(r"tg16 \|\s+([\d.]+)", line)] if m]


def main(runs_csv: str, bench_txt: str) -> None:
    draft, target = rates(bench_txt, "draft"), rates(bench_txt, "target")
    t_d = 1 / statistics.median(draft)
    print(f"draft decode under a quarter core: {', '.join(f'{r:.2f}' for r in draft)} t/s, "
          f"median {1 / t_d:.2f} ({t_d * 1000:.0f} ms a token); target {', '.join(map(str, target))} t/s")
    rows = [r for r in csv.DictReader(open(runs_csv)) if r["strategy"] == "pipeinfer"]
    two = statistics.median(float(r["speed_tps"]) for r in rows if r["ranks"] == "2")
    print(f"pipeinfer at 2 nodes, median: {two:.2f} t/s; 3.0x that is {3 * two:.2f} t/s; "
          f"every guess right and nothing else on the head: < {1 / t_d:.2f} t/s = "
          f"{1 / t_d / two:.2f}x")
    for r in rows:
        if r["ranks"] == "2":
            continue
        g, d, speed = int(r["n_generated"]), int(r["n_drafted"]), float(r["speed_tps"])
        bound = g / (d * t_d)
        print(f"{r['ranks']} nodes: {speed:.2f} t/s ({speed / two:.2f}x), {d} guesses shipped "
              f"for {g} tokens ({r['n_accepted']} accepted): drafting alone takes "
              f"{d * t_d:.1f} of the run's {g / speed:.1f} s; bound {bound:.2f} t/s = "
              f"{bound / two:.2f}x")


if __name__ == "__main__":
    main(*sys.argv[1:])
