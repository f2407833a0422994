"""Config of the environments and the env-pool actors that run them."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from configs.fields import spec

PARSE_MODES = ("strict", "lenient")
FAMILIES = ("babyai", "textcraft", "sciworld", "searchqa", "webarena", "agentgym_http")
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass
class BabyAIConfig:
    parse_mode: str = spec("lenient", choices=PARSE_MODES)
    """`strict`: the reference's ReAct rule (text after a single `Action:` line). `lenient`: the last available
    action named anywhere in the reply, ignoring case and punctuation (what a small model needs)."""
    levels: list[str] = spec([])
    """Restrict training items to these BabyAI level names (e.g. GoToRedBall); empty keeps every level."""
    prompt: str = spec("react", choices=("react", "brief"))
    """`react`: the reference's instructions (every action explained, a Thought/Action reply). `brief`: two
    sentences asking for one available action and nothing else (a third of the tokens per episode; for small
    models on CPU). `brief` needs parse_mode=lenient, since its replies carry no `Action:` line."""
    turn_cue: str = spec("")
    """A line appended to every observation, after the available actions, right before the agent replies
    (empty: none, the reference's observations). The default's, "Name exactly one of the available actions.",
    repeats what the env says after a reply that names none, so the first turn ends as every turn after a
    miss does."""
    generated_train_seeds: int = spec(0, ge=0)
    """Training items beyond the split: this many more seeds of each level in `levels` (every level when it is
    empty), from seed 1000 upward, past the 900-id split space and the seeds `eval.item_set=unseen` takes, added to
    the train split (0: the split alone, the reference's). The split holds about 20 items of each level, which a
    few dozen steps see again and again."""

    def validate(self) -> list[tuple[str, str]]:
        if self.prompt == "brief" and self.parse_mode != "lenient":
            return [("prompt", "prompt=brief asks for a bare action, which only parse_mode=lenient accepts")]
        return []


@dataclass
class TextCraftConfig:
    parse_mode: str = spec("lenient", choices=PARSE_MODES)
    """Action parsing rule, as for BabyAI."""
    distractors: int = spec(10, ge=0)
    """Number of distractor recipes shown beside the goal's recipe tree."""


@dataclass
class SciWorldConfig:
    parse_mode: str = spec("strict", choices=PARSE_MODES)
    """`strict`: everything after the last `Action:`. `lenient`: also accept a bare command."""
    jvm_heap_mb: int = spec(256, ge=64)
    """Java heap per simulator JVM (one JVM per env; the default heap costs 1.1-1.4 GB each)."""
    max_jvms_per_actor: int = spec(8, ge=1)
    """Upper bound on simulator JVMs in one env-pool actor."""
    simplifications: str = spec("easy")
    """ScienceWorld simplification preset passed to load()."""


@dataclass
class SearchConfig:
    retriever: str = spec("bm25", choices=("bm25", "remote"))
    """`bm25`: a local index over `corpus_dir`. `remote`: a Search-R1 `/retrieve` server at `retriever_url`."""
    corpus_dir: str = spec("")
    """Folder with a FlashRAG/Search-R1 JSONL corpus; empty uses the offline Wikipedia corpus."""
    qa_dir: str = spec("")
    """Folder with QA items; empty uses the QA set generated from the offline corpus."""
    retriever_url: str = spec("")
    """URL of a Search-R1 retrieval server (for retriever=remote)."""
    topk: int = spec(3, ge=1)
    """Passages returned per search."""
    end_on_wrong_answer: bool = spec(True)
    """End the episode on a wrong answer (the reference lets the agent keep guessing: set false for that)."""
    parse_mode: str = spec("strict", choices=PARSE_MODES)
    """`strict`: the first closed `<search>`/`<answer>` tag pair (the reference's rule). `lenient`: also any
    letter case, and a last tag left unclosed at the end of the reply."""
    cache_dir: str = spec("")
    """Where the offline corpus, the generated QA set and BM25 indexes are written; empty means
    ~/.cache/agentgym-rl/searchqa."""
    timeout_s: float = spec(30.0, gt=0)
    """HTTP timeout of one request to a remote retrieval server."""
    max_envs_per_actor: int = spec(256, ge=1)
    """Upper bound on Search envs in one env-pool actor (they share the process's one retriever)."""


@dataclass
class WebArenaConfig:
    tasks: str = spec("webarena", choices=("webarena", "local_shop"))
    """Which tasks the splits hold. `webarena`: WebArena's 812 (train 762, test 50), on their self-hosted sites
    (URLs from SHOPPING, GITLAB, ...). `local_shop`: the local shop's tasks (ids 812 and up), which the run
    serves itself on 127.0.0.1 (one machine): both splits are those same tasks, a check of the whole path on
    one machine rather than a benchmark."""
    task_dir: str = spec("")
    """Folder of WebArena task config JSONs; empty uses the 812 configs shipped by `libwebarena`."""
    max_contexts_per_actor: int = spec(4, ge=1)
    """Browser contexts per env-pool actor (one browser per actor, one context per env)."""
    chromium_path: str = spec("/usr/bin/chromium")
    """Chromium executable driven by Playwright."""
    judge_url: str = spec("")
    """OpenAI-compatible endpoint for fuzzy_match evaluation; tasks that need it are skipped when empty."""
    judge_model: str = spec("")
    """Model name sent to the judge endpoint."""
    storage_state_dir: str = spec("")
    """Folder of saved Playwright login states (<site>_state.json)."""
    parse_mode: str = spec("strict", choices=PARSE_MODES)
    """`strict`: the first ```...``` block of the reply (the reference's rule). `lenient`: the last block, or
    without one the last line starting with an action keyword."""
    action_timeout_ms: float = spec(30000.0, gt=0)
    """Timeout of one browser action or page load, and of each page an evaluator opens."""
    settle_ms: float = spec(50.0, ge=0)
    """Pause after each action before checking whether it started a page load (which is then waited for)."""


@dataclass
class HTTPEnvConfig:
    url: str = spec("")
    """Base URL of an AgentGym env server (its /create, /reset, /step, /close protocol)."""
    task: str = spec("")
    """The task that server hosts (its dataset name); its ids `<task>_<n>` run on this family unless a built-in
    family of that name is in `mix` (environments.item_sampler.family_of)."""
    timeout_s: float = spec(60.0, gt=0)
    """HTTP timeout per request."""
    parse_mode: str = spec("strict", choices=PARSE_MODES)
    """How the client extracts the action it sends: `strict` (the reference clients' rules) or `lenient` (also
    the last available action named anywhere, for babyai and textcraft servers)."""


@dataclass
class EnvConfig:
    mix: dict[str, float] = spec({"babyai": 1.0}, nonempty=True)
    """Weighted env mix for training: family name -> sampling weight (weights > 0)."""
    num_actors: int = spec(2, ge=1)
    """Number of EnvPool actors (Ray actors); scale this to scale env throughput."""
    slots_per_actor: int = spec(8, ge=1)
    """Episodes run concurrently inside one EnvPool actor."""
    num_cpus_per_actor: float = spec(0.5, ge=0)
    """Ray CPU resource reserved per EnvPool actor."""
    cpu_cores: list[int] = spec([])
    """Pin every env-pool actor's process to these core ids of its node; empty: no pinning."""
    step_timeout_s: float = spec(60.0, gt=0)
    """An env step slower than this ends the episode with reason env_timeout and replaces the env."""
    reset_timeout_s: float = spec(120.0, gt=0)
    """Timeout for an env reset."""
    max_actor_restarts: int = spec(5, ge=-1)
    """How many times Ray restarts a dead EnvPool actor (-1: forever)."""
    failing_window: int = spec(32, ge=1)
    """Episodes per family the run watches for failures: when more than `failing_frac` of a family's last
    `failing_window` episodes ended `env_error`, `env_timeout` or `aborted` (generation failed), the run stops
    naming the family and the side that fails."""
    failing_frac: float = spec(0.5, gt=0, le=1)
    """The share of failures among a family's last `failing_window` episodes that stops the run."""
    data_dir: str = spec("")
    """Folder holding AgentGym-RL-Data-ID's `train/<env>_train.json` and `eval/<env>_test.json`; empty uses
    splits generated deterministically into the cache."""
    train_split: str = spec("train", choices=("train", "test"))
    """Which split training samples items from."""
    babyai: BabyAIConfig = spec(BabyAIConfig())
    """BabyAI options."""
    textcraft: TextCraftConfig = spec(TextCraftConfig())
    """TextCraft options."""
    sciworld: SciWorldConfig = spec(SciWorldConfig())
    """SciWorld options."""
    searchqa: SearchConfig = spec(SearchConfig())
    """Search (Search-R1 style) options."""
    webarena: WebArenaConfig = spec(WebArenaConfig())
    """WebArena options."""
    agentgym_http: HTTPEnvConfig = spec(HTTPEnvConfig())
    """Options for training against a running AgentGym env server."""
    families: dict[str, str] = spec({})
    """Env families of your own: family name -> the importable module that exports its `FAMILY` (e.g.
    `{guess: environments.examples.guess}`). Each name can then appear in `mix` and `eval.envs`, and its items
    are `<name>_<n>`. Every process of the run imports the module, so it must be importable there."""
    options: dict[str, dict[str, Any]] = spec({})
    """Options of the families in `families`: family name -> a mapping handed as is to its `make_env` and
    hooks (built-in families take their own typed section instead)."""

    def validate(self) -> list[tuple[str, str]]:
        errors = []
        for name, module in self.families.items():
            if name in FAMILIES:
                errors.append((f"families.{name}", "expected a new family name; this one is built in"))
            elif not _MODULE.fullmatch(str(module)):
                errors.append((f"families.{name}", f"expected a dotted module name, got {module!r}"))
        for name in self.options:
            if name not in self.families:
                errors.append((f"options.{name}", "expected a family named in env.families"))
        known = (*FAMILIES, *self.families)
        for name, weight in self.mix.items():
            if name not in known:
                errors.append((f"mix.{name}", f"expected an env family among {', '.join(known)} "
                                              "(or one of your own, named in env.families)"))
            elif not weight > 0:
                errors.append((f"mix.{name}", f"expected a weight > 0, got {weight}"))
        return errors
