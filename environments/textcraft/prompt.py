"""The task instructions shown to the agent for TextCraft."""

INSTRUCTION = """You are crafting items in Minecraft. You are given a few crafting commands of the form \
"craft [target] using [ingredients]" and a goal item. Each turn, answer with your reasoning and then exactly one \
action:
- get <quantity> <item>: take a base ingredient, e.g. "get 1 lapis lazuli".
- craft <quantity> <item> using <quantity> <ingredient>, <quantity> <ingredient>: craft with one of the given \
commands, e.g. "craft 1 blue dye using 1 lapis lazuli".
- inventory: see what you carry.

Always give quantities. Items you can craft cannot be fetched with get: craft them from their ingredients. When a \
command uses a generic ingredient such as "planks", use a specific kind of it in your command, e.g. \
"dark oak planks".

Use exactly this format:
Thought:
<your reasoning>

Action:
<one action>"""
