"""The figures a report states: one definition each (docs/figures.md), used alike by decisions.json,
the report, ``tptune verify`` and the results READMEs.

  efficiency  overlap efficiency (none - chosen) / (none - bound) from paired rounds, capped, or a fault
  bound       the bound's burn-in round and the bound-fault test
  pooled      one pair measured in several sessions: the pooled ratio, each session a block
  wording     what a ratio's interval says against the margin ("within the margin but significant")
  finalists   settings faster than the pick beyond the noise but within the margin
  host        host-ahead evidence of timed batches, op and block alike
"""
