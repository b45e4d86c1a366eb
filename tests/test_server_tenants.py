"""Several API keys are several tenants: suffix decoding's global cache of earlier responses
drafts a key's own earlier answer, never another key's."""

import httpx
import pytest
from test_server_harness import MODEL, serve, tiny_engine

from specwise.server.app import api_keys, tenant_of
from specwise.server.config import ServerConfig

# the tiny model's greedy answer to a prompt that repeats nothing: the per-request index alone
# drafts little, an earlier identical answer in the cache drafts nearly all of it
PROMPT = "Quantum zebras juggle"
MAX_TOKENS = 40


def ask(server, key: str) -> dict:
    response = httpx.post(server.url("/v1/completions"), headers={"Authorization": f"Bearer {key}"}, timeout=120,
                          json={"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
                                "ignore_eos": True})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def server():
    with serve(tiny_engine(speculative="suffix", num_speculative_tokens=8), api_key="alice-key, bob-key") as running:
        yield running


def test_each_key_drafts_only_from_its_own_answers(server):
    first = ask(server, "alice-key")
    cache = server.engine.proposer.cache
    assert set(cache.indexes) == {tenant_of("alice-key")}
    again = ask(server, "alice-key")
    other = ask(server, "bob-key")
    assert first["choices"][0]["text"] == again["choices"][0]["text"] == other["choices"][0]["text"]
    assert set(cache.indexes) == {tenant_of("alice-key"), tenant_of("bob-key")}
    # alice's repeat drafts from her cached answer; bob's identical request cannot see it
    assert again["specwise"]["accepted_tokens"] >= MAX_TOKENS // 2
    assert other["specwise"]["accepted_tokens"] < again["specwise"]["accepted_tokens"]
    assert other["specwise"]["accepted_tokens"] == first["specwise"]["accepted_tokens"]


def test_wrong_key_is_refused(server):
    response = httpx.post(server.url("/v1/completions"), headers={"Authorization": "Bearer carol-key"},
                          json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2})
    assert response.status_code == 401


def test_key_list_parsing(monkeypatch):
    monkeypatch.delenv("SPECWISE_API_KEY", raising=False)
    assert api_keys(ServerConfig(api_key="a, b,c")) == ["a", "b", "c"]
    assert api_keys(ServerConfig()) == []
    monkeypatch.setenv("SPECWISE_API_KEY", "env-key")
    assert api_keys(ServerConfig()) == ["env-key"]
    with pytest.raises(ValueError, match="empty key between commas"):
        ServerConfig(api_key="a,,b")
