"""Rows (one per sample, every 0.5 s) from io_monitor.py's samples between two epoch times: MB/s read and written by
the server and by the disk, the disk's busy share, and the server's threads in state D."""
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1])]
t0, t1 = float(sys.argv[2]), float(sys.argv[3])
prev = None
for r in rows:
    if not (t0 <= r["t"] <= t1):
        prev = r; continue
    if prev and "read" in r and "read" in prev:
        dt = r["t"] - prev["t"]
        d, p = r["disk"], prev["disk"]
        print(f'{r["t"]-t0:7.1f} srv r {(r["read"]-prev["read"])/dt/1e6:6.1f} w {(r["write"]-prev["write"])/dt/1e6:6.1f} '
              f'disk r {(d["rd_sect"]-p["rd_sect"])*512/dt/1e6:6.1f} w {(d["wr_sect"]-p["wr_sect"])*512/dt/1e6:6.1f} '
              f'busy {(d["io_ms"]-p["io_ms"])/dt/10:5.1f}% D {collections.Counter(n+":"+w for n, w in r.get("D", [])).most_common(4)}')
    prev = r
