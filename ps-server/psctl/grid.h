/* psctl's text grids, the aligned tables of its output (not embedding
 * tables: those are tables.c's): cells are collected, then printed with
 * every column as wide as its widest cell, two spaces apart, numbers
 * right-aligned. Every command that prints rows uses it, so their columns
 * line up the same way. */
#ifndef PSCTL_GRID_H
#define PSCTL_GRID_H

/* Most columns a grid has. */
#define PSCTL_GRID_COLS 16

/* One grid being filled. Zeroed by psctl_grid_init and again by
 * psctl_grid_print, which frees what it owns. */
struct psctl_grid {
  int ncols;                         /* columns */
  const char *head[PSCTL_GRID_COLS]; /* headings (static strings) */
  char right[PSCTL_GRID_COLS];       /* 1: right-aligned (numbers) */
  char **cells; /* owned: nrows * ncols strings, row-major */
  int nrows;    /* complete rows plus the one being filled */
  int ncells;   /* cells filled */
  int cap;      /* cells allocated */
  int nomem;    /* an allocation failed; printing says so */
};

/* Columns are given as "HEAD" (left-aligned) or ">HEAD" (right-aligned);
 * the headings must outlive the grid. */
void psctl_grid_init(struct psctl_grid *t, int ncols, ...);

/* Appends one cell; rows fill left to right, top to bottom. */
void psctl_grid_cell(struct psctl_grid *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints and frees the grid; returns 0 or CM_ENOMEM. */
int psctl_grid_print(struct psctl_grid *t);

#endif
