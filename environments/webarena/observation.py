"""The accessibility-tree observation, in the reference's format.

Each kept node is one line, indented by tab per depth: `[<id>] <role> '<name>' <prop>: <value> ...`; actions name
elements by id. The reference prints Chromium's own accessibility node ids, which differ between two loads of the
same page in two browser contexts; here an id is the node's position in a depth-first walk of the page's whole
accessibility tree, so the same page gives the same observation in any context, and an element keeps its id while
the page's content stays the same (scrolling does not renumber). As in the reference:
- only nodes at least 60% inside the current 1280x720 viewport are kept (children of a dropped node move up);
- nameless generic/img/list/strong/paragraph/banner/navigation/Section/LabelText/Legend/listitem nodes are folded
  away, ignored nodes and nodes without a name are skipped, the properties focusable, editable, readonly, level,
  settable, multiline and invalid are left out;
- a StaticText line is dropped when its text already appears in one of the three lines before it;
- the tree is preceded by the open tabs: `Tab 0 (current): <title> | Tab 1: <title>`.

Unlike the reference, which asks the page for each node's box with one JavaScript call per node, boxes come from
one `DOMSnapshot.captureSnapshot` call for the whole page (one round trip instead of hundreds).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

IGNORED_PROPERTIES = frozenset({"focusable", "editable", "readonly", "level", "settable", "multiline", "invalid"})
FOLDED_ROLES = frozenset({"generic", "img", "list", "strong", "paragraph", "banner", "navigation", "Section",
                          "LabelText", "Legend", "listitem"})
IN_VIEWPORT_RATIO = 0.6
_STATIC = re.compile(r"\[\d+\] StaticText (.+)", re.DOTALL)


@dataclass(frozen=True)
class TreeNode:
    backend_id: int
    bounds: tuple[float, float, float, float]  # x, y, width, height in viewport pixels
    text: str


def _node_bounds(snapshot: dict) -> tuple[dict[int, tuple[float, float, float, float]], float, float]:
    """backend node id -> union of its layout boxes (document coordinates), and the document's scroll offsets."""
    document = snapshot["documents"][0]
    backend_ids = document["nodes"]["backendNodeId"]
    layout = document["layout"]
    boxes: dict[int, tuple[float, float, float, float]] = {}
    for node_index, (x, y, w, h) in zip(layout["nodeIndex"], layout["bounds"]):
        bid = backend_ids[node_index]
        if bid in boxes:
            x0, y0, w0, h0 = boxes[bid]
            left, top = min(x, x0), min(y, y0)
            right, bottom = max(x + w, x0 + w0), max(y + h, y0 + h0)
            boxes[bid] = (left, top, right - left, bottom - top)
        else:
            boxes[bid] = (x, y, w, h)
    return boxes, float(document.get("scrollOffsetX", 0.0)), float(document.get("scrollOffsetY", 0.0))


def _in_viewport_ratio(x: float, y: float, w: float, h: float, vw: float, vh: float) -> float:
    if w <= 0 or h <= 0:
        return 0.0
    overlap_w = max(0.0, min(x + w, vw) - max(x, 0.0))
    overlap_h = max(0.0, min(y + h, vh) - max(y, 0.0))
    return overlap_w * overlap_h / (w * h)


def build_tree(ax_nodes: list[dict], snapshot: dict, viewport: dict) -> tuple[str, dict[str, TreeNode]]:
    """(tree text, id -> node) from CDP's Accessibility.getFullAXTree and DOMSnapshot.captureSnapshot answers."""
    boxes, scroll_x, scroll_y = _node_bounds(snapshot)
    vw, vh = float(viewport["width"]), float(viewport["height"])
    nodes: dict[str, dict] = {}
    for node in ax_nodes:
        nodes.setdefault(node["nodeId"], node)  # a few nodes are repeated
    if not nodes:
        return "", {}
    root_id = next(iter(nodes))

    def visible(node: dict) -> tuple[float, float, float, float] | None:
        if node.get("role", {}).get("value") == "RootWebArea":
            return (0.0, 0.0, vw, vh)
        bid = node.get("backendDOMNodeId")
        if bid is None or bid not in boxes:
            return None
        x, y, w, h = boxes[bid]
        x, y = x - scroll_x, y - scroll_y
        return (x, y, w, h) if _in_viewport_ratio(x, y, w, h, vw, vh) >= IN_VIEWPORT_RATIO else None

    # Ids: preorder positions over the whole tree (visible or not), so scrolling does not renumber.
    order: dict[str, int] = {}
    walk = [root_id]
    while walk:
        node_id = walk.pop()
        if node_id in order or node_id not in nodes:
            continue
        order[node_id] = len(order) + 1
        walk.extend(reversed(nodes[node_id].get("childIds", [])))

    lines: list[str] = []
    kept: dict[str, TreeNode] = {}
    # Iterative depth-first walk (pages can be deep enough to exhaust Python's recursion limit).
    stack: list[tuple[str, int]] = [(root_id, 0)]
    while stack:
        node_id, depth = stack.pop()
        node = nodes.get(node_id)
        if node is None:
            continue
        line = None
        box = visible(node)
        if box is not None and not node.get("ignored", False):
            line = _node_line(str(order[node_id]), node)
        if line is not None:
            lines.append("\t" * depth + line)
            kept[str(order[node_id])] = TreeNode(int(node["backendDOMNodeId"]), box, line)
        child_depth = depth + 1 if line is not None else depth
        for child in reversed(node.get("childIds", [])):
            stack.append((child, child_depth))
    return clean_static_text(lines), kept


def _node_line(node_id: str, node: dict) -> str | None:
    role = node.get("role", {}).get("value", "")
    name_field = node.get("name")
    if not role or name_field is None or "value" not in name_field:
        return None
    name = str(name_field["value"])
    props = []
    for prop in node.get("properties") or []:
        if prop.get("name") in IGNORED_PROPERTIES or "value" not in prop.get("value", {}):
            continue
        props.append(f"{prop['name']}: {prop['value']['value']}")
    if not name.strip() and ((not props and role in FOLDED_ROLES) or (props and role == "listitem")):
        return None
    return f"[{node_id}] {role} {name!r}" + (" " + " ".join(props) if props else "")


def clean_static_text(lines: list[str]) -> str:
    out: list[str] = []
    for line in lines:
        if "statictext" in line.lower():
            match = _STATIC.search(line)
            text = match.group(1)[1:-1] if match else ""
            if not text or any(text in prev for prev in out[-3:]):
                continue
        out.append(line)
    return "\n".join(out)


def format_observation(tabs: str, tree: str, url: str, objective: str, previous_action: str) -> str:
    """The agent's view of one step (the reference's prompt layout)."""
    return (f"OBSERVATION:\n{tabs}\n\n{tree}\nURL: {url}\nOBJECTIVE: {objective}\n"
            f"PREVIOUS ACTION: {previous_action}")
