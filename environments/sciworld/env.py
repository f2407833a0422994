"""The SciWorld env: ScienceWorld tasks as multi-turn text, one JVM per env, reused across episodes.

Metric (printed in eval reports as defined here):
- `score` (StepResult.score, info["raw_score"]) is the simulator's own progress score: 0..100, or -100 once the
  task has failed (e.g. the agent focused on a wrong object). Failure ends the episode, with success false.
- The normalised score is max(score, 0) / 100, in [0, 1]. Each step's reward is the change in the normalised
  score, so an episode's rewards sum to its final normalised score; a failure brings that sum back to 0 (the
  paper's numbers cannot be negative, so a failure counts as 0, never below).
- success is score == 100.

Action parsing: `strict` takes everything after the last `Action:` (the reference's rule); `lenient` takes the
first line after the last `Action:` (any case), or without one the reply's last non-empty line, stripped of
quotes, backticks and a trailing full stop. Whatever the parser finds goes to the simulator as it is, so an
invalid or ambiguous command gets the simulator's own answer ("No known action matches that input.",
"Ambiguous request: Please enter the number ..."), never an exception.
"""
from __future__ import annotations

import re

from configs.env import SciWorldConfig
from core.env import Observation, StepResult, SyncEnv
from environments.sciworld.simulator import Simulator
from environments.sciworld.tasks import item_to_task

INSTRUCTION = """You are an agent in ScienceWorld, a text-based simulation of a house with rooms, appliances, \
substances, plants and animals. Each turn you receive an observation and answer with one action, in this format:

Thought:
<your reasoning>

Action:
<one command>

Commands: look around; look at OBJ; look in OBJ; read OBJ; open OBJ; close OBJ; activate OBJ; deactivate OBJ; \
go to LOCATION; teleport to LOCATION; pick up OBJ; put down OBJ; move OBJ to OBJ; pour OBJ into OBJ; \
dunk OBJ into OBJ; mix OBJ; use OBJ on OBJ; connect OBJ to OBJ; disconnect OBJ; eat OBJ; flush OBJ; \
focus on OBJ; wait; wait1; inventory; task. When the simulator asks you to resolve an ambiguous command, answer \
with the number of the option you mean. Focusing on the wrong object fails the task."""

_REJECTIONS = ("No known action matches that input.", "Unknown action.")
_ACTION_STRICT = "Action:"
_ACTION_ANY_CASE = re.compile(r"action\s*:", re.IGNORECASE)


def parse_action(text: str, mode: str) -> tuple[str | None, str]:
    """The command in an agent reply and the rule that found it ("strict", "lenient" or "none")."""
    if _ACTION_STRICT in text:
        command = text.rsplit(_ACTION_STRICT, 1)[1].strip()
        if mode == "strict":
            return (command, "strict") if command else (None, "none")
        line = next((ln for ln in command.splitlines() if ln.strip()), "")
        return (_clean(line), "strict") if _clean(line) else (None, "none")
    if mode == "strict":
        return None, "none"
    parts = _ACTION_ANY_CASE.split(text)
    body = parts[-1] if len(parts) > 1 else text
    lines = [ln for ln in body.splitlines() if ln.strip()]
    if not lines:
        return None, "none"
    line = lines[0] if len(parts) > 1 else lines[-1]
    command = _clean(line)
    return (command, "lenient") if command else (None, "none")


def _clean(line: str) -> str:
    line = line.strip().strip("`'\"*").strip()
    if line.startswith(">"):
        line = line[1:].strip()
    return line[:-1].strip() if line.endswith(".") else line


class SciWorldEnv(SyncEnv):
    family = "sciworld"

    def __init__(self, cfg: SciWorldConfig, plan_gold: bool = False):
        self.cfg = cfg
        self.plan_gold = plan_gold  # also have the simulator plan its solution on reset (tests, benches)
        self.sim: Simulator | None = None
        self.jvm_starts = 0
        self._normalised = 0.0
        self._done = True
        self._gold: list[str] = []

    def _simulator(self) -> Simulator:
        if self.sim is None or not self.sim.alive():
            if self.sim is not None:
                self.sim.close()
            self.sim = Simulator(self.cfg.jvm_heap_mb)
            self.jvm_starts += 1
        return self.sim

    def reset(self, item_id: str) -> Observation:
        task, variation = item_to_task(item_id)
        sim = self._simulator()
        sim.load(task.name, variation, self.cfg.simplifications, self.plan_gold)
        self._gold = sim.gold_actions() if self.plan_gold else []
        self._normalised = 0.0
        self._done = False
        text = f"{sim.task_description()}\n{sim.look()}"
        info = {"task": task.name, "task_id": task.task_id, "variation": variation, "jvm_starts": self.jvm_starts}
        return Observation(text=text, instruction=INSTRUCTION, info=info)

    def gold_actions(self) -> list[str]:
        """The simulator's own solution of the current item (needs plan_gold=True)."""
        if not self.plan_gold:
            raise RuntimeError("gold_actions() needs SciWorldEnv(plan_gold=True)")
        return list(self._gold)

    def step(self, text: str) -> StepResult:
        if self._done or self.sim is None:
            raise RuntimeError("SciWorldEnv.step called with no episode running; call reset first")
        command, rule = parse_action(text, self.cfg.parse_mode)
        if command is None:
            hint = ("No action found. End your reply with a line `Action:` followed by one command, "
                    "e.g.\nAction:\nlook around")
            return StepResult(observation=hint, reward=0.0, done=False, valid_action=False, parse_rule="none")
        result = self.sim.step(command)
        failed = result.score < 0
        normalised = max(result.score, 0) / 100.0
        reward = normalised - self._normalised
        self._normalised = normalised
        success = result.score >= 100
        self._done = failed or success or result.completed
        valid = not result.observation.startswith(_REJECTIONS)
        info = {"raw_score": result.score, "moves": result.moves, "failed": failed, "command": command}
        return StepResult(observation=result.observation, reward=reward, done=self._done, valid_action=valid,
                          parse_rule=rule, success=success, score=float(result.score), info=info)

    def close(self) -> None:
        if self.sim is not None:
            self.sim.close()
            self.sim = None

    def kill(self) -> None:
        sim = self.sim
        if sim is not None:
            sim.kill()
