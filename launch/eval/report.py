"""The evaluation report: figures per family and per level for each policy evaluated, as JSON and Markdown.

Rows (policies), evaluated on the same items: `model` (the model evaluated), `untrained` (the base model it was
trained from) and `random` (a uniform choice among the actions the env lists). Every success rate and score
carries its 95% Wilson interval (core/stats.py); for the score, a mean of values in [0, 1], the interval is
the same formula applied to that mean (an approximation). Metrics, per env family (also defined in
docs/training.md):
- success_rate: the fraction of episodes that solved their task (BabyAI goal reached, TextCraft item crafted,
  SciWorld score 100, Search exact match, WebArena evaluator passed).
- score: the env's own reward summed over the episode, clipped to [0, 1] (BabyAI: 1 - 0.9 * steps/max_steps
  on success; SciWorld: max(final score, 0) / 100; the others: 0 or 1). No format reward is ever added here.
- raw_score: the env's native figure where it has one (SciWorld's final score, -100 to 100), else the score.
- turns: agent turns taken. Terminations: why episodes ended (done, horizon, context_limit, env failures).
Per level, one success and one failure are shown as short transcripts (launch/job/episodes.py); every episode is
in episodes.jsonl beside the report.
With k samples per item, every sample counts as one episode; pass@k is the fraction of items with a success.
"""
from __future__ import annotations

import collections
import json
from pathlib import Path

from core.metrics import valid_action_frac
from core.stats import wilson_interval
from core.trajectory import Trajectory
from environments.registry import get_family

ROWS = ("model", "untrained", "random")


def _label(family: str, item_id: str) -> str:
    hook = get_family(family).extras.get("item_label")
    return hook(item_id) if hook else family


def summarize(family: str, trajs: list[Trajectory], lost: int = 0) -> dict:
    def row(group: list[Trajectory]) -> dict:
        n = len(group)
        success = [t.metrics.get("success", 0.0) for t in group]
        score = [min(1.0, max(0.0, t.metrics.get("env_reward", 0.0))) for t in group]
        raw = [t.metrics.get("score", s) for t, s in zip(group, score)]
        items = collections.defaultdict(list)
        for t, s in zip(group, success):
            items[t.item_id].append(s)
        return {"episodes": n, "success_rate": sum(success) / n,
                "success_rate_ci": list(wilson_interval(sum(success), n)),
                "score": sum(score) / n, "score_ci": list(wilson_interval(sum(score), n)),
                "raw_score": sum(raw) / n, "turns": sum(t.num_turns for t in group) / n,
                "valid_action_frac": valid_action_frac(group),  # over judged turns; None: none judged
                # eval.resample_repeats: the share of turns whose reply was sampled again
                "resampled_turn_frac": sum(t.metrics.get("resampled_turns", 0.0) for t in group)
                / max(1, sum(t.num_turns for t in group)),
                "pass_at_k": sum(max(v) for v in items.values()) / len(items),
                "terminations": dict(collections.Counter(t.termination.value for t in group))}

    by_label = collections.defaultdict(list)
    for t in trajs:
        by_label[_label(family, t.item_id)].append(t)
    return {"family": family, "lost_episodes": lost, **(row(trajs) if trajs else {"episodes": 0}),
            "breakdown": {k: row(v) for k, v in sorted(by_label.items())}}


def _fraction(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _with_ci(r: dict, key: str) -> str:
    low, high = r[f"{key}_ci"]
    return f"{r[key]:.3f} [{low:.2f}, {high:.2f}]"


def _by_family(report: dict) -> dict[str, dict[str, dict]]:
    """family -> row name -> that row's figures for the family (rows in the order of ROWS: JSON sorts keys)."""
    out: dict[str, dict[str, dict]] = {}
    names = [n for n in ROWS if n in report["rows"]] + [n for n in report["rows"] if n not in ROWS]
    for name in names:
        for fam in report["rows"][name]:
            out.setdefault(fam["family"], {})[name] = fam
    return out


def decoding(report: dict) -> str:
    """How the model rows chose their replies: the temperature, and the resampling of repeats if it was on."""
    text = f"temperature {report['temperature']}"
    if report.get("resample_repeats"):
        text += (f"; a reply the model already gave to the same observation sampled again, up to "
                 f"{report['resample_repeats']} times at temperature {report['resample_temperature']} "
                 "(model rows)")
    return text


def summary(report: dict) -> str:
    """A few lines for the terminal: per family, each row's success rate with its interval."""
    lines = [f"evaluation ({report['items']}, {report['samples']} sample(s) per item, {decoding(report)}, "
             f"{report['minutes']:.1f} min):"]
    for family, rows in _by_family(report).items():
        shown = [f"{name} {_with_ci(r, 'success_rate')}" for name, r in rows.items() if r["episodes"]]
        if shown:
            episodes = max(r["episodes"] for r in rows.values())
            lines.append(f"  {family} ({episodes} episodes), success rate: " + "; ".join(shown))
    return "\n".join(lines)


def _example_lines(by_family: dict[str, dict[str, dict]]) -> list[str]:
    """Per family and level, one success and one failure of the model (else of the first row with episodes
    kept), from the `examples` evaluate_rows attached; every episode is in episodes.jsonl beside the report."""
    lines = []
    for family, rows in by_family.items():
        name = next((n for n in rows if rows[n].get("examples")), None)
        if name is None:
            continue
        lines += ["", f"## {family}: one success and one failure per level ({name})", "",
                  "Transcripts cut short here; every episode of every row is in `episodes.jsonl` beside this report."]
        for label, kinds in rows[name]["examples"].items():
            lines += ["", f"### {label}"]
            for kind in ("success", "failure"):
                text = kinds.get(kind)
                lines += ["", f"A {kind}:" if text else f"A {kind}: none among its episodes."]
                if text:
                    lines += ["", "```text", text, "```"]
    return lines


def write_report(report: dict, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "eval_report.json"
    json_path.write_text(json.dumps(report, indent=1, sort_keys=True))
    lines = [f"# Evaluation: {report['model']}", "",
             f"{report['items']}, {report['samples']} sample(s) per item, {decoding(report)}, "
             f"{report['minutes']:.1f} min", "",
             "Rows, on the same items: " + "; ".join(f"`{name}`: {report['policies'][name]}"
                                                     for name in ROWS if name in report["rows"]) + ".", "",
             "| env | policy | episodes | success rate [95% CI] | score [0,1] [95% CI] | raw score | turns | "
             "valid actions | pass@k | lost |", "|---|---|---|---|---|---|---|---|---|---|"]
    by_family = _by_family(report)
    for family, rows in by_family.items():
        for name, fam in rows.items():
            if fam["episodes"]:
                lines.append(f"| {family} | {name} | {fam['episodes']} | {_with_ci(fam, 'success_rate')} | "
                             f"{_with_ci(fam, 'score')} | {fam['raw_score']:.2f} | {fam['turns']:.1f} | "
                             f"{_fraction(fam['valid_action_frac'])} | {fam['pass_at_k']:.3f} | "
                             f"{fam['lost_episodes']} |")
    for family, rows in by_family.items():
        lines += ["", f"## {family}: by level or task", "",
                  "| group | policy | episodes | success rate [95% CI] | score [95% CI] | turns | terminations |",
                  "|---|---|---|---|---|---|---|"]
        labels = list(dict.fromkeys(label for fam in rows.values() for label in fam["breakdown"]))
        for label in labels:
            for name, fam in rows.items():
                r = fam["breakdown"].get(label)
                if r is None:
                    continue
                ends = ", ".join(f"{k} {v}" for k, v in sorted(r["terminations"].items()))
                lines.append(f"| {label} | {name} | {r['episodes']} | {_with_ci(r, 'success_rate')} | "
                             f"{_with_ci(r, 'score')} | {r['turns']:.1f} | {ends} |")
    lines += _example_lines(by_family)
    for note in report.get("notes", []):
        lines.append(f"\nNote: {note}.")
    for family, reason in report.get("skipped", {}).items():
        lines.append(f"\nSkipped {family}: {reason}.")
    lines += ["", "Intervals: 95% Wilson score intervals over episodes. "
              "Metric definitions: see docs/training.md, section Metrics."]
    md_path = out_dir / "eval_report.md"
    md_path.write_text("\n".join(lines) + "\n")
    return json_path, md_path
