"""YAML documents a user gives (run configs, model files), read with their aliases bounded.

A YAML alias (``*name``) repeats an anchored value without copying it, so a few lines can stand for
billions of values (an "alias bomb"): loading is cheap, but whatever walks the document as a tree
(json.dumps of the run config, a schema walk, Snakemake's config merge) expands it and runs out of memory.
``alias_expansion`` counts, without expanding, how many values the aliases add; a document that gains more
than ``MAX_ALIAS_VALUES`` from them, or whose alias refers to itself (a walk that never ends), is refused
naming the file (issue 54). A document without aliases, however long, is never refused here.
"""
from __future__ import annotations

import yaml

from tptune.errors import ConfigError

MAX_ALIAS_VALUES = 100_000     # a run config holds a few hundred values; a sane alias adds a few dozen


def alias_expansion(data) -> int | None:
    """Values that shared references (YAML aliases) add to ``data`` walked as a tree: the tree's values less
    the document's own; None where a value contains itself. Linear in the document's own size."""
    if not isinstance(data, (dict, list)):
        return 0
    expanded: dict[int, int] = {}     # id of a list/dict -> its values as a tree, itself included
    own = 0
    open_ids: set[int] = set()        # the containers whose values are being counted: a cycle meets one
    stack = [(data, False)]
    while stack:
        obj, done = stack.pop()
        kids = list(obj.values()) if isinstance(obj, dict) else obj
        if done:
            open_ids.discard(id(obj))
            expanded[id(obj)] = 1 + sum(expanded[id(k)] if isinstance(k, (dict, list)) else 1 for k in kids)
            continue
        if id(obj) in expanded:
            continue
        if id(obj) in open_ids:
            return None
        open_ids.add(id(obj))
        own += 1 + len(kids)
        stack.append((obj, True))
        for k in kids:
            if isinstance(k, (dict, list)):
                if id(k) in open_ids:
                    return None
                if id(k) not in expanded:
                    stack.append((k, False))
    return expanded[id(data)] - own


def alias_problem(data) -> str | None:
    """Why ``data`` cannot be walked (an alias bomb, a value containing itself), None where it can."""
    extra = alias_expansion(data)
    if extra is None:
        return "a YAML alias in it refers to itself (an anchor used inside its own value): walking it never ends"
    if extra > MAX_ALIAS_VALUES:
        return (f"its YAML aliases expand it by {extra:,} values, more than the {MAX_ALIAS_VALUES:,} allowed (an "
                "alias bomb?); write the values out")
    return None


def field_alias_problems(config: dict) -> list[str]:
    """alias_problem for a mapping already loaded (the run config Snakemake hands the Snakefile), each named by
    the deepest field (key path) that holds the whole of its problem."""
    out: list[str] = []

    def walk(value, path: str, above: frozenset) -> None:
        why = alias_problem(value)
        if why is None:
            return
        inner = [(k, v) for k, v in value.items() if id(v) not in above and alias_problem(v)] \
            if isinstance(value, dict) else []
        if inner:
            for k, v in inner:
                walk(v, f"{path}.{k}", above | {id(value)})
        else:
            out.append(f"field '{path}': {why}")

    for key, value in config.items():
        walk(value, str(key), frozenset())
    return out


def load_yaml(text: str, source: str):
    """``text`` parsed as YAML (yaml.safe_load), refused naming ``source`` where it cannot be parsed or its
    aliases expand too far (module doc)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"cannot parse: {str(exc).splitlines()[0]}"]) from None
    except RecursionError:
        raise ConfigError(source, ["cannot parse: nested too deeply"]) from None
    if why := alias_problem(data):
        raise ConfigError(source, [why])
    return data
