"""The confirm stage's defaults (config/config.yaml's ``confirm:`` and ``tptune confirm``'s options)."""
DEFAULTS = {"rounds": 3, "iters": 30, "timed_from": 10, "loss_iters": 10, "micro_batches": 4, "max_layers": 4,
            "timeout_s": 300.0, "seed": 1234}
