"""The 40 BabyAI levels of the reference and the closed-form item-id mapping.

`babyai_<n>` is level `LEVELS[n % 40]` with seed `n // 40`: `babyai_0` is GoToRedBallGrey seed 0,
`babyai_39` BossLevelNoUnlock seed 0, `babyai_40` GoToRedBallGrey seed 1. Every level is the minigrid id
`BabyAI-<name>-v0`, except GoToObjS6, whose v0 is retired in minigrid 3.x (v1 is the same task).
"""
from __future__ import annotations

from core.env import split_item_id

FAMILY_NAME = "babyai"

LEVELS = (
    "GoToRedBallGrey", "GoToRedBall", "GoToRedBallNoDists", "GoToObjS6", "GoToLocalS8N7", "GoToObjMazeS7",
    "GoToImpUnlock", "GoToSeqS5R2", "GoToRedBlueBall", "GoToDoor", "GoToObjDoor", "Open", "OpenRedDoor",
    "OpenDoorLoc", "OpenRedBlueDoorsDebug", "OpenDoorsOrderN4Debug", "Pickup", "UnblockPickup", "PickupLoc",
    "PickupDistDebug", "PickupAbove", "PutNextLocalS6N4", "PutNextS7N4Carrying", "Unlock", "UnlockLocalDist",
    "KeyInBox", "UnlockPickupDist", "BlockedUnlockPickup", "UnlockToUnlock", "ActionObjDoor", "FindObjS7",
    "KeyCorridorS6R3", "OneRoomS20", "MoveTwoAcrossS8N9", "SynthS5R2", "SynthLoc", "SynthSeq", "MiniBossLevel",
    "BossLevel", "BossLevelNoUnlock",
)
assert len(LEVELS) == 40

# Levels whose whole task lies in one room (the expert's acceptance set).
SINGLE_ROOM = ("GoToRedBallGrey", "GoToRedBall", "GoToRedBallNoDists", "GoToObjS6", "GoToLocalS8N7",
               "GoToRedBlueBall", "PickupLoc", "PickupDistDebug", "PutNextLocalS6N4")

_VERSION = {"GoToObjS6": "v1"}


def gym_id(level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"unknown BabyAI level {level!r}")
    return f"BabyAI-{level}-{_VERSION.get(level, 'v0')}"


def level_and_seed(item_id: str) -> tuple[str, int]:
    """`babyai_41` -> ("GoToRedBall", 1). Raises ValueError naming a bad id."""
    family, n = split_item_id(item_id)
    if family != FAMILY_NAME:
        raise ValueError(f"item id {item_id!r} is not a BabyAI id (babyai_<n>)")
    return LEVELS[n % len(LEVELS)], n // len(LEVELS)


def level_of(item_id: str) -> str:
    return level_and_seed(item_id)[0]
