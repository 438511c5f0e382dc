"""What the suites of libpsclient as installed (test_clib.py,
test_clib_calls.py) share: one `meson install --destdir` of the build and
where its files lie, a program's build against it with `cc` and
pkg-config's flags alone, and a test class whose programs run against 2
shards of their own."""

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile

import harness as h

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The shards' optimizer for linreg: plain SGD converges in its 300 steps.
JOB = {"name": "clib", "optimizer": {"type": "sgd", "lr": 0.1}}


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


def cleanup():
    """Removes the install, for each module's tearDownModule."""
    if Installed.tmp is not None:
        Installed.tmp.cleanup()


def need_tools(test, *tools):
    for t in tools:
        if not shutil.which(t):
            test.skipTest("%s is not installed" % t)


class ClientCase(h.ProcTest):
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


def main():
    """Runs a test module (harness.main) as its programs must run."""
    # meson test points LD_LIBRARY_PATH at the build tree's libpsclient:
    # the programs here must find the installed one, or none (static).
    os.environ.pop("LD_LIBRARY_PATH", None)
    h.main()
