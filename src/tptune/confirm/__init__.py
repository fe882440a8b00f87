"""The confirm stage: every answer checked where users train, in Megatron-LM's own training loop (issue 46).

``stage.run_confirm`` launches the emitted set as written, the best NVIDIA preset the run measured under
Megatron's default switches, and no overlap, in alternating rounds of fresh processes (torch.distributed.run
with Megatron-LM 0.19's pretrain_gpt.py, vendored in ``megatron_lm/``), on the model's real shapes cut to a
few layers; reads Megatron's log; and writes ``confirm.json``: the paired iteration-time ratios and the loss
check against no overlap. Modules: ``command`` (the argv and environment), ``settings`` (the three settings
from the run folder), ``layers`` (how many layers, their share of the iteration), ``launch`` (one launch, its
failures), ``megatron_log`` (the log, read), ``compare`` (ratios, the loss rule), ``stage``, ``entry`` (the
``tptune confirm`` arguments; ``python -m tptune.confirm`` runs it without the rest of the CLI's imports).
"""
