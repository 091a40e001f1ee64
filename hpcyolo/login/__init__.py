"""The login node's side: site and job files to a plan, the batch script, submission, the checks
that compare a site with the cluster, and following a run. No torch."""
