"""The tptune command and the stages it runs (rederive, verify, calibrate-window)."""
