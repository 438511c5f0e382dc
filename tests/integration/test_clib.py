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
- linreg: deploy/examples/c/linreg.c, built with `cc` and pkg-config's flags
  alone, trains through 2 real shards: exits 0, its final loss below 1e-3
  of its first, bytes pulled > 0; the same built against libpsclient.a
  (pkg-config --static) needs no libpsclient.so and does the same.
- errors: a small program of the test's own gets clear errors for a missing
  spec file, a variable of 0 dimensions and a handle never declared; two
  clients declaring the same variables (PSC_PLACE_AUTO) in opposite orders
  both succeed against the same shards and see one variable each.

Usage: test_clib.py BUILD_DIR [unittest args...]. Waits on the shards'
ready lines, never a fixed sleep.
"""

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import unittest

import harness as h

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINREG = os.path.join(SRC, "deploy", "examples", "c", "linreg.c")
# The shards' optimizer for linreg: plain SGD converges in its 300 steps.
JOB = {"name": "clib", "optimizer": {"type": "sgd", "lr": 0.1}}

# The test's own program: what bad input gets, one line per check
# ("name rc=N ..."), the error texts with their newlines flattened.
ERRORS_C = r"""
#include <stdio.h>
#include <string.h>

#include <psd/client.h>

static const char *flat(const char *s) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *p = buf; *p; p++)
    if (*p == '\n')
      *p = '|';
  return buf;
}

/* Declares the variables names[order[0..4)] one by one. */
static void declare_all(psc_client *c, const char *who, const int *order) {
  static const char *names[4] = {"ord/small", "ord/mid", "ord/big",
                                 "ord/matrix"};
  static const int64_t shapes[4][2] = {{16, 1}, {1000, 1}, {65536, 1},
                                       {300, 300}};
  static const int ndims[4] = {1, 1, 1, 2};
  /* Placed by the shards' rule; SGD with lr 1, so that a pull shows the
   * pushed gradient exactly. */
  struct psc_var_opts o = {.placement = PSC_PLACE_AUTO,
                           .optimizer = "{\"type\": \"sgd\", \"lr\": 1}"};
  for (int k = 0; k < 4; k++) {
    int i = order[k];
    int rc = psc_declare(c, names[i], ndims[i], shapes[i], &o);
    printf("declare_%s %s rc=%d grpc=%d err=%s\n", who, names[i], rc,
           psc_grpc_status(c), flat(psc_error(c)));
  }
}

int main(int argc, char **argv) {
  char err[4096] = "";
  psc_client *a = NULL, *b = NULL;
  int rc;
  if (argc != 3) {
    fprintf(stderr, "usage: %s SPEC MISSING_SPEC\n", argv[0]);
    return 2;
  }

  rc = psc_open(&a, argv[2], NULL, err, sizeof err);
  printf("open_missing rc=%d null=%d strerror=%s err=%s\n", rc, a == NULL,
         psc_strerror(rc), flat(err));
  psc_close(a);

  if ((rc = psc_open(&a, argv[1], NULL, err, sizeof err)) ||
      (rc = psc_open(&b, argv[1], NULL, err, sizeof err))) {
    printf("open rc=%d err=%s\n", rc, flat(err));
    return 1;
  }
  printf("open rc=0 shards=%d\n", psc_num_shards(a));

  int64_t shape[1] = {4};
  rc = psc_declare(a, "bad/ndim0", 0, shape, NULL);
  printf("declare_ndim0 rc=%d err=%s\n", rc, flat(psc_error(a)));

  float buf[4];
  float *dst[1] = {buf};
  int never = 0;
  rc = psc_pull(a, &never, dst, 1);
  printf("pull_undeclared rc=%d err=%s\n", rc, flat(psc_error(a)));

  static const int fwd[4] = {0, 1, 2, 3}, rev[4] = {3, 2, 1, 0};
  declare_all(a, "a", fwd);
  declare_all(b, "b", rev);
  never = 99;
  rc = psc_pull(a, &never, dst, 1);
  printf("pull_undeclared99 rc=%d err=%s\n", rc, flat(psc_error(a)));

  /* One variable each: a's push (SGD, lr 1: value -= grad) is what b
   * pulls, whole on its shard or split. */
  int va = psc_find(a, "ord/small"), vb = psc_find(b, "ord/small");
  int wa = psc_find(a, "ord/big"), wb = psc_find(b, "ord/big");
  static float g16[16], g64k[65536], p16[16], p64k[65536];
  for (int i = 0; i < 16; i++)
    g16[i] = (float)i;
  for (int i = 0; i < 65536; i++)
    g64k[i] = (float)(i % 7);
  const float *grads[2] = {g16, g64k};
  float *dsts[2] = {p16, p64k};
  int av[2] = {va, wa}, bv[2] = {vb, wb};
  rc = psc_push(a, av, grads, 2, 1);
  printf("push_a rc=%d err=%s\n", rc, flat(psc_error(a)));
  rc = psc_pull(b, bv, dsts, 2);
  printf("pull_b rc=%d err=%s\n", rc, flat(psc_error(b)));
  int same = 1;
  for (int i = 0; i < 16; i++)
    same &= p16[i] == -g16[i];
  for (int i = 0; i < 65536; i++)
    same &= p64k[i] == -g64k[i];
  printf("pull_b_sees_a same=%d numel_big=%lld\n", same,
         (long long)psc_numel(b, wb));
  psc_close(a);
  psc_close(b);
  return 0;
}
"""


def build_options():
    out = subprocess.run(["meson", "introspect", "--buildoptions", h.BUILD],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return {o["name"]: o["value"] for o in json.loads(out)}


def checked(argv, what, env=None, timeout=60):
    r = h.run(argv, timeout=timeout, env=env)
    if r.returncode != 0:
        raise AssertionError("%s failed (%d): %s\n%s%s"
                             % (what, r.returncode, shlex.join(argv), r.stdout, r.stderr))
    return r.stdout


class Installed:
    """One `meson install --destdir` of the build, shared by the tests, and
    where its files lie."""

    tmp = None

    @classmethod
    def get(cls):
        if cls.tmp is None:
            cls.tmp = tempfile.TemporaryDirectory(prefix="psd-test-clib-")
            dest = cls.tmp.name
            checked(["meson", "install", "-C", h.BUILD, "--no-rebuild", "--quiet",
                     "--destdir", dest], "meson install", timeout=120)
            o = build_options()
            cls.dest = dest
            cls.prefix = o["prefix"]
            cls.libdir = os.path.join(cls.prefix, o["libdir"])
            cls.includedir = os.path.join(cls.prefix, o["includedir"])
            cls.datadir = os.path.join(cls.prefix, o["datadir"])
            cls.mandir = os.path.join(cls.prefix, o["mandir"])
            cls.pcdir = dest + os.path.join(cls.libdir, "pkgconfig")
            cls.env = {"PKG_CONFIG_PATH": cls.pcdir, "PKG_CONFIG_LIBDIR": cls.pcdir + ":"
                       + ":".join(cls.system_pc_dirs()),
                       "PKG_CONFIG_SYSROOT_DIR": dest}
        return cls

    @staticmethod
    def system_pc_dirs():
        """pkg-config's own search path (for grpc, jansson... that psclient
        requires), without any PKG_CONFIG_PATH of the caller's."""
        e = dict(os.environ)
        e.pop("PKG_CONFIG_PATH", None)
        r = subprocess.run(["pkg-config", "--variable", "pc_path", "pkg-config"],
                           capture_output=True, text=True, env=e, timeout=30)
        return [d for d in r.stdout.strip().split(":") if d]

    @classmethod
    def staged(cls, path):
        return cls.dest + path

    @classmethod
    def pkg_config(cls, *args):
        return shlex.split(checked(["pkg-config"] + list(args) + ["psclient"],
                                   "pkg-config", env=cls.env))


def tearDownModule():
    if Installed.tmp is not None:
        Installed.tmp.cleanup()


def need_tools(test, *tools):
    for t in tools:
        if not shutil.which(t):
            test.skipTest("%s is not installed" % t)


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
        self.assertTrue(os.path.isfile(i.staged(os.path.join(i.libdir, "libpsclient.so.1.0.0"))))
        self.assertTrue(os.path.isfile(i.staged(os.path.join(i.libdir, "libpsclient.a"))))
        dyn = checked(["readelf", "-d", lib], "readelf")
        self.assertRegex(dyn, r"\(SONAME\)\s+Library soname: \[libpsclient\.so\.1\]")
        out = checked(["nm", "-D", "--defined-only", lib], "nm -D")
        syms = {}
        for line in out.splitlines():
            parts = line.split()
            syms[parts[-1].split("@")[0]] = parts[-2]
        self.assertEqual(syms.pop("PSCLIENT_1", None), "A", "no version node PSCLIENT_1")
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


class ClientTest(h.ProcTest):
    """Programs built against the installed library, run against 2 shards
    of their own."""

    def setUp(self):
        need_tools(self, "cc", "pkg-config", "readelf", "ldd")
        self.i = Installed.get()
        super().setUp()
        self.spec = os.path.join(self.d, "spec.json")
        h.write_spec(self.spec, nps=2, nworker=1, job=JOB)
        for k in range(2):
            self.procs.append(h.start_psd(self.spec, k))
        self.run_env = {"LD_LIBRARY_PATH": self.i.staged(self.i.libdir)}

    def cc(self, src, out, static=False):
        i = self.i
        cflags = i.pkg_config("--cflags")
        if static:
            lib_a = i.staged(os.path.join(i.libdir, "libpsclient.a"))
            libs = [lib_a if f == "-lpsclient" else f
                    for f in i.pkg_config("--static", "--libs")]
            self.assertIn(lib_a, libs)
        else:
            libs = i.pkg_config("--libs")
        for f in cflags:
            self.assertFalse(f.startswith("-I") and (f[2:].startswith(SRC) or h.BUILD in f),
                             "cflags reach into the tree: %s" % f)
        checked(["cc", "-std=c11", "-Wall", "-Werror", src, "-o", out] + cflags + libs
                + h.sanitizer_cflags(),
                "cc " + os.path.basename(src))
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(\S+)\]",
                            checked(["readelf", "-d", out], "readelf"))
        if static:
            self.assertNotIn("libpsclient.so.1", needed)
        else:
            self.assertIn("libpsclient.so.1", needed)
            # The dynamic loader finds the installed copy (no RUNPATH into
            # the build tree).
            ldd = checked(["ldd", out], "ldd", env=self.run_env)
            m = re.search(r"libpsclient\.so\.1 => (\S+)", ldd)
            self.assertIsNotNone(m, ldd)
            self.assertEqual(m.group(1), self.i.staged(os.path.join(self.i.libdir,
                                                                    "libpsclient.so.1")))
        return out

    def linreg(self, static):
        exe = self.cc(LINREG, os.path.join(self.d, "linreg"), static=static)
        r = h.run([exe, self.spec, "worker:0", "300"], timeout=60,
                  env=None if static else self.run_env)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        m = re.search(r"(?m)^final: (.*)$", r.stdout)
        self.assertIsNotNone(m, out)
        f = dict(kv.split("=", 1) for kv in m.group(1).split())
        self.assertEqual(int(f["steps"]), 300)
        self.assertLess(float(f["loss"]), float(f["first_loss"]) * 1e-3, out)
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

    def test_errors_and_declare_order(self):
        src = os.path.join(self.d, "errors.c")
        with open(src, "w") as f:
            f.write(ERRORS_C)
        exe = self.cc(src, os.path.join(self.d, "errors"))
        missing = os.path.join(self.d, "no-such-spec.json")
        r = h.run([exe, self.spec, missing], timeout=60, env=self.run_env)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        lines = {}
        for line in r.stdout.splitlines():
            name, _, rest = line.partition(" ")
            lines.setdefault(name, []).append(rest)

        def rc(name, k=0):
            return int(re.match(r"(?:\S+ )?rc=(-?\d+)", lines[name][k]).group(1))

        # A missing spec file: a code, no client, and the file named.
        self.assertLess(rc("open_missing"), 0, out)
        self.assertIn("null=1", lines["open_missing"][0])
        self.assertIn(missing, lines["open_missing"][0])
        self.assertEqual(lines["open"][0], "rc=0 shards=2")
        # ndim 0: PSC_EINVAL (-1), naming the variable.
        self.assertEqual(rc("declare_ndim0"), -1, out)
        self.assertIn("'bad/ndim0'", lines["declare_ndim0"][0])
        self.assertIn("0 dimensions", lines["declare_ndim0"][0])
        # A handle never declared: PSC_ENOENT (-4), before and after declares.
        self.assertEqual(rc("pull_undeclared"), -4, out)
        self.assertIn("handle 0", lines["pull_undeclared"][0])
        self.assertEqual(rc("pull_undeclared99"), -4, out)
        self.assertIn("handle 99", lines["pull_undeclared99"][0])
        # Both orders succeed: no ALREADY_EXISTS (6), handles in each one's
        # own declaration order.
        for who, order in (("a", ["ord/small", "ord/mid", "ord/big", "ord/matrix"]),
                           ("b", ["ord/matrix", "ord/big", "ord/mid", "ord/small"])):
            got = lines["declare_" + who]
            self.assertEqual(len(got), 4, out)
            for k, name in enumerate(order):
                self.assertTrue(got[k].startswith("%s rc=%d grpc=0 " % (name, k)),
                                "client %s: %s\n%s" % (who, got[k], out))
        self.assertEqual(rc("push_a"), 0, out)
        self.assertEqual(rc("pull_b"), 0, out)
        self.assertEqual(lines["pull_b_sees_a"][0], "same=1 numel_big=65536", out)
        # Where the shards put them: split at 256 KiB and more (ord/big is
        # exactly 256 KiB), else whole on one shard; each variable once.
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "--json",
                   "vars"], timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        held = {v["name"]: sorted(s["shard"] for s in v["shards"])
                for v in json.loads(r.stdout)["vars"]}
        self.assertEqual(sorted(held), ["ord/big", "ord/matrix", "ord/mid", "ord/small"])
        self.assertEqual(held["ord/big"], [0, 1], held)
        self.assertEqual(held["ord/matrix"], [0, 1], held)
        self.assertEqual(len(held["ord/small"]), 1, held)
        self.assertEqual(len(held["ord/mid"]), 1, held)


if __name__ == "__main__":
    # meson test points LD_LIBRARY_PATH at the build tree's libpsclient:
    # the programs here must find the installed one, or none (static).
    os.environ.pop("LD_LIBRARY_PATH", None)
    h.main()
