"""The confirm stage: every answer checked where users train, in Megatron-LM's own training loop (issues 46, 52).

``stage.run_confirm`` launches the emitted set as written, the best NVIDIA preset the run measured under
Megatron's default switches, ``nemo_tp4`` (the README's headline reference) and no overlap, in alternating rounds
of fresh training processes, on the model's real shapes cut to a few layers. Each launch runs tptune's own training
entry (``trainer``: Megatron-core's TE layer specs, tptune's data, ``megatron.training.pretrain`` of the installed
megatron-core, so the loop is Megatron's own) or a user's Megatron-LM checkout's ``pretrain_gpt.py``
(``--megatron-lm``). Launches run in a launch group (``group`` over ``rank_runner``: imports once, forks each
launch), are kept as they finish (``store``: a cut stage resumes), and rounds are added until the headline ratios
resolve to the target half-width or the budget ends (``stopping``). confirm.json holds the paired ratios, the
projection to the full depth (``layers.projection``), and the loss check against no overlap (``compare``).
"""
