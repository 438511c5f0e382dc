/* psctl metrics: every counter and histogram of the shards' status
 * documents as metric families (common/metrics/prom.h, which psd's own
 * /metrics endpoint renders too), printed in the Prometheus text
 * exposition format 0.0.4, or as JSON with --json. A shard that did not
 * answer has psd_up 0 and no other sample. */
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "err.h"
#include "prom.h"
#include "psctl.h"

int psctl_cmd_metrics(struct psctl *p) {
  struct cm_prom_shard *sh = NULL;
  json_t *all = NULL, *root;
  char *text = NULL;
  int rc;

  if ((rc = psctl_no_operands(p, "metrics")))
    return rc;
  if (!(sh = calloc(p->spec->nps, sizeof *sh))) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int s = 0; s < p->spec->nps; s++)
    sh[s] = (struct cm_prom_shard){s, p->spec->ps[s].text, p->st[s]};
  if (!(all = cm_prom_families(sh, p->spec->nps))) {
    rc = CM_ENOMEM;
    goto out;
  }
  if (p->json) {
    root = json_pack("{s:O, s:o}", "metrics", all, "down", psctl_down_json(p));
    rc = psctl_print_json(root);
    json_decref(root);
  } else if (!(text = cm_prom_text(all))) {
    rc = CM_ENOMEM;
  } else {
    fputs(text, stdout);
  }
out:
  free(text);
  json_decref(all);
  free(sh);
  return psctl_finish(p, rc);
}
