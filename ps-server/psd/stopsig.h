/* psd's stop signals (stopsig.c): SIGTERM, SIGINT and SIGHUP are caught by
 * one handler from the first line of main to the process's exit, so none of
 * them ever kills the shard, whenever it comes and however often.
 *
 * Why not libuv's uv_signal: closing its watchers restores the default
 * action, and a stop signal that comes after that (a launcher killed by
 * SIGKILL makes the kernel send its tasks the parent-death SIGTERM once per
 * launcher thread that exits, milliseconds apart) killed a shard that had
 * already written its final checkpoint, leaving its Unix socket behind and
 * exiting 143 instead of 0. */
#ifndef PSD_STOPSIG_H
#define PSD_STOPSIG_H

/* Makes the pipe the handler writes each signal's number to, and installs
 * the handler for SIGTERM, SIGINT and SIGHUP in every thread. Call once,
 * first in main (before any thread starts). Returns 0 or -errno. */
int psd_stopsig_init(void);

/* The pipe's read end, non-blocking: readable once a signal has come (it is
 * kept open until exit, so that a late handler never writes to a reused
 * descriptor). -1 before psd_stopsig_init. */
int psd_stopsig_fd(void);

/* Reads every signal number waiting in the pipe. Returns the stop signal
 * among them (SIGTERM or SIGINT, the first that came), or 0 when there was
 * none; *hups counts the SIGHUPs read. */
int psd_stopsig_take(int *hups);

#endif
