/* job.publish: where and how often training shards publish the rows that
 * changed, values only, for the serving tasks of cluster.serve
 * (docs/serving.md). Parsed for cm__parse_job (job.c). */
#include <limits.h>

#include "jcheck.h"
#include "job_tables.h"

void cm__parse_publish(struct cm__errs *e, json_t *job, struct cm_job *out) {
  static const char *const keys[] = {"dir", "interval_s", "full_every", "keep"};
  json_t *pub = cm__opt_object(e, job, "job", "publish",
                               "an object like {\"dir\": \"pub\", "
                               "\"interval_s\": 5}");

  if (!pub)
    return;
  cm__check_keys(e, pub, "job.publish", keys, sizeof keys / sizeof keys[0]);
  if (!json_object_get(pub, "dir"))
    cm__report(e, "job.publish.dir",
               "missing; expected the directory the shards publish into");
  cm__opt_string(e, pub, "job.publish", "dir", out->publish_dir,
                 sizeof out->publish_dir);
  cm__opt_number(e, pub, "job.publish", "interval_s", 0, 0, 1e9,
                 "a number of seconds > 0", &out->publish_interval_s);
  cm__opt_int(e, pub, "job.publish", "full_every", 1, INT_MAX,
              &out->publish_full_every);
  cm__opt_int(e, pub, "job.publish", "keep", 1, INT_MAX, &out->publish_keep);
}
