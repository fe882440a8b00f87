"""The report's section on the confirm stage (templates/confirm.md.j2), from confirm.json when it exists: a small
block of its own, placed right after the answer card."""
from __future__ import annotations

import json

import jinja2

from tptune.records.run_dir import RunDir
from tptune.report.sections import insert

HEADLINE_BEFORE = "\n**Load**"      # the answer card's paragraph the one-line headline goes before


def _iv(r: dict) -> str:
    if r.get("lo") is None or r.get("hi") is None or r.get("rounds", 0) < 2:
        return "no interval: one round"
    return f"{r['lo']:.3f}, {r['hi']:.3f}"


def _loss_parts(c: dict) -> tuple[str, str | None]:
    """The loss verdict, short (the answer card's), and what it rests on (the section's parenthesis)."""
    v = (c.get("numerics") or {}).get("set") or {}
    if v.get("ok") is False:
        return "**loss differs from no overlap's**", None
    if v.get("ok") is None:
        if (v.get("loss") or {}).get("difference") is None:
            return "loss not compared", "no round ran the set beside no overlap"
        p = ((c.get("numerics") or {}).get("preset") or {}).get("loss") or {}
        ref = "" if p.get("difference") is None else f"; `{c['settings']['preset']['label']}`'s {p['difference']:.1g}"
        return ("loss not judged: one round has no repeat noise",
                f"lm loss of iterations 1-{v['iterations']} within {v['loss']['difference']:.1g} relative of no "
                f"overlap's{ref}; only a gross difference fails")
    d, n = v["loss"]["difference"], v["loss"]["repeat_noise"]
    return ("loss as without overlap",
            f"lm loss of iterations 1-{v['iterations']} within {d:.1g} relative; repeat noise "
            f"{'unmeasured' if n is None else f'{n:.1g}'}, allowed {v['loss']['allowed']:.1g}")


def _loss(c: dict) -> str:
    verdict, detail = _loss_parts(c)
    return verdict if detail is None else f"{verdict} ({detail})"


def confirm_section(env: jinja2.Environment, run: RunDir) -> str:
    """The section's markdown, or "" for a run without confirm.json."""
    if not run.confirm_json.is_file():
        return ""
    c = json.loads(run.confirm_json.read_text())
    if "not_run" in c:
        return f"## In Megatron-LM's training loop\n\nNot confirmed: {c['not_run']}.\n"
    refs = [{"pair": f"set/{a}", "label": c["settings"][a]["label"], "r": c["ratios"].get(f"set/{a}"),
             "proj": (c.get("projected") or {}).get(f"set/{a}"),
             "res": ((c.get("resolution") or {}).get("pairs") or {}).get(f"set/{a}")}
            for a in ("preset", "nemo") if a in c["settings"]]
    return env.get_template("confirm.md.j2").render(
        c=c, sp=c["ratios"].get("set/preset"), sn=c["ratios"].get("set/none"),
        preset=c["settings"]["preset"]["label"], share=c.get("layers_share"), ops=c.get("ops_share"), loss=_loss(c),
        iv=_iv, refs=refs, arms=[c["settings"][a]["label"] for a in c["settings"]], timing=_timing(c))


def _timing(c: dict) -> str:
    """How a launch's iteration time was taken (confirm.launch), as the records say."""
    ok = [x for x in c.get("launches", []) if x.get("status") == "ok"]
    if ok and all(x.get("gpu_ms") is not None for x in ok):
        return f"the mean of GPU-timed iterations from iteration {c['timed_from']}"
    if ok and all(x.get("log_ms") is not None for x in ok):
        return f"the mean of the training log's iteration times from iteration {c['timed_from']}"
    return f"the median of the training log's iteration times from iteration {c['timed_from']}"


def confirm_headline(run: RunDir) -> str:
    """The answer card's line on the confirm stage (the report's first screen), "" without confirm.json."""
    if not run.confirm_json.is_file():
        return ""
    c = json.loads(run.confirm_json.read_text())
    if "not_run" in c:
        return "**In Megatron-LM's training loop**: not confirmed (see its section below)."
    sp, preset = c["ratios"].get("set/preset"), c["settings"]["preset"]["label"]
    if not sp:
        return (f"**In Megatron-LM's training loop** ({c['layers']} layers): no round ran both the set and "
                f"`{preset}` (see its section below).")
    share, ops = c.get("layers_share"), c.get("ops_share")
    took = f", about {100 * share['share']:.0f}% of the iteration" if share else ""
    took += f", the tuned ops {100 * ops['share']:.0f}%" if ops else ""
    loss = _loss_parts(c)[0]
    nemo = c["ratios"].get("set/nemo")
    more = (f"; {nemo['ratio']:.3f} of `{c['settings']['nemo']['label']}`'s [{_iv(nemo)}]" if nemo else "")
    res = c.get("resolution")
    undecided = "" if not res or res.get("resolved") else (
        f"; **not resolved to ±{100 * res['target_half_width']:.1f}%** in the stage's budget")
    return (f"**In Megatron-LM's training loop** ({c['layers']} layers{took}): {sp['ratio']:.3f} of `{preset}`'s "
            f"iteration time [{_iv(sp)}], {sp['rounds']} round{'s' if sp['rounds'] != 1 else ''} ({sp['words']})"
            f"{more}{undecided}; {loss}.")


def with_confirm_section(text: str, section: str, headline: str = "") -> str:
    """``text`` (report.md) with ``section`` after the answer card (before "How it was measured") and
    ``headline`` in the card, before its list of files to load."""
    return insert(text, section, headline, HEADLINE_BEFORE)
