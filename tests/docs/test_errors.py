"""libpsclient's error codes are one table: psd/client.h's PSC_ERRNO_MAP and
common/base/err.h's CM_ERRNO_MAP hold the same names and values (the build
checks it too, api_errors.c), and psclient(3)'s ERRORS section describes
every code with its value, as the header's comment does.

Run: /usr/bin/python3 tests/docs/test_errors.py [SOURCE_ROOT]
Exit status: 0 when all agree, 1 otherwise (each difference said)."""
import os
import re
import sys

XX = re.compile(r'XX\((\w+),\s*(-\d+)[,)]')


def errno_map(path, macro):
    """The (name, value) entries of macro's X-macro in path."""
    text = open(path, encoding="utf-8").read()
    start = text.index("#define " + macro + "(XX)")
    body = []
    for line in text[start:].splitlines():
        body.append(line)
        if not line.rstrip().endswith("\\"):
            break
    return [(n, int(v)) for n, v in XX.findall("\n".join(body))]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    pub = errno_map(os.path.join(root, "worker/psclient/include/psd/client.h"),
                    "PSC_ERRNO_MAP")
    cm = errno_map(os.path.join(root, "common/base/err.h"), "CM_ERRNO_MAP")
    bad = []
    if not pub:
        bad.append("psd/client.h: no PSC_ERRNO_MAP entries found")
    if pub != cm:
        bad.append("PSC_ERRNO_MAP %s differs from CM_ERRNO_MAP %s"
                   % (sorted(set(pub) - set(cm)), sorted(set(cm) - set(pub))))
    man = open(os.path.join(root, "deploy/man/psclient.3"),
               encoding="utf-8").read()
    errors = man[man.index(".SH ERRORS"):]
    errors = errors[:errors.index("\n.SH ", 1)]
    header = open(os.path.join(root, "worker/psclient/include/psd/client.h"),
                  encoding="utf-8").read()
    said = header[:header.index("#define PSC_ERRNO_MAP")]
    for name, value in pub:
        m = re.search(r"PSC_%s\b[^\n]*\n?\(?\\?\(?\\-%d\)" % (name, -value),
                      errors)
        if not m:
            bad.append("psclient(3) ERRORS: no PSC_%s (\\-%d)" % (name, -value))
        if not re.search(r"\*\s+(\w+, )*%s\b" % name, said):
            bad.append("psd/client.h: the codes' comment does not say %s" % name)
    for line in bad:
        print(line)
    print("%d codes, %d problems" % (len(pub), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
