"""What a run wrote: run-dir paths, session and run.json readers, atomic writes and lock files."""
