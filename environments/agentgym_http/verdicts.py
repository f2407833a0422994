"""Whether an AgentGym server accepted an action, read from its reply text, for servers that send no flag.

AgentGym's own servers never say whether an action was accepted: a rejected action comes back as an ordinary
observation with reward 0. For two tasks the reply texts are fixed by the server's code, so the verdict can be
read from them; for any other task, or any text not listed here, the verdict is unknown (None), never a guess.
The texts below are those of AgentGym's agentenv-babyai and agentenv-textcraft servers (their environment.py),
confirmed on recorded replies (tests/data/agentgym_reference_replies.json).

BabyAI (the part of the observation before "\\nAvailable actions:"):
- rejected: "The action is not recognized. Please check valid actions." (not an available action), or an
  infeasible action's explanation "You cannot <go to | pickup | drop | go through | toggle and go through>
  ..., as <reason>." (no path, door closed, no key, nothing carried, something in the way);
- accepted: the new view, which begins "In front of you in this room, you can see several objects: " or
  "You cannot see any objects within sight."; "You can take the following actions: " (check available
  actions); "No change in state." (an available action whose plan is empty; the server gives the same text for
  an empty action, which this client never sends).
TextCraft (the whole observation):
- rejected: "Could not find ...", "Could not find enough items to craft ...", "Could not find a valid recipe
  for ...", "Could not extract recipe from ...", "Could not execute ...", "Wrong item format: ...";
- accepted: "Got <n> <item>", "Crafted <n> <item id>", "Inventory: ...".
"""
from __future__ import annotations

import re

BABYAI_LISTING = "\nAvailable actions:"
BABYAI_REJECTED = re.compile(
    r"The action is not recognized\. Please check valid actions\.$"
    r"|You cannot (?:go to|pickup|drop|go through|toggle and go through) .*, as .+"
)
BABYAI_ACCEPTED = ("In front of you in this room, you can see several objects: ",
                   "You cannot see any objects within sight.",
                   "You can take the following actions: ",
                   "No change in state.")
TEXTCRAFT_REJECTED = ("Could not ", "Wrong item format: ")
TEXTCRAFT_ACCEPTED = ("Got ", "Crafted ", "Inventory: ")


def _babyai(observation: str) -> bool | None:
    text = observation.split(BABYAI_LISTING, 1)[0]
    if BABYAI_REJECTED.match(text):
        return False
    if text.startswith(BABYAI_ACCEPTED):
        return True
    return None


def _textcraft(observation: str) -> bool | None:
    if observation.startswith(TEXTCRAFT_REJECTED):
        return False
    if observation.startswith(TEXTCRAFT_ACCEPTED):
        return True
    return None


READERS = {"babyai": _babyai, "textcraft": _textcraft}


def action_validity(task: str, observation: str) -> bool | None:
    """True (accepted) or False (rejected) when the step reply of a `task` server says so in a known text,
    else None (unknown)."""
    read = READERS.get(task)
    return read(observation) if read is not None else None
