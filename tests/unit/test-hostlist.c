/* Unit tests for common/spec/hostlist.c: Slurm's host lists and tasks per
 * node, as recorded from real jobs (zero padding, several ranges, several
 * items, commas inside brackets, Slurm's order kept), and the mistakes in
 * malformed ones. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "hostlist.h"
#include "unit.h"

static char why[256];

/* Asserts that text expands to the hosts in want (space-separated). */
static void expands(const char *text, const char *want) {
  char **hosts = NULL, got[4096] = "";
  int n = -1, rc = cm_hostlist_expand(text, &hosts, &n, why, sizeof why);

  ck_assert_msg(rc == 0, "%s: rc %d: %s", text, rc, why);
  for (int i = 0; i < n; i++) {
    if (i)
      strcat(got, " ");
    strcat(got, hosts[i]);
  }
  ck_assert_str_eq(got, want);
  cm_hostlist_free(hosts, n);
}

/* Asserts that text is refused with a message containing want. */
static void refused(const char *text, const char *want) {
  char **hosts = (char **)1;
  int n = -1, rc = cm_hostlist_expand(text, &hosts, &n, why, sizeof why);

  ck_assert_msg(rc == CM_EINVAL, "%s: rc %d", text, rc);
  ck_assert_ptr_null(hosts);
  ck_assert_int_eq(n, 0);
  ck_assert_msg(strstr(why, want), "%s: \"%s\" lacks \"%s\"", text, why, want);
}

START_TEST(test_expand) {
  expands("node17", "node17");
  expands("node[009-011]", "node009 node010 node011");
  expands("node[01-03,07]", "node01 node02 node03 node07");
  expands("gpu[009-011]", "gpu009 gpu010 gpu011");
  expands("a[1-2],b5", "a1 a2 b5");
  expands("n[8-11]", "n8 n9 n10 n11");
  /* Slurm's order, never sorted: a later item may sort first. */
  expands("zeta[2,1],alpha3", "zeta2 zeta1 alpha3");
  /* Commas inside brackets do not split items; several groups multiply. */
  expands("r[1-2]-n[01,3]", "r1-n01 r1-n3 r2-n01 r2-n3");
  expands("c[1,3]x,d[07-08],e", "c1x c3x d07 d08 e");
  expands("ip-10-0-0-[1-2].ec2", "ip-10-0-0-1.ec2 ip-10-0-0-2.ec2");
}
END_TEST

START_TEST(test_expand_mistakes) {
  refused("", "empty host list");
  refused("node[1-3", "unbalanced '[' at character 5");
  refused("node1-3]", "unbalanced ']' at character 8");
  refused("node[3-1]", "range 3-1 runs backwards");
  refused("node[]", "empty brackets");
  refused("node[a-b]", "expected a number at character 6");
  refused("node[1-]", "expected a number at character 8");
  refused("node[1;2]", "unexpected ';' at character 7");
  refused("a,,b", "empty item at character 3");
  refused("a[1-2],", "empty item at character 8");
  refused("n[1-[2]]", "nested '['");
  refused("n[0-99999999]", "more than 65536 hosts");
  refused("has space", "unexpected character");
}
END_TEST

/* Asserts that text gives the counts in want (space-separated). */
static void counts(const char *text, const char *want) {
  char got[4096] = "", one[16];
  int *v = NULL, n = -1, rc = cm_hostlist_counts(text, &v, &n, why, sizeof why);

  ck_assert_msg(rc == 0, "%s: rc %d: %s", text, rc, why);
  for (int i = 0; i < n; i++) {
    snprintf(one, sizeof one, "%s%d", i ? " " : "", v[i]);
    strcat(got, one);
  }
  ck_assert_str_eq(got, want);
  free(v);
}

static void counts_refused(const char *text, const char *want) {
  int *v = (int *)1, n = -1,
      rc = cm_hostlist_counts(text, &v, &n, why, sizeof why);

  ck_assert_msg(rc == CM_EINVAL, "%s: rc %d", text, rc);
  ck_assert_ptr_null(v);
  ck_assert_msg(strstr(why, want), "%s: \"%s\" lacks \"%s\"", text, why, want);
}

START_TEST(test_counts) {
  counts("4", "4");
  counts("2(x3),1", "2 2 2 1");
  counts("1(x2)", "1 1");
  counts("3,1(x2),2", "3 1 1 2");
  counts_refused("", "empty list");
  counts_refused("2(x3", "expected ')' at character 5");
  counts_refused("2(3)", "expected \"(xN)\" at character 2");
  counts_refused("0", "a count of 0");
  counts_refused("2(x0)", "a repeat of 0");
  counts_refused("2,,1", "expected a number at character 3");
  counts_refused("2;1", "unexpected ';' at character 2");
  counts_refused("1(x70000)", "more than 65536");
}
END_TEST

int main(void) {
  Suite *s = suite_create("hostlist");
  TCase *tc = tcase_create("core");

  tcase_add_test(tc, test_expand);
  tcase_add_test(tc, test_expand_mistakes);
  tcase_add_test(tc, test_counts);
  suite_add_tcase(s, tc);
  return tu_run(s, 0);
}
