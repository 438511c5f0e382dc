/* psctl's text grids, its aligned output tables (grid.h). */
#include "grid.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

void psctl_grid_init(struct psctl_grid *t, int ncols, ...) {
  va_list ap;
  memset(t, 0, sizeof *t);
  t->ncols = ncols < PSCTL_GRID_COLS ? ncols : PSCTL_GRID_COLS;
  va_start(ap, ncols);
  for (int i = 0; i < t->ncols; i++) {
    const char *h = va_arg(ap, const char *);
    t->right[i] = h[0] == '>';
    t->head[i] = h + t->right[i];
  }
  va_end(ap);
}

void psctl_grid_cell(struct psctl_grid *t, const char *fmt, ...) {
  va_list ap;
  char *s = NULL;
  if (t->ncells == t->cap) {
    int cap = t->cap ? t->cap * 2 : 64;
    char **c = realloc(t->cells, cap * sizeof *c);
    if (!c) {
      t->nomem = 1;
      return;
    }
    t->cells = c;
    t->cap = cap;
  }
  va_start(ap, fmt);
  if (vasprintf(&s, fmt, ap) < 0) {
    s = NULL;
    t->nomem = 1;
  }
  va_end(ap);
  t->cells[t->ncells++] = s;
}

int psctl_grid_print(struct psctl_grid *t) {
  int w[PSCTL_GRID_COLS] = {0}, rc = t->nomem ? CM_ENOMEM : 0;
  for (int c = 0; c < t->ncols; c++)
    w[c] = (int)strlen(t->head[c]);
  for (int i = 0; i < t->ncells; i++) {
    int len = t->cells[i] ? (int)strlen(t->cells[i]) : 0;
    if (len > w[i % t->ncols])
      w[i % t->ncols] = len;
  }
  for (int i = -t->ncols; i < t->ncells; i += t->ncols) {
    char line[1024];
    int n = 0, end = 0;
    for (int c = 0; c < t->ncols; c++) {
      const char *s =
          i < 0 ? t->head[c] : (i + c < t->ncells ? t->cells[i + c] : NULL);
      int len, pad;
      if (!s)
        s = "";
      len = (int)strlen(s);
      pad = w[c] - len;
      if (n < (int)sizeof line)
        n += snprintf(line + n, sizeof line - n, "%s%*s%s", c ? "  " : "",
                      t->right[c] ? pad : 0, "", s);
      if (len) /* padding after the last cell is left out */
        end = n < (int)sizeof line ? n : (int)sizeof line - 1;
      if (!t->right[c] && n < (int)sizeof line)
        n += snprintf(line + n, sizeof line - n, "%*s", pad, "");
    }
    printf("%.*s\n", end, line);
  }
  for (int i = 0; i < t->ncells; i++)
    free(t->cells[i]);
  free(t->cells);
  memset(t, 0, sizeof *t);
  return rc;
}
