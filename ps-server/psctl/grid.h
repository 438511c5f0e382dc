/* psctl's aligned tables: cells are collected, then printed with every
 * column as wide as its widest cell, two spaces apart, numbers
 * right-aligned. Every table-printing command uses it, so their columns
 * line up the same way. */
#ifndef PSCTL_TABLE_H
#define PSCTL_TABLE_H

/* Most columns a table has. */
#define PSCTL_TABLE_COLS 16

/* One table being filled. Zeroed by psctl_table_init and again by
 * psctl_table_print, which frees what it owns. */
struct psctl_table {
  int ncols;                          /* columns */
  const char *head[PSCTL_TABLE_COLS]; /* headings (static strings) */
  char right[PSCTL_TABLE_COLS];       /* 1: right-aligned (numbers) */
  char **cells; /* owned: nrows * ncols strings, row-major */
  int nrows;    /* complete rows plus the one being filled */
  int ncells;   /* cells filled */
  int cap;      /* cells allocated */
  int nomem;    /* an allocation failed; printing says so */
};

/* Columns are given as "HEAD" (left-aligned) or ">HEAD" (right-aligned);
 * the headings must outlive the table. */
void psctl_table_init(struct psctl_table *t, int ncols, ...);

/* Appends one cell; rows fill left to right, top to bottom. */
void psctl_table_cell(struct psctl_table *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints and frees the table; returns 0 or CM_ENOMEM. */
int psctl_table_print(struct psctl_table *t);

#endif
