"""The documents' links lead somewhere: every relative link in README.md,
CONTRIBUTING.md, docs/*.md and deploy/**/README.md names a file of the
repository, and a link's #anchor names a heading of that file (GitHub's
anchors: lower case, punctuation dropped, spaces as hyphens).

README.md is the front door and repeats docs/faults.md's promises in short;
a link from one to a section of the other that was renamed or removed would
leave a reader with the short version only, so a broken anchor fails here.

Run: /usr/bin/python3 tests/docs/test_links.py [SOURCE_ROOT]
Exit status: 0 when every link resolves, 1 otherwise (each broken link said
with its file and line)."""
import os
import re
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def anchor_of(title):
    """GitHub's anchor for a heading's text."""
    t = re.sub(r"`([^`]*)`", r"\1", title)
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", t)
    t = t.strip().lower()
    t = re.sub(r"[^\w\- ]", "", t)
    return t.replace(" ", "-")


def anchors(path):
    """Every heading anchor of a markdown file (duplicates numbered)."""
    seen, out, fenced = {}, set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else HEADING.match(line)
            if m:
                a = anchor_of(m.group(2))
                n = seen.get(a, 0)
                out.add(a if n == 0 else f"{a}-{n}")
                seen[a] = n + 1
    return out


def documents(root):
    docs = ["README.md", "CONTRIBUTING.md"]
    docs += [os.path.join("docs", n) for n in sorted(os.listdir(
        os.path.join(root, "docs"))) if n.endswith(".md")]
    for d, _, files in sorted(os.walk(os.path.join(root, "deploy"))):
        for n in sorted(files):
            if n == "README.md":
                docs.append(os.path.relpath(os.path.join(d, n), root))
    return docs


def check(root):
    """Returns the broken links as 'FILE:LINE: message' strings."""
    bad, cache = [], {}
    for doc in documents(root):
        path = os.path.join(root, doc)
        fenced = False
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
        for no, line in enumerate(lines, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue  # http:, https:, mailto:
                file_part, _, anchor = target.partition("#")
                dest = (os.path.normpath(os.path.join(os.path.dirname(path),
                                                      file_part))
                        if file_part else path)
                if not os.path.exists(dest):
                    bad.append(f"{doc}:{no}: {target}: no file "
                               f"{os.path.relpath(dest, root)}")
                    continue
                if anchor and dest.endswith(".md"):
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if anchor not in cache[dest]:
                        bad.append(f"{doc}:{no}: {target}: no heading "
                                   f"'#{anchor}' in "
                                   f"{os.path.relpath(dest, root)}")
    return bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..")
    bad = check(os.path.abspath(root))
    for b in bad:
        print(b, file=sys.stderr)
    n = len(documents(os.path.abspath(root)))
    print(f"docs-links: {n} documents, {len(bad)} broken links")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
