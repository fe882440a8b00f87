"""report.md from the run's files: the answer card, the summary figure, the evidence."""
