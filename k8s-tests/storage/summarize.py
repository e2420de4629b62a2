#!/usr/bin/env python3
"""Summarises run.sh's results: one row per server and package (tests passed, failed, skipped,
seconds), then every failure with its first lines of output.

    summarize.py RESULTS_DIR NAME=BINARY:MEMBERS:PACKAGE,... ...
    summarize.py --to-rerun RESULTS_DIR NAME=... ...   (what run.sh runs a second time)

RESULTS_DIR holds NAME.PACKAGE.json, the `go tool test2json` output of each run. Exits 1 if any
test failed, except on a reference etcd (a NAME beginning with "etcd") a failure whose output
shows that the server version lacks what the test needs: RangeStream came with etcd 3.7
(kube-apiserver falls back to paginated lists without it, so etcd 3.5 and 3.6 fail the tests
that insist on it), and kube-apiserver's feature checker finds RequestWatchProgress missing
before etcd 3.5.13, so etcd 3.5.1 fails the watch-cache tests that need it. A failed test
that passed when run.sh ran it again alone (NAME.PACKAGE.rerun.json) is listed, not counted:
some upstream tests give the server 100 ms, which a machine running every suite at once can miss.
A test binary that did not finish (an upstream test panicked, which ends the binary: once,
cacher's TestWatchNotHangingOnStartupFailure, whose storage is a mock, not the server) has the
tests it left run again alone, and counts as finished if that run finishes.
"""

import json
import os
import sys

PACKAGES = ("etcd3", "cacher", "largeobjects", "controlplane")
RANGE_STREAM_MISSING = ("unknown method RangeStream", "expected the list to be served by RangeStream")
# What kube-apiserver's feature checker logs (and its watch cache answers) for an etcd older than 3.5.13 (3.4.31), whose
# progress notifications it cannot trust (etcd issues 15220, 17507): its watch cache then needs
# what that etcd lacks, and the cacher's tests fail on it.
PROGRESS_UNSUPPORTED = ("RequestWatchProgress feature is not supported by",
                        "required storage feature RequestWatchProgress is disabled")


def load(path):
    """Returns ({test: outcome}, {test: output lines}, elapsed seconds or None) of one run."""
    outcome, output, elapsed = {}, {}, None
    if not os.path.exists(path):
        return outcome, output, elapsed
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            test, action = event.get("Test"), event.get("Action")
            if test and action == "output":
                output.setdefault(test, []).append(event.get("Output", ""))
            elif test and action in ("pass", "fail", "skip"):
                outcome[test] = action
            elif not test and action in ("pass", "fail"):
                elapsed = event.get("Elapsed")
                outcome[""] = action
    return outcome, output, elapsed


def explained(test, outcome, output):
    """Why a reference etcd failed `test` and every failed test under it, if for what that etcd
    version lacks: "RangeStream", "RequestWatchProgress", or None."""
    under = [t for t in outcome if t == test or t.startswith(test + "/")]
    failed_leaves = [t for t in under if outcome[t] == "fail" and not any(
        u.startswith(t + "/") and outcome[u] == "fail" for u in under)]
    texts = ["".join(output.get(t, [])) for t in failed_leaves]
    if not texts:
        return None
    if all(any(m in text for m in RANGE_STREAM_MISSING) for text in texts):
        return "RangeStream"
    if any(m in "".join(output.get(u, [])) for u in under for m in PROGRESS_UNSUPPORTED):
        return "RequestWatchProgress"
    return None


def first_error_lines(test, output, limit=6):
    """The lines of a test's output that report its failure (file:line messages), at most limit."""
    lines = [line.rstrip() for line in output.get(test, []) if ".go:" in line and "last lines" not in line]
    return lines[:limit]


def unfinished(outcome):
    """Whether a run's test binary ended before reporting the package's result."""
    return not any(outcome) or outcome.get("") is None


def failures(results, specs):
    """Table rows, failures that count (name, package, test, lines), tolerated reference failures
    (text), and tests that failed and then passed when run again alone (text)."""
    rows, problems, tolerated, reran = [], [], [], []
    for spec in specs:
        name, target = spec.split("=", 1)
        parts = target.split(":")
        members = parts[1] if len(parts) > 1 and parts[1] else "1"
        packages = parts[2] if len(parts) > 2 and parts[2] else ",".join(PACKAGES)
        reference = name.startswith("etcd")
        for package in packages.split(","):
            outcome, output, elapsed = load(os.path.join(results, f"{name}.{package}.json"))
            again, again_output, _ = load(os.path.join(results, f"{name}.{package}.rerun.json"))
            tests = {t: a for t, a in outcome.items() if t}
            counts = {a: sum(1 for x in tests.values() if x == a) for a in ("pass", "fail", "skip")}
            rows.append((name, members, package, counts["pass"], counts["fail"], counts["skip"], elapsed))
            top_failed = [t for t, a in tests.items() if a == "fail" and "/" not in t]
            if unfinished(outcome) and unfinished(again):
                problems.append((name, package, "(no result: the test binary did not finish)", []))
            elif unfinished(outcome):
                reran.append(f"{name} {package} (the test binary did not finish: the tests it had"
                             " not passed were run again alone, and finished)")
                # What failed only in that run counts as any failure does.
                for t in sorted(t for t, a in again.items() if t and a == "fail" and "/" not in t):
                    if t not in top_failed:
                        leaves = [u for u in again if u.startswith(t) and again[u] == "fail"]
                        lines = [line for u in sorted(leaves) for line in first_error_lines(u, again_output)]
                        problems.append((name, package, t, lines[:12]))
            if outcome.get("") == "fail" and not top_failed:
                problems.append((name, package, "(the run failed outside any test)", output.get("", [])[-6:]))
            for t in sorted(top_failed):
                reason = explained(t, tests, output) if reference else None
                if reason:
                    tolerated.append(f"{name} {package} {t} (no {reason})")
                    continue
                leaves = [u for u in tests if u.startswith(t) and tests[u] == "fail"]
                lines = [line for u in sorted(leaves) for line in first_error_lines(u, output)]
                if again.get(t) == "pass":
                    reran.append(f"{name} {package} {t}: " + " / ".join(line.strip() for line in lines[-2:]))
                    continue
                problems.append((name, package, t, lines[:12]))
    return rows, problems, tolerated, reran


def main():
    if sys.argv[1] == "--to-rerun":
        # What run.sh runs again, a line per package: NAME PACKAGE run REGEX (the failures that
        # count), or NAME PACKAGE skip REGEX (a binary that did not finish: all but the tests
        # that passed or were skipped).
        _, problems, _, _ = failures(sys.argv[2], sys.argv[3:])
        by, cut_short = {}, set()
        for name, package, test, _ in problems:
            if test.startswith("Test"):
                by.setdefault((name, package), []).append(test)
            elif test.startswith("(no result"):
                cut_short.add((name, package))
        for name, package in sorted(cut_short):
            outcome, _, _ = load(os.path.join(sys.argv[2], f"{name}.{package}.json"))
            done = sorted(t for t, a in outcome.items() if t and "/" not in t and a in ("pass", "skip"))
            print(name, package, "skip", "^(" + "|".join(done) + ")$" if done else "^$")
        for (name, package), tests in by.items():
            if (name, package) not in cut_short:
                print(name, package, "run", "^(" + "|".join(tests) + ")$")
        return
    rows, problems, tolerated, reran = failures(sys.argv[1], sys.argv[2:])
    print("| server | members | package | passed | failed | skipped | seconds |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for name, members, package, passed, failed, skipped, elapsed in rows:
        secs = f"{elapsed:.0f}" if elapsed is not None else "-"
        print(f"| {name} | {members} | {package} | {passed} | {failed} | {skipped} | {secs} |")
    if tolerated:
        print("\nFailed on a reference etcd only for what that version lacks (RangeStream came with"
              " etcd 3.7; kube-apiserver trusts RequestWatchProgress from etcd 3.5.13):")
        for t in tolerated:
            print("  " + t)
    if reran:
        print("\nFailed while every run shared the machine, then passed when run again alone"
              " (timing windows such as TestCompact's 100 ms):")
        for t in reran:
            print("  " + t)
    if problems:
        print("\nFAILED:")
        for name, package, test, lines in problems:
            print(f"  {name} {package} {test}")
            for line in lines:
                print("      " + line.strip())
        sys.exit(1)
    print("\nAll tests passed on every server.")


if __name__ == "__main__":
    main()
