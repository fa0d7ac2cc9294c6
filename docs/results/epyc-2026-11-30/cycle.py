"""Critical path of a traced run: run latency (start -> result), emit gaps, per-stage spans."""
import json, sys, statistics as st, collections
recs = [json.loads(l) for l in open(f'/work/b66/r/{sys.argv[1]}.trace')]
ev = [r for r in recs if r.get('type') != 'span']; spans = [r for r in recs if r.get('type') == 'span']
start = {r['run']: r for r in ev if r.get('name') == 'StartRun'}
arr = {r['run']: r['t'] for r in ev if r.get('name') == 'ResultArrived'}
emits = [r for r in ev if r.get('name') == 'EmitTokens']
lat = collections.defaultdict(list)
for run, r in start.items():
    if run in arr and run > 0: lat['spec' if r['speculative'] else 'plain'].append(1000 * (arr[run] - r['t']))
for k, v in lat.items(): print(f'run latency {k}: n {len(v)} median {st.median(v):.1f} ms p90 {sorted(v)[int(.9*len(v))]:.1f}')
by = collections.defaultdict(list)
for s in spans:
    if s['outcome'] == 'computed': by[(s['rank'], s['speculative'])].append(1000 * (s['end'] - s['start']))
for k in sorted(by): print(f'  rank {k[0]} {"spec " if k[1] else "plain"}: n {len(by[k])} median span {st.median(by[k]):.1f} ms')
t = [e['t'] for e in emits]; n = [len(e['tokens']) for e in emits]
gaps = [1000 * (b - a) for a, b in zip(t, t[1:])]
print(f'emits {len(emits)} tokens {sum(n)}; gap median {st.median(gaps):.1f} ms; total {t[-1]-t[0]:.2f} s -> {sum(n[1:])/(t[-1]-t[0]):.1f} t/s')
