"""Wall time on paper: sessions laid onto a node's GPUs (simulate), from a measured run (replay) or
before anything is measured (plan_estimate)."""
