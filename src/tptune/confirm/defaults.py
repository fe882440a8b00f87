"""The confirm stage's defaults (config/config.yaml's ``confirm:`` and ``tptune confirm``'s options).

Timing starts at iteration 5: the first two iterations carry the one-time set-up (userbuffers, cuBLAS,
allocator, compiled fusions) and take seconds, every later one well under a second (the committed confirm/logs);
the third on are steady. Rounds: at least ``rounds``, then one more at a time until the headline ratios' half-width
is at most ``target_half_width`` or another round would pass ``budget_s`` (confirm.stopping), at most
``max_rounds``."""
DEFAULTS = {"rounds": 3, "max_rounds": 12, "budget_s": 300.0, "target_half_width": 0.005, "iters": 20,
            "timed_from": 5, "loss_iters": 10, "micro_batches": 4, "max_layers": 4, "timeout_s": 300.0,
            "seed": 1234}
