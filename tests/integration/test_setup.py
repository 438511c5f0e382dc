#!/usr/bin/python3
"""deploy/setup.sh installs what the tests run, so that on a fresh machine
they run rather than skip.

- tools: each program a test runs or looks for (ip and ss for the network
  namespaces of integration-netns and integration-faults, openssl, gcc,
  Slurm's daemons) comes from a package that `setup.sh list` names, or from
  one Debian installs on every system (Essential, or of priority required:
  util-linux's setpriv, mount). Where the package is installed here, it holds a file of the
  program's name, so that the map below cannot name the wrong package.
- list: `setup.sh list` prints the packages one a line and installs
  nothing (exit 0, also when not root).

Usage: test_setup.py BUILD_DIR [unittest args...].
"""
import os
import subprocess
import unittest

import harness as h

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETUP = os.path.join(SRC, "deploy", "setup.sh")

# Program -> the Debian package it comes from, for what the tests run.
TOOLS = {
    "ip": "iproute2",  # netns.py
    "ss": "iproute2",  # test_netns.py
    "openssl": "openssl",  # test_auth.py, test_netns.py
    "gcc": "gcc",  # test_clib.py (cc)
    "slurmctld": "slurmctld",  # test_slurm.py
    "slurmd": "slurmd",
    "munge": "munge",
    "setpriv": "util-linux",  # harness.nobody_argv
    "mount": "mount",  # faults_outage.py: a full and a read-only tmpfs
}


def dpkg(*args):
    return subprocess.run(["dpkg-query"] + list(args), capture_output=True, text=True,
                          timeout=60)


class SetupTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = subprocess.run(["sh", SETUP, "list"], capture_output=True, text=True,
                           timeout=60)
        cls.listed = r

    def test_list_installs_nothing(self):
        r = self.listed
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        pkgs = r.stdout.split("\n")
        self.assertEqual(pkgs[-1], "", "one package a line")
        self.assertNotIn("setup:", r.stdout)
        for p in pkgs[:-1]:
            self.assertRegex(p, r"^[a-z0-9][a-z0-9+.-]+$")

    def test_every_tool_comes_from_a_listed_package(self):
        if subprocess.run(["sh", "-c", "command -v dpkg-query"],
                          capture_output=True).returncode:
            self.skipTest("not a Debian system (no dpkg-query)")
        listed = set(self.listed.stdout.split())
        for tool, pkg in TOOLS.items():
            with self.subTest(tool=tool):
                r = dpkg("-W", "-f=${Essential} ${Priority}", pkg)
                everywhere = r.returncode == 0 and r.stdout.split() in (
                    ["yes", "required"], ["no", "required"])
                self.assertTrue(pkg in listed or everywhere,
                                "%s (package %s) is not in deploy/setup.sh" % (tool, pkg))
                r = dpkg("-L", pkg)
                if r.returncode == 0:
                    names = {os.path.basename(f) for f in r.stdout.split()}
                    self.assertIn(tool, names, "package %s holds no %s" % (pkg, tool))


if __name__ == "__main__":
    h.main()
