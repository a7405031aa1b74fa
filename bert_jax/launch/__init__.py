"""Above the library: what starts processes for the entry points (nothing below imports this package).
  cells          the commands of a sweep or a ladder: pending/done/stale, the local runner, SLURM arrays, a gather
  tables         results tables of several runs (a sweep's, a ladder's) as markdown and CSV
  stderr_filter  XLA's "Very slow compile?" banner on stderr replaced by one line (a filter process)
"""
