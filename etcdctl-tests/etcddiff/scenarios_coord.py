"""Watch, lease, lock and election scenarios."""

from __future__ import annotations

from .dsl import BG, EXITED, PEEK, S, SEND, STOP, TXN, W, WAIT, scenario, txn_input


def build_watch_scenarios() -> None:
    # Line counts for WAIT/STOP: simple output prints 3 lines per event (type, key,
    # value; a DELETE's value line is empty), 5 with a prev_kv; json prints 1 line per
    # response (a replay from --rev sends all past revisions in one response whose
    # header revision is the current one, a live watcher one response per revision);
    # fields prints 4 header lines per response + per event 1 type line, 6 for the
    # prev_kv if any and 6 for the kv.  `progress` prints `progress notify: REV` once
    # per watch of the `watch -i` session (+ 1 json line each with -w json).
    scenario("watch_arg_errors",
             W("watch"),
             W("watch --prefix {P}a {P}b"),
             W("watch {P}b {P}a"),
             W("watch {P}a {P}a -w json"),
             W("watch -i", stdin=""),
             W("watch -i", stdin="bogus\n\n  \nwatch\nwatch --prefix {P}a {P}b\nprogress extra\n"))
    scenario("watch_single_key",
             BG("w", "watch {P}k --rev={R+1}"),
             "put {P}k sentinel",                                        # R+1
             WAIT("w", 3),
             "put {P}k v1",                                              # R+2
             "put {P}kk not-watched",                                    # R+3
             "put {P}j not-watched",                                     # R+4
             "del {P}k",                                                 # R+5
             "del {P}k",                                                 # (no revision)
             "put {P}k 'after delete'",                                  # R+6
             TXN(txn_input([], ['put {P}j x', 'put {P}k in-txn', 'put {P}kk y'])),   # R+7
             TXN(txn_input(['value("{P}k") = "nope"'], ['put {P}k success'],
                           ['put {P}k failure'])),                       # R+8
             TXN(txn_input([], ['get {P}k', 'del {P}kk'])),              # R+9 (not watched)
             "put {P}k 'two\nlines'",                                    # R+10
             STOP("w", 22),
             "get {P}k -w json")
    scenario("watch_prefix_json",
             S("lease grant 600", capture="L"),
             BG("w", "watch --prefix {P} --rev={R+1} -w json"),
             "put {P}sentinel s",                                        # R+1
             WAIT("w", 1),
             "put {P}a 1",                                               # R+2
             "put {P}b 2 --lease={L:L}",                                 # R+3
             TXN(txn_input([], ['put {P}c 3', 'put {P}a 10', 'del {P}sentinel',
                                'put {P}d 4 --lease={L:L}', 'get --prefix {P}'])),  # R+4
             "del --prefix {P}a",                                        # R+5
             "lease revoke {L:L}",                                       # R+6 (b, d)
             "del --prefix {P}",                                         # R+7 (c)
             "del --prefix {P}",                                         # (no revision)
             "put {P}e 5",                                               # R+8
             STOP("w", 8))
    scenario("watch_range_prev_kv_fields",
             "put {P}b0 pre",                                            # R+1
             BG("w", "watch {P}b {P}d --prev-kv --rev={R+2}"),
             BG("f", "watch {P}b {P}d --prev-kv --rev={R+2} -w fields"),
             BG("all", "watch --prefix '' --rev={R+2} -w json"),
             "put {P}b sentinel",                                        # R+2
             WAIT("w", 3), WAIT("f", 11), WAIT("all", 1),
             "put {P}a out", "put {P}d out", "put {P}e out",             # R+3..R+5
             "put {P}c 1",                                               # R+6
             "put {P}b0 changed",                                        # R+7
             "put {P}c 2 --prev-kv",                                     # R+8
             "del {P}a {P}cz",                                           # R+9 (a, b, b0, c)
             "put {P}b again",                                           # R+10
             STOP("w", 34), STOP("f", 110), STOP("all", 9))
    scenario("watch_rev_history",
             "put {P}k v1",                                              # R+1
             "put {P}k v2",                                              # R+2
             "put {P}j j1",                                              # R+3
             "del {P}k",                                                 # R+4
             "put {P}k v3",                                              # R+5 put after delete
             "put {P}j j2",                                              # R+6
             BG("all", "watch --prefix {P} --rev={R+1}"),
             BG("k3", "watch {P}k --rev={R+3} -w json"),                 # before the delete
             BG("k5", "watch {P}k --rev={R+5} --prev-kv"),               # the put after it
             BG("pk", "watch --prefix {P} --rev={R+2} --prev-kv -w json"),
             BG("ff", "watch {P}j --rev={R+3} --prev-kv -w fields"),
             BG("fut", "watch {P}k --rev={R+8}"),                        # future revision
             WAIT("all", 18), WAIT("k3", 1), WAIT("k5", 3), WAIT("pk", 1), WAIT("ff", 24),
             "put {P}k v4",                                              # R+7
             "put {P}k v5",                                              # R+8
             "put {P}j j3",                                              # R+9
             STOP("all", 27), STOP("k3", 3), STOP("k5", 13), STOP("pk", 4), STOP("ff", 41),
             STOP("fut", 3))
    scenario("watch_compacted",
             "put {P}k v1",                                              # R+1
             "put {P}k v2",                                              # R+2
             "put {P}j j1",                                              # R+3
             "put {P}k v3",                                              # R+4
             "compaction {R+3}",
             W("watch {P}k --rev={R+1}"),
             W("watch --prefix {P} --rev={R+2} -w json"),
             W("watch {P}k --rev=1 --prev-kv -w fields"),
             BG("at", "watch --prefix {P} --rev={R+3} --prev-kv"),       # = compact revision
             STOP("at", 8))
    scenario("watch_interactive",
             BG("i", "watch -i", stdin="watch {P}a\nwatch --prefix {P}b\nprogress\n"),
             WAIT("i", 2),
             "put {P}a 1",                                               # R+1
             WAIT("i", 5),
             "put {P}b1 x",                                              # R+2
             WAIT("i", 8),
             "put {P}c unwatched",                                       # R+3
             "put {P}a 2",                                               # R+4
             WAIT("i", 11),
             SEND("i", "watch --rev={R+1} --prev-kv {P}c\n"),
             WAIT("i", 14),
             SEND("i", "progress\n"),
             WAIT("i", 17),
             "put {P}c again",                                           # R+5
             WAIT("i", 22),
             TXN(txn_input([], ['put {P}b2 y', 'put {P}d z'])),          # R+6
             STOP("i", 25, eof=True))
    # Two watches of one `watch -i` session covering the same key print the same
    # revision concurrently (one goroutine each): canon="rev" sorts stdout lines by
    # (revision, text).
    scenario("watch_interactive_json_overlap",
             BG("i", "watch -i -w json", stdin="watch {P}a\nwatch --prefix {P}\nprogress\n"),
             WAIT("i", 4),
             "put {P}a 1",                                               # R+1
             WAIT("i", 6),
             TXN(txn_input([], ['put {P}a 2', 'put {P}b 3'])),           # R+2
             WAIT("i", 8),
             "put {P}b 4",                                               # R+3
             WAIT("i", 9),
             SEND("i", "watch --rev={R+1} {P}b\n"),
             WAIT("i", 10),
             "del --prefix {P}",                                         # R+4
             STOP("i", 13, eof=True, canon="rev"))


def build_lease_scenarios() -> None:
    # All named lease_*.  Leases are global: `lease list` shows every live lease of
    # the run (earlier scenarios' as <HEXID>/<LEASE?>), so every lease granted here
    # is revoked again, except the minimum-TTL ones of lease_grant_min, which comes
    # last and expires by itself (no keys attached: no revision).  Remaining TTLs
    # in `lease timetolive` are time-dependent: remaining(N) is shown as <=G when
    # G-60 <= N <= G for the granted TTL G (see canon_ttl); granted TTLs are exact.
    scenario("lease_grant",
             S("lease grant 600", capture="a"),
             S("lease grant 600", capture="b"),
             S("lease grant 300 -w json", capture="j"),
             S("lease grant 120 -w fields", capture="f"),
             S("lease grant 9000000000", capture="max"),
             "lease grant 9000000001",
             "lease grant",
             "lease grant abc",
             "lease grant 5 6",
             "lease timetolive {L:a}",
             "lease timetolive {L:b} -w json",
             "lease timetolive {L:j} -w fields",
             "lease timetolive {L:max}",
             "lease revoke {L:a}", "lease revoke {L:b}", "lease revoke {L:j}",
             "lease revoke {L:f}", "lease revoke {L:max}",
             "get {P}nothing -w json")
    scenario("lease_timetolive",
             S("lease grant 600", capture="L"),
             "lease timetolive {L:L}",
             "lease timetolive {L:L} --keys",
             "lease timetolive {L:L} -w json",
             "lease timetolive {L:L} --keys -w json",
             "lease timetolive {L:L} --keys -w fields",
             "put {P}k1 v --lease={L:L}",                                # R+1
             "lease timetolive {L:L} --keys",
             "lease timetolive {L:L} --keys -w json",
             "lease timetolive {L:L} --keys -w fields",
             "put {P}k2 v --lease={L:L}",                                # R+2
             "lease timetolive {L:L}",
             "lease timetolive {L:L} --keys",
             "lease timetolive {L:L} --keys -w json",
             "lease timetolive {L:L} --keys -w fields",
             "lease timetolive {L:L} -w fields",
             "lease revoke {L:L}",                                       # R+3
             "lease timetolive {L:L}",
             "lease timetolive {L:L} --keys",
             "lease timetolive {L:L} -w json",
             "lease timetolive {L:L} --keys -w json",
             "lease timetolive {L:L} --keys -w fields",
             "lease timetolive 1234",
             "lease timetolive 1234 -w json",
             "lease timetolive zz",
             "lease timetolive",
             "lease timetolive {L:L} -w table",
             "get --prefix {P} -w json")
    scenario("lease_revoke",
             S("lease grant 600", capture="E"),
             "lease revoke {L:E}",                                       # no keys: no revision
             "get {P}x -w json",
             "lease revoke {L:E}",
             "lease revoke {L:E} -w json",
             S("lease grant 600", capture="J"),
             "lease revoke {L:J} -w json",
             S("lease grant 600", capture="F"),
             "lease revoke {L:F} -w fields",
             "lease revoke 1234",
             "lease revoke zz",
             "lease revoke",
             "lease revoke 1 2",
             "put {P}x v --lease={L:E}",
             "get {P}x -w json")
    scenario("lease_attach_keys",
             S("lease grant 600", capture="L"),
             S("lease grant 600", capture="M"),
             "put {P}a 1 --lease={L:L}",                                 # R+1
             "put {P}b 2 --lease={L:L}",                                 # R+2
             "get {P}a -w json",
             "get --prefix {P} -w fields",
             "put {P}a 3 --ignore-lease",                                # R+3 keeps L
             "get {P}a -w json",
             "put {P}b 4",                                               # R+4 detaches b
             "get {P}b -w json",
             "lease timetolive {L:L} --keys",
             TXN(txn_input([], ['put {P}c 5 --lease={L:L}', 'put {P}d 6 --lease={L:M}',
                                'put {P}b 7 --lease={L:M}'])),           # R+5
             "get --prefix {P} -w json",
             "lease timetolive {L:L} --keys",
             "lease timetolive {L:M} --keys -w json",
             "put {P}c 8 --lease={L:M}",                                 # R+6 c: L -> M
             "lease timetolive {L:L} --keys",
             "lease timetolive {L:M} --keys",
             "del {P}d",                                                 # R+7
             "lease timetolive {L:M} --keys -w fields",
             "lease revoke {L:M}",                                       # R+8 deletes b, c
             "get --prefix {P} -w json",
             "get --prefix {P} --rev={R+7} --keys-only",
             "get {P}b --rev={R+8} -w json",
             "get {P}c -w json",
             "lease revoke {L:L}",                                       # R+9 deletes a
             "get --prefix {P} -w json",
             "get {P}a --rev={R+8} -w fields",
             "lease timetolive {L:L} --keys",
             "put {P}z 1 --lease={L:L}",
             TXN(txn_input([], ['put {P}z 1 --lease={L:M}'])),
             "get --prefix {P} --count-only -w fields")
    scenario("lease_list",
             "lease list",
             S("lease grant 600", capture="x"),
             S("lease grant 700", capture="y"),
             "lease list",
             "lease list -w json",
             "lease list -w fields",
             "lease revoke {L:x}",
             "lease list",
             "lease list -w json",
             "lease revoke {L:y}",
             "lease list",
             "lease list extra-arg",
             "lease list -w table")
    scenario("lease_keepalive",
             S("lease grant 600", capture="L"),
             "lease keep-alive --once {L:L}",
             "lease keep-alive --once {L:L} -w json",
             "lease keep-alive --once {L:L} -w fields",
             "lease timetolive {L:L}",
             "lease revoke {L:L}",
             "lease keep-alive --once {L:L}",
             "lease keep-alive --once 1234",
             "lease keep-alive --once",
             "lease keep-alive --once zz",
             # A streaming keep-alive (renews every TTL/3 s) ends by itself once the
             # lease is revoked: "expired or revoked."  How many renewals it prints
             # depends on timing: canon="uniq" collapses them.
             S("lease grant 3", capture="S"),
             BG("ka", "lease keep-alive {L:S}"),
             WAIT("ka", 1),
             "lease revoke {L:S}",
             EXITED("ka", canon="uniq"))
    # must stay the last lease_ scenario (its leases expire by themselves in 2 s)
    scenario("lease_grant_min",
             S("lease grant 1", capture="m1"),
             "lease keep-alive --once {L:m1}",
             S("lease grant 2 -w json", capture="m2"),
             S("lease grant 0", capture="m0"),
             S("lease grant -w fields -- -5", capture="mn"),
             S("lease grant 3", capture="m3"),
             "lease grant 1 -w table")


def build_lock_scenarios() -> None:
    # All named lock_*.  `etcdctl lock` uses the concurrency.Mutex recipe (a session
    # lease, key NAME/<lease id in hex>, waiting for the deletion of older keys), not
    # the v3lock service.  In lock_ and elect_ scenarios such keys are normalized to
    # NAME/<LEASE:Kn>: the n-th lease id first seen in a key under the scenario's
    # prefix (also usable as {L:Kn} in later steps).  A holder that gets SIGTERM
    # deletes its key but does not revoke its session lease.
    scenario("lock_command",
             "lock {P}m -- echo hello",                                  # R+1, R+2
             "lock {P}m -- sh -c 'echo key=$ETCD_LOCK_KEY rev=$ETCD_LOCK_REV'",   # R+3, R+4
             "lock {P}m -- sh -c 'echo out; echo err >&2; exit 3'",      # R+5, R+6
             "lock {P}m -- /nonexistent/command",                        # R+7, R+8
             "lock {P}other --ttl 5 -- echo ttl",                        # R+9, R+10
             "lock {P}m --ttl 0 -- echo ttl0",                           # R+11, R+12
             "lock",
             "get --prefix {P} -w json")
    scenario("lock_contended",
             BG("h", "lock {P}mtx"),                                     # R+1
             WAIT("h", 2),
             BG("w", "lock {P}mtx -- sh -c 'echo got $ETCD_LOCK_KEY $ETCD_LOCK_REV'"),  # R+2
             BG("q", "watch --prefix {P}mtx --rev={R+2}"),
             WAIT("q", 3),                       # the waiter's key exists: it is queued
             PEEK("w"),
             "get --prefix {P}mtx --keys-only --sort-by=CREATE",
             "get --prefix {P}mtx -w fields --sort-by=CREATE",
             "lock {P}other -- echo unrelated",                          # R+3, R+4
             STOP("h", 2),                       # unlock: R+5; the waiter runs, R+6
             WAIT("q", 9),
             STOP("w", 1),
             STOP("q", 9),
             "get --prefix {P} -w json")
    scenario("lock_ttl",
             BG("h", "lock --ttl 7 {P}t"),                               # R+1
             WAIT("h", 2),
             "lease timetolive {L:K1} --keys",
             "get {P}t --prefix -w fields",
             STOP("h", 2),                                               # R+2
             "lease timetolive {L:K1} --keys",
             BG("h1", "lock --ttl 1 {P}u"),                              # R+3 (TTL 2: minimum)
             WAIT("h1", 2),
             "lease timetolive {L:K2}",
             STOP("h1", 2),                                              # R+4
             "get --prefix {P} -w json")


def build_elect_scenarios() -> None:
    # All named elect_*.  `etcdctl elect` uses the concurrency.Election recipe (like
    # lock: keys NAME/<lease>, value = proposal), not the v3election service; a
    # candidate that gets SIGTERM resigns (deletes its key).  `elect -l` prints the
    # key and value of every new leader.
    scenario("elect_arg_errors",
             "elect",
             "elect {P}x",
             "elect {P}x a b",
             "elect -l {P}x a")
    scenario("elect_campaign_observe",
             BG("obs", "elect -l {P}e"),
             BG("c1", "elect {P}e p1"),                                  # R+1
             WAIT("c1", 2),
             WAIT("obs", 2),
             BG("c2", "elect {P}e 'proposal two'"),                      # R+2
             BG("q", "watch --prefix {P}e --rev={R+2}"),
             WAIT("q", 3),                       # the second candidate is queued
             PEEK("c2"),
             "get --prefix {P}e --sort-by=CREATE -w fields",
             BG("late", "elect -l {P}e"),        # an observer started after the election
             WAIT("late", 2),
             STOP("c1", 2),                      # resigns: R+3, c2 takes over
             WAIT("c2", 2), WAIT("obs", 4), WAIT("late", 4),
             "get --prefix {P}e --print-value-only",
             STOP("c2", 2),                      # resigns: R+4
             WAIT("q", 9),
             STOP("obs", 4), STOP("late", 4), STOP("q", 9),
             "get --prefix {P} -w json")
