"""What a run reports: metrics records and writers, the memory report, plots."""
