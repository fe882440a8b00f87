"""Writers of the files users load: Megatron YAML, TE ub_cfgs, flags, decisions.json."""
