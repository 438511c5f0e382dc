/* psc__worker_judge (psclient.h): what the coordinator's Status answer says
 * of one worker, for the programs that wait for a job's workers to finish
 * (pslaunch's watch, psd --exit-when-done). */
#include "psclient.h"

enum psc__worker_state psc__worker_judge(json_t *status, int worker,
                                         int heartbeat_ms) {
  json_t *workers = json_object_get(status, "workers"), *e, *entry = NULL;
  size_t k;
  /* Three missed heartbeats after leaving: its process let go of the job. */
  double quiet = 3.0 * heartbeat_ms + 500;

  json_array_foreach(workers, k, e) {
    if (json_integer_value(json_object_get(e, "worker")) == worker)
      entry = e;
  }
  if (!entry || !json_is_true(json_object_get(entry, "joined")))
    return PSC__W_NOT_JOINED;
  if (json_is_true(json_object_get(entry, "left")))
    return json_number_value(json_object_get(entry, "last_seen_ms")) >= quiet
               ? PSC__W_FINISHED
               : PSC__W_FINISHING;
  if (json_is_true(json_object_get(entry, "live")))
    return PSC__W_TRAINING;
  return PSC__W_DEAD;
}
