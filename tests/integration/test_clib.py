#!/usr/bin/python3
"""Integration test of libpsclient as a user gets it: installed.

- install: `meson install --destdir TMP` puts <psd/client.h>, libpsclient.so
  (soname libpsclient.so.1, exporting psc_* alone), libpsclient.a,
  psclient.pc and share/psd/ps.proto under TMP; the .pc names the install
  prefix, and with PKG_CONFIG_SYSROOT_DIR=TMP its flags point into TMP,
  never into the source or build tree.
- man: psclient(3) is installed and covers every function of the header.
- header: the installed header compiles alone with -std=c11 -Wall -Werror
  -pedantic (and as C++), including nothing but standard headers.
- linreg: deploy/examples/c/linreg.c as installed (share/psd/examples/c,
  the same as the source's), built with `cc` and pkg-config's flags alone
  as docs/clib.md says, trains through 2 real shards: exits 0, its final
  loss below the fraction of its first that README.md's example table
  states (test_examples.stated), bytes pulled > 0; the same built against
  libpsclient.a (pkg-config --static) needs no libpsclient.so and does the
  same.
- python: the installed psd Python package, alone, trains against the
  shards.

The test's own programs against the installed library (declare values, a
late shard, the log, errors): test_clib_calls.py. Usage: test_clib.py
BUILD_DIR [unittest args...]. Waits on the shards' ready lines, never a
fixed sleep.
"""

import glob
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import clib_install as ci
import harness as h
from clib_install import SRC, Installed, checked, need_tools
from test_examples import stated

LINREG = os.path.join(SRC, "deploy", "examples", "c", "linreg.c")


def tearDownModule():
    ci.cleanup()


class InstallTest(unittest.TestCase):
    def setUp(self):
        need_tools(self, "cc", "pkg-config", "nm", "readelf")
        self.i = Installed.get()

    def test_pc_file(self):
        i = self.i
        with open(os.path.join(i.pcdir, "psclient.pc")) as f:
            pc = f.read()
        self.assertRegex(pc, r"(?m)^prefix=%s$" % re.escape(i.prefix))
        self.assertRegex(pc, r"(?m)^Libs: .*-lpsclient\b")
        self.assertRegex(pc, r"(?m)^Cflags: .*-I\$\{includedir\}")
        self.assertRegex(pc, r"(?m)^Requires.private: .*\bgrpc\b")
        self.assertNotIn(h.BUILD, pc)
        self.assertNotIn(SRC + "/", pc)
        cflags, libs = i.pkg_config("--cflags"), i.pkg_config("--libs")
        self.assertIn("-I" + i.staged(i.includedir), cflags)
        self.assertIn("-L" + i.staged(i.libdir), libs)
        self.assertIn("-lpsclient", libs)
        for f in cflags + libs:
            self.assertNotIn(h.BUILD, f, "a flag into the build tree: %s" % f)
            self.assertFalse(f.startswith(("-I" + SRC + "/", "-L" + SRC + "/"))
                             and not f.startswith(("-I" + i.dest, "-L" + i.dest)),
                             "a flag into the source tree: %s" % f)
            if f.startswith(("-I", "-L")) and i.prefix in f:
                self.assertTrue(f[2:].startswith(i.dest), "%s: not into the destdir" % f)

    def test_header_alone(self):
        i = self.i
        inc = i.staged(i.includedir)
        header = os.path.join(inc, "psd", "client.h")
        with open(header) as f:
            text = f.read()
        includes = re.findall(r"(?m)^\s*#\s*include\s*(\S+)", text)
        self.assertEqual(sorted(includes), ["<stddef.h>", "<stdint.h>"],
                         "client.h must include standard headers alone")
        with tempfile.TemporaryDirectory(prefix="psd-test-clib-h-") as d:
            c = os.path.join(d, "h.c")
            with open(c, "w") as f:
                f.write("#include <psd/client.h>\n#include <psd/client.h>\n"
                        "int main(void) { return PSC_VERSION_MAJOR == 1 ? 0 : 1; }\n")
            checked(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic",
                     "-I" + inc, "-c", c, "-o", os.path.join(d, "h.o")], "header as C11")
            checked(["cc", "-std=c99", "-Wall", "-Werror", "-pedantic", "-I" + inc,
                     "-c", c, "-o", os.path.join(d, "h99.o")], "header as C99")
            if shutil.which("c++"):
                cc = os.path.join(d, "h.cc")
                shutil.copy(c, cc)
                checked(["c++", "-std=c++11", "-Wall", "-Werror", "-pedantic",
                         "-I" + inc, "-c", cc, "-o", os.path.join(d, "hpp.o")],
                        "header as C++")

    def test_shared_library_exports_and_soname(self):
        i = self.i
        lib = i.staged(os.path.join(i.libdir, "libpsclient.so"))
        self.assertTrue(os.path.islink(lib), "libpsclient.so is not the dev link")
        self.assertEqual(os.readlink(lib), "libpsclient.so.1")
        self.assertTrue(os.path.isfile(i.staged(os.path.join(i.libdir, "libpsclient.so.1.3.0"))))
        self.assertTrue(os.path.isfile(i.staged(os.path.join(i.libdir, "libpsclient.a"))))
        dyn = checked(["readelf", "-d", lib], "readelf")
        self.assertRegex(dyn, r"\(SONAME\)\s+Library soname: \[libpsclient\.so\.1\]")
        out = checked(["nm", "-D", "--defined-only", lib], "nm -D")
        syms = {}
        for line in out.splitlines():
            parts = line.split()
            syms[parts[-1].split("@")[0]] = parts[-2]
        self.assertEqual(syms.pop("PSCLIENT_1", None), "A", "no version node PSCLIENT_1")
        # Each minor version's additions have a node of their own.
        self.assertEqual(syms.pop("PSCLIENT_1.1", None), "A", "no version node PSCLIENT_1.1")
        self.assertRegex(out, r"\bpsc_declare_values@@PSCLIENT_1\.1\b")
        self.assertRegex(out, r"\bpsc_set_log@@PSCLIENT_1\.1\b")
        self.assertEqual(syms.pop("PSCLIENT_1.2", None), "A", "no version node PSCLIENT_1.2")
        self.assertRegex(out, r"\bpsc_pull_rows_many@@PSCLIENT_1\.2\b")
        self.assertRegex(out, r"\bpsc_push_rows_many@@PSCLIENT_1\.2\b")
        self.assertEqual(syms.pop("PSCLIENT_1.3", None), "A", "no version node PSCLIENT_1.3")
        self.assertRegex(out, r"\bpsc_lookup@@PSCLIENT_1\.3\b")
        self.assertRegex(out, r"\bpsc_serving_open@@PSCLIENT_1\.3\b")
        self.assertRegex(out, r"\bpsc_declare@@PSCLIENT_1\b")
        bad = sorted(s for s in syms if not s.startswith("psc_"))
        self.assertEqual(bad, [], "exported beyond psc_*")
        # Every function of the header is exported, none of the library's own.
        with open(i.staged(os.path.join(i.includedir, "psd", "client.h"))) as f:
            declared = set(re.findall(r"\b(psc_[a-z_]+)\(", f.read()))
        self.assertEqual(sorted(declared - set(syms)), [], "declared but not exported")
        self.assertEqual(sorted(set(syms) - declared), [], "exported but not declared")

    def test_man_page_covers_the_header(self):
        """psclient(3) is installed and shows every function of the header
        in its synopsis and describes each one."""
        i = self.i
        with open(i.staged(os.path.join(i.mandir, "man3", "psclient.3"))) as f:
            man = f.read()
        with open(i.staged(os.path.join(i.includedir, "psd", "client.h"))) as f:
            declared = set(re.findall(r"\b(psc_[a-z_]+)\(", f.read()))
        synopsis = man.split(".SH SYNOPSIS")[1].split(".SH DESCRIPTION")[0]
        described = man.split(".SH DESCRIPTION")[1]
        for fn in sorted(declared):
            self.assertTrue(re.search(r"\b%s\(" % fn, synopsis), fn + ": not in the synopsis")
            self.assertTrue(re.search(r"(?m)^\.BR %s (\(\)|\"\(\), \")" % fn, described),
                            fn + ": not described")

    def test_proto_installed(self):
        i = self.i
        p = i.staged(os.path.join(i.datadir, "psd", "ps.proto"))
        self.assertTrue(p.startswith(i.dest))
        self.assertIn("/share/psd/ps.proto", p)
        with open(p) as f, open(os.path.join(SRC, "proto", "ps.proto")) as g:
            self.assertEqual(f.read(), g.read())


class ClientTest(ci.ClientCase):
    """linreg.c and the Python package as installed, run against 2
    shards of their own."""

    def linreg(self, static):
        src = self.i.staged(os.path.join(self.i.datadir, "psd", "examples", "c", "linreg.c"))
        self.assertTrue(os.path.isfile(src), "not installed: share/psd/examples/c/linreg.c")
        with open(src) as f, open(LINREG) as g:
            self.assertEqual(f.read(), g.read(), "the installed linreg.c is not the source's")
        exe = self.cc(src, os.path.join(self.d, "linreg"), static=static)
        r = h.run([exe, self.spec, "worker:0", "300"], timeout=60,
                  env=None if static else self.run_env)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        m = re.search(r"(?m)^final: (.*)$", r.stdout)
        self.assertIsNotNone(m, out)
        f = dict(kv.split("=", 1) for kv in m.group(1).split())
        self.assertEqual(int(f["steps"]), 300)
        stated("linreg.c").check(self, f, "linreg")  # README's figure
        self.assertGreater(int(f["bytes_pulled"]), 0, out)
        self.assertGreater(int(f["bytes_pushed"]), 0, out)

    def test_linreg_shared(self):
        self.linreg(static=False)

    def test_linreg_static(self):
        self.linreg(static=True)

    def test_python_package_installed(self):
        """The installed psd Python package, alone (no build tree on its
        path, libpsclient linked in: no LD_LIBRARY_PATH), trains against
        the shards."""
        pkg = glob.glob(self.i.staged(os.path.join(self.i.prefix, "lib",
                                                   "python3*", "*-packages")))
        if not pkg:
            self.skipTest("the psd Python package is not installed "
                          "(python3-dev missing?)")
        ext = glob.glob(os.path.join(pkg[0], "psd", "_psd*.so"))
        self.assertEqual(len(ext), 1, pkg[0])
        needed = checked(["readelf", "-d", ext[0]], "readelf")
        self.assertNotIn("libpsclient", needed)
        syms = checked(["nm", "-D", "--defined-only", ext[0]], "nm").split()
        self.assertIn("PyInit__psd", syms)
        self.assertFalse([x for x in syms if x.startswith(("psc_", "dw_", "cm_"))])
        code = ("import numpy as np, psd, sys\n"
                "assert psd.__file__.startswith(sys.argv[2]), psd.__file__\n"
                "c = psd.Client(sys.argv[1], 'worker:0')\n"
                "w = c.declare('py/w', (8,), optimizer={'type': 'sgd', 'lr': 0.5})\n"
                "c.push(w, np.ones(8, np.float32))\n"
                "print('pulled', c.pull(w).tolist())\n")
        e = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
        e["PYTHONPATH"] = pkg[0]
        r = subprocess.run(["/usr/bin/python3", "-c", code, self.spec, pkg[0]],
                           capture_output=True, text=True, env=e, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("pulled [-0.5, -0.5", r.stdout)


if __name__ == "__main__":
    ci.main()
