"""Checks that the fuzzer reaches every call of the wire (the meson test
fuzz-coverage; tests/fuzz).

Every rpc of proto/ps.proto must be among the fuzz target's methods
(fuzz_methods in tests/fuzz/fuzz_input.h, which the method byte picks from)
and be called by at least one seed that fuzz-seeds writes, so that a call
added to the proto cannot go unfuzzed. A method in fuzz_methods that the
proto lacks fails too (a renamed call). Needs no clang: it reads the
sources and runs the seed writer, which the ordinary build makes.

  check_coverage.py --proto proto/ps.proto --methods tests/fuzz/fuzz_input.h
                    --seeds BUILD/tests/fuzz/fuzz-seeds [--corpus DIR]

With --corpus, also says how many committed inputs call each method (they
were found under an older method table when it grew, so they only count
as a note)."""
import argparse
import os
import re
import subprocess
import sys
import tempfile


def proto_rpcs(path):
    """'/package.Service/Method' for every rpc of every service, in order."""
    with open(path) as f:
        text = re.sub(r"//[^\n]*", "", f.read())
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    package = re.search(r"^\s*package\s+([\w.]+)\s*;", text, re.M)
    if not package:
        sys.exit("fuzz-coverage: %s names no package" % path)
    rpcs = []
    for svc in re.finditer(r"\bservice\s+(\w+)\s*\{", text):
        depth, i = 1, svc.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        for rpc in re.finditer(r"\brpc\s+(\w+)\s*\(", text[svc.end():i]):
            rpcs.append("/%s.%s/%s" % (package.group(1), svc.group(1), rpc.group(1)))
    return rpcs


def fuzz_methods(path):
    """fuzz_methods[] of fuzz_input.h, in the order the method byte picks
    them, and FUZZ_MAX_CALLS."""
    with open(path) as f:
        text = f.read()
    block = re.search(r"fuzz_methods\[\]\s*=\s*\{(.*?)\};", text, re.S)
    calls = re.search(r"#define\s+FUZZ_MAX_CALLS\s+(\d+)", text)
    if not block or not calls:
        sys.exit("fuzz-coverage: no fuzz_methods[] or FUZZ_MAX_CALLS in %s" % path)
    return re.findall(r'"([^"]+)"', block.group(1)), int(calls.group(1))


def calls_of(data, methods, max_calls):
    """The methods an input calls (fuzz_input.h's format)."""
    out, off = [], 1
    while off + 3 <= len(data) and len(out) < max_calls:
        out.append(methods[data[off] % len(methods)])
        length = data[off + 1] | data[off + 2] << 8
        off += 3 + min(length, len(data) - off - 3)
    return out


def read_inputs(d, methods, max_calls):
    """{method: [input names calling it]} over the inputs in directory d."""
    got = {}
    for name in sorted(os.listdir(d)):
        if name.startswith(".") or name == "README":
            continue
        with open(os.path.join(d, name), "rb") as f:
            for m in set(calls_of(f.read(), methods, max_calls)):
                got.setdefault(m, []).append(name)
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto", required=True)
    ap.add_argument("--methods", required=True)
    ap.add_argument("--seeds", required=True, help="the fuzz-seeds program")
    ap.add_argument("--corpus")
    a = ap.parse_args()
    rpcs = proto_rpcs(a.proto)
    methods, max_calls = fuzz_methods(a.methods)
    if not rpcs:
        sys.exit("fuzz-coverage: no rpc found in %s" % a.proto)
    with tempfile.TemporaryDirectory(prefix="fuzz-seeds-") as d:
        r = subprocess.run([a.seeds, d], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr, end="")
            print("fuzz-coverage: FAILED: %s exited %d" % (a.seeds, r.returncode))
            return 1
        seeded = read_inputs(d, methods, max_calls)
    corpus = read_inputs(a.corpus, methods, max_calls) if a.corpus else {}

    bad = []
    for rpc in rpcs:
        if rpc not in methods:
            bad.append("%s is an rpc of %s but not in fuzz_methods (%s): the fuzzer "
                       "never calls it; add it at the end of the list"
                       % (rpc, a.proto, a.methods))
        elif rpc not in seeded:
            bad.append("%s is in fuzz_methods but no seed fuzz-seeds writes calls it; "
                       "give it a seed in tests/fuzz/fuzz_seeds.c" % rpc)
    for m in methods:
        if m not in rpcs:
            bad.append("%s is in fuzz_methods (%s) but not an rpc of %s"
                       % (m, a.methods, a.proto))
    for rpc in rpcs:
        print("fuzz-coverage: %-28s %s, %d seeds%s"
              % (rpc, "fuzzed" if rpc in methods else "NOT FUZZED",
                 len(seeded.get(rpc, [])),
                 ", %d corpus inputs" % len(corpus.get(rpc, [])) if a.corpus else ""))
    for b in bad:
        print("fuzz-coverage: " + b)
    if bad:
        print("fuzz-coverage: FAILED (%d above)" % len(bad))
        return 1
    print("fuzz-coverage: all %d calls of %s are fuzzed and seeded" % (len(rpcs), a.proto))
    return 0


if __name__ == "__main__":
    sys.exit(main())
