"""The HTTP protocol of AgentGym's env servers, as their clients use it.

    POST /create                       -> {"id": int, ...}           (TextCraft's also takes {"commands", "goal"})
    POST /reset {"id", "data_idx"}     -> {"observation": str, "reward", "done", ...}
    POST /step {"id", "action"}        -> {"observation": str, "reward", "done", "score"?}
    POST /close {"id"}                 -> anything (`true` from AgentGym's; not every server has it)
    GET  /observation?id=<id>          -> the current observation: a JSON string (TextCraft's, ours) or an
                                          object {"observation", "reward", "score", "done", ...} (BabyAI's)

`action` is the action already extracted from the agent's reply: the reference's clients parse replies
themselves and send only the action. The reference servers answer errors with HTTP 200 and {"error": ...}
(and the reference trainer scored those 0); here any non-200 status or an "error" key is an EnvServerError.
Our server adds `instruction` to /reset and `valid_action`, `parse_rule`, `success` to /step; clients of the
reference ignore unknown keys. AgentGym's servers send no `valid_action` (see verdicts.py) and BabyAI's alone
sends `score` (a running sum of its rewards).
"""
from __future__ import annotations

CREATE, RESET, STEP, CLOSE, OBSERVATION = "/create", "/reset", "/step", "/close", "/observation"


class EnvServerError(RuntimeError):
    """An AgentGym env server failed or answered with an error: the env is broken, never a zero reward."""


def require(payload: object, key: str, kind: type | tuple[type, ...], where: str):
    """payload[key], checked to be of `kind`; raises EnvServerError naming the endpoint and field."""
    if not isinstance(payload, dict):
        raise EnvServerError(f"{where}: expected a JSON object, got {type(payload).__name__}: {payload!r:.200}")
    if key not in payload:
        raise EnvServerError(f"{where}: reply has no {key!r}: {payload!r:.200}")
    value = payload[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise EnvServerError(f"{where}: field {key!r} has type {type(value).__name__}: {value!r:.200}")
    return value
