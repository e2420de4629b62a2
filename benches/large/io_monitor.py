"""Samples, every 0.5 s, a server's I/O, the disk's, and the server's threads waiting in the
kernel (state D, with their wait channel), into a JSON-lines file; copies the first member's log
of a `large-Concord-*` work dir beside it. Usage: io_monitor.py OUT BINARY_NAME [DISK] (run it into
tmpfs, e.g. /dev/shm, so that its writes stay off the disk it measures; stop it with a signal).
`io_monitor_show.py` prints it per half second."""
import json, os, sys, time, glob, shutil
out = open(sys.argv[1], "a")
NAME = sys.argv[2].encode()
DISK = sys.argv[3] if len(sys.argv) > 3 else "vda"
def pid():
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                c = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if c and c[0].endswith(NAME):
                return p
def disk():
    for l in open("/proc/diskstats"):
        f = l.split()
        if f[2] == DISK:
            return {"rd_sect": int(f[5]), "wr_sect": int(f[9]), "io_ms": int(f[12]), "wq_ms": int(f[10])}
while True:
    p = pid()
    rec = {"t": time.time(), "disk": disk()}
    if p:
        try:
            io = dict(l.split(": ") for l in open(f"/proc/{p}/io").read().split("\n") if l)
            rec["read"] = int(io["read_bytes"]); rec["write"] = int(io["write_bytes"])
            th = []
            for t in os.listdir(f"/proc/{p}/task"):
                try:
                    st = open(f"/proc/{p}/task/{t}/stat").read()
                    name = st[st.index("(")+1:st.rindex(")")]
                    state = st[st.rindex(")")+2]
                    if state == "D":
                        wchan = open(f"/proc/{p}/task/{t}/wchan").read()
                        th.append((name, wchan))
                except OSError:
                    pass
            rec["D"] = th
            for log in glob.glob("/var/tmp/large-Concord-*/m0.log"):
                shutil.copy(log, sys.argv[1] + ".m0.log")
        except (OSError, KeyError):
            pass
    out.write(json.dumps(rec) + "\n"); out.flush()
    time.sleep(0.5)
