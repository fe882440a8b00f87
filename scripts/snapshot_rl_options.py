"""Write the option-name snapshots tptune.packing.emit checks its veRL and slime settings against (neither
framework installs on a CPU cheaply: veRL pulls ray and tensordict, slime sglang and ray):

  src/tptune/data/verl_megatron_config_keys.txt   every key under actor_rollout_ref of veRL's flattened Megatron
                                                  trainer config (verl/trainer/config/_generated_ppo_megatron_trainer.yaml)
  src/tptune/data/slime_args.txt                  slime's own command-line options (slime/utils/arguments.py); slime
                                                  parses them on top of Megatron-LM's (data/megatron_lm_args.txt)

    python scripts/snapshot_rl_options.py VERL_GIT_DIR SLIME_GIT_DIR     # clones (or bare mirrors) of the two
"""
import re
import subprocess
import sys
from pathlib import Path

import yaml

VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
DATA = Path(__file__).resolve().parents[1] / "src" / "tptune" / "data"


def show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def flatten(d, prefix=""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        yield key
        if isinstance(v, dict):
            yield from flatten(v, key + ".")


def main(verl_git: str, slime_git: str) -> None:
    path = "verl/trainer/config/_generated_ppo_megatron_trainer.yaml"
    cfg = yaml.safe_load(show(verl_git, VERL_COMMIT, path))
    keys = sorted(k for k in flatten({"actor_rollout_ref": cfg["actor_rollout_ref"]}))
    (DATA / "verl_megatron_config_keys.txt").write_text(
        f"# veRL's Megatron trainer config keys under actor_rollout_ref, flattened: volcengine/verl@{VERL_COMMIT},\n"
        f"# {path}; written by scripts/snapshot_rl_options.py\n" + "".join(k + "\n" for k in keys))
    src = show(slime_git, SLIME_COMMIT, "slime/utils/arguments.py")
    opts = sorted(set(re.findall(r"""add_argument\(\s*["'](--[a-z0-9][a-z0-9-]*)["']""", src)))
    (DATA / "slime_args.txt").write_text(
        f"# slime's own command-line options (parsed on top of Megatron-LM's): THUDM/slime@{SLIME_COMMIT},\n"
        "# slime/utils/arguments.py; written by scripts/snapshot_rl_options.py\n" + "".join(o + "\n" for o in opts))
    print(f"{len(keys)} veRL keys, {len(opts)} slime options")


if __name__ == "__main__":
    main(*sys.argv[1:3])
