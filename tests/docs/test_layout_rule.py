"""Where things live is computed in one place, common/layout/ (layout.h):
the row rule, the placement of variables, the serving tasks' shards, the
name hash. This holds every caller to it: it reads the C and Python of
ps-server/, worker/, common/ and deploy/ (comments and string literals
left out) and fails naming the file and line of each copy outside
common/layout/:

- row:    splitmix64 of an id followed by '%' (cm_splitmix64_at(x) % n,
          cm_layout_id_hash(x) % n): the row rule, cm_layout_id_shard;
- modulo: a value taken modulo a shard count (% nshards, % shards, % ns,
          % nps, with or without a cast or a struct before it): a shard
          computed by hand (cm_layout_hash_shard, cm_layout_serve_shard,
          cm_layout_serve_replicas);
- fnv:    FNV-1a 64's offset basis or prime (0xcbf29ce484222325,
          14695981039346656037, 0x100000001b3, 1099511628211): a name
          hash of its own (cm_layout_name_hash);
- bucket: a hash shifted right by 52 (its top 12 bits), or the jump
          consistent hash's multiplier 2862933555777941757: a bucket or
          its shard computed by hand (cm_layout_bucket,
          cm_layout_bucket_shard).

What uses those for something that is not placement is listed in ALLOWED
by file and rule, with the reason; an entry that no longer matches
anything fails too, so the list cannot outlive its reason.

Run: /usr/bin/python3 tests/docs/test_layout_rule.py [SOURCE_ROOT]
Exit status: 0 when nothing outside common/layout/ computes a placement,
1 otherwise (each copy said as FILE:LINE: RULE: the line)."""
import io
import os
import re
import sys
import tokenize

ROOTS = ("ps-server", "worker", "common", "deploy")
LAYOUT = "common/layout/"
EXTS = (".c", ".h", ".cu", ".py")

ALLOWED = {
    ("common/spec/fingerprint.c", "fnv"):
        "the spec's fingerprint (Caller.spec_fp): a check value folded "
        "over the job's name, the address lists' lengths and each address "
        "with its NUL, sent with every call; not a name's hash and not a "
        "placement (one copy already, in common/spec)",
    ("worker/data/criteo.c", "fnv"):
        "Criteo's feature hash (dw_criteo_id, docs/ctr.md; psd/criteo.py "
        "calls it): which table id a categorical value becomes, a format "
        "of the data that must not change if the layout's name hash does; "
        "the row rule then places that id like any other",
}

RULES = {
    "row": re.compile(r"\b(?:cm_splitmix64_at|cm_layout_id_hash)\s*\("),
    "modulo": re.compile(
        r"%=?\s*(?:\(\s*[A-Za-z_][\w ]*\)\s*)?(?:[A-Za-z_]\w*\s*(?:->|\.)\s*)*"
        r"(?:nshards|n_shards|shards|ns|nps)\b"),
    "fnv": re.compile(
        r"(?i)\b(?:0xcbf29ce484222325|14695981039346656037|0x100000001b3|"
        r"1099511628211)(?:u?ll|ul{0,2})?\b"),
    "bucket": re.compile(
        r"(?:>>\s*(?:52|\(\s*64\s*-\s*12\s*\))\b)|"
        r"\b2862933555777941757(?:u?ll)?\b"),
}


def strip_c(text):
    """text with its comments and string and character literals blanked
    (newlines kept, so lines keep their numbers)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_py(text):
    """text with its comments and strings (docstrings included) blanked."""
    lines = text.splitlines(keepends=True)
    blank = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            blank.append((tok.start, tok.end))
    for (sr, sc), (er, ec) in reversed(blank):
        for r in range(sr, er + 1):
            line = lines[r - 1]
            a = sc if r == sr else 0
            b = ec if r == er else len(line.rstrip("\n"))
            lines[r - 1] = line[:a] + " " * (b - a) + line[b:]
    return "".join(lines)


def row_hits(code):
    """Offsets of a splitmix64-of-an-id call whose closing parenthesis is
    followed by '%'."""
    for m in RULES["row"].finditer(code):
        depth, j = 0, m.end() - 1
        while j < len(code):
            if code[j] == "(":
                depth += 1
            elif code[j] == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        rest = code[j + 1:j + 40].lstrip()
        if rest.startswith("%") and not rest.startswith("%="):
            yield m.start()


def scan(root):
    """(copies, files scanned, allowed (path, rule) pairs that matched)."""
    copies, seen, used = [], 0, set()
    for top in ROOTS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for f in sorted(files):
                if not f.endswith(EXTS):
                    continue
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                if rel.startswith(LAYOUT):
                    continue
                text = open(path, encoding="utf-8", errors="replace").read()
                code = strip_py(text) if f.endswith(".py") else strip_c(text)
                seen += 1
                hits = [("row", at) for at in row_hits(code)]
                for rule in ("modulo", "fnv", "bucket"):
                    hits += [(rule, m.start())
                             for m in RULES[rule].finditer(code)]
                raw = text.splitlines()
                for rule, at in sorted(hits, key=lambda h: h[1]):
                    if (rel, rule) in ALLOWED:
                        used.add((rel, rule))
                        continue
                    line = code.count("\n", 0, at) + 1
                    copies.append("%s:%d: %s: %s" % (
                        rel, line, rule, raw[line - 1].strip()))
    return copies, seen, used


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    bad = []
    if not os.path.isfile(os.path.join(root, LAYOUT, "layout.h")):
        bad.append("%slayout.h: missing; the layout module is gone" % LAYOUT)
    copies, seen, used = scan(root)
    if seen < 100:
        bad.append("only %d files read under %s: wrong root?"
                   % (seen, ", ".join(ROOTS)))
    bad += ["%s (a placement computed outside %s: ask layout.h)"
            % (c, LAYOUT) for c in copies]
    for key in sorted(set(ALLOWED) - used):
        bad.append("%s: ALLOWED names rule %s there, which no longer "
                   "matches anything; remove the entry" % key)
    for b in bad:
        print(b)
    print("test_layout_rule: %d files read, %d copies of a layout rule "
          "outside %s" % (seen, len(copies), LAYOUT))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
