"""The confirm stage's defaults (config/config.yaml's ``confirm:`` and ``tptune confirm``'s options).

Timing starts at iteration 5: the first two iterations carry the one-time set-up (userbuffers, cuBLAS,
allocator) and take seconds, every later one well under a second (the committed confirm/logs); the third on
are steady. A launch's cost is mostly start-up (imports, Megatron's init, those two iterations),
so 20 iterations keep 16 timed for a few seconds more."""
DEFAULTS = {"rounds": 3, "iters": 20, "timed_from": 5, "loss_iters": 10, "micro_batches": 4, "max_layers": 4,
            "timeout_s": 300.0, "seed": 1234}
